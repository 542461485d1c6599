"""Tokenizers and the tokenized text fragments environments are built from.

Environments never see strings inside `jit`: at construction they encode every text fragment
they may emit (cell symbols, messages, action words) with the run's tokenizer into a
`FragmentTable`, and compose observations from fragment ids with `concat_fragments`. The same
environment therefore runs with the built-in vocabulary and with a real model's tokenizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np


class Tokenizer(Protocol):
    """What rl4agents needs from a tokenizer."""

    vocab_size: int
    pad_id: int  # padding; never sampled into a context
    bos_id: int  # start of the prompt
    eoa_id: int  # end of action: the policy emits it to finish a turn

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


_SPECIALS = ("<pad>", "<bos>", "<eoa>", "<unk>", "\n")
_WORDS = (
    # actions and their pieces
    "up down left right push pull move go stay wait noop take drop open close use look "
    "search answer ls cd cat grep submit buy click back select guess calc "
    # observation words
    "invalid action you are at the a an is in on of to and or not no yes map goal hole "
    "box boxes target targets wall player floor fell won lost done turn turns left: step steps "
    "observation reward valid actions: allowed: try again "
)
_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "_#.@$*+-=<>[](){}/\\:;,!?'\"|~%&^`"
)


@dataclasses.dataclass(frozen=True)
class BuiltinTokenizer:
    """Small word-level vocabulary with a character fallback; no files, no downloads.

    Whitespace splits words; a word in the vocabulary is one token, any other word is spelled
    with character tokens. `"\\n"` is its own token. Decoding joins word tokens with spaces.
    """

    words: tuple[str, ...] = dataclasses.field(
        default_factory=lambda: tuple(
            dict.fromkeys(_SPECIALS + tuple(_WORDS.split()) + tuple(_CHARS))
        )
    )

    def __post_init__(self):
        object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.words)})

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    pad_id = 0
    bos_id = 1
    eoa_id = 2
    unk_id = 3

    def encode(self, text: str) -> list[int]:
        ids = []
        for li, line in enumerate(text.split("\n")):
            if li:
                ids.append(self._index["\n"])
            for word in line.split():
                if word in self._index:
                    ids.append(self._index[word])
                else:
                    ids.extend(self._index.get(c, self.unk_id) for c in word)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.pad_id:
                continue
            out.append(self.words[i] if 0 <= i < len(self.words) else "<unk>")
        return " ".join(out).replace(" \n ", "\n").replace("\n ", "\n").replace(" \n", "\n")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True, eq=False)
class FragmentTable:
    """Text fragments encoded once: tokens int32[F, L] (PAD-padded) and lengths int32[F]."""

    names: tuple[str, ...]
    tokens: np.ndarray  # int32[F, L]
    lengths: np.ndarray  # int32[F]
    # Set when the tokenizer reads actions leniently (`lenient_actions`, see `match_action`).
    lenient: LenientActions | None = None

    @classmethod
    def build(cls, tokenizer: Tokenizer, fragments: dict[str, str]) -> FragmentTable:
        tokens, lengths = _encode_rows(tokenizer, list(fragments.values()), list(fragments))
        lenient = None
        if getattr(tokenizer, "lenient_actions", False):
            lenient = LenientActions.build(tokenizer, list(fragments.values()))
        return cls(tuple(fragments), tokens, lengths, lenient)

    def id(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"unknown fragment {name!r}; known: {list(self.names)}") from None

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


def concat_fragments(
    table: FragmentTable, ids: jax.Array, pad_id: int, out_len: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """Concatenate fragments by id into one padded token row.

    Args:
      table: the fragment table.
      ids: int32[n] fragment ids; a negative id is skipped (contributes no tokens).
      pad_id: token used for padding.
      out_len: static output length; defaults to n * table.width.

    Returns:
      tokens int32[out_len] (PAD-padded) and length int32[] (clipped to out_len).
    """
    n = ids.shape[0]
    out_len = n * table.width if out_len is None else out_len
    frag_tokens = jnp.asarray(table.tokens)[jnp.maximum(ids, 0)]  # [n, L]
    frag_lens = jnp.where(ids >= 0, jnp.asarray(table.lengths)[jnp.maximum(ids, 0)], 0)
    offsets = jnp.cumsum(frag_lens) - frag_lens  # [n]
    cols = jnp.arange(table.width)
    pos = offsets[:, None] + cols[None, :]
    keep = (cols[None, :] < frag_lens[:, None]) & (pos < out_len)
    pos = jnp.where(keep, pos, out_len)  # out-of-range rows go to a dump slot
    out = (
        jnp.full((out_len + 1,), pad_id, jnp.int32)
        .at[pos.reshape(-1)]
        .set(frag_tokens.reshape(-1).astype(jnp.int32), mode="drop")
    )
    return out[:out_len], jnp.minimum(frag_lens.sum(), out_len).astype(jnp.int32)


def match_action(
    table: FragmentTable, action_tokens: jax.Array, action_len: jax.Array
) -> jax.Array:
    """Index of the fragment the action names, or -1.

    By default the action must equal a fragment's tokens exactly. A table built with a
    tokenizer that reads actions leniently (`lenient_actions = True`, as a chat model's
    `rl4agents.models.chat.ChatTokenizer`) also accepts what a model writes around an action:
    tokens of only whitespace and punctuation at either end are dropped ("**left**", " left.",
    "[left]"), the action may be in lower, UPPER, Capitalized or Title Case with or without a
    leading space, and a preamble may precede it when the action ends the reply ("Action:
    LEFT", "I'll go left."), provided the preamble's last token does not run into the action's
    first word.
    When several fragments end the reply ("search alice" and "alice"), the longest counts.

    Args:
      table: candidate actions as fragments, tokens int32[N, L].
      action_tokens: int32[A] sampled tokens (the end-of-action token excluded).
      action_len: int32[] number of valid tokens in action_tokens.

    Returns:
      int32[] index into table, or -1 when the action matches no candidate.
    """
    if table.lenient is not None:
        return table.lenient.match(action_tokens, action_len)
    width = max(table.width, action_tokens.shape[0])
    cand = np.zeros((table.tokens.shape[0], width), np.int32)
    cand[:, : table.width] = table.tokens
    act = jnp.zeros((width,), jnp.int32).at[: action_tokens.shape[0]].set(action_tokens)
    cols = jnp.arange(width)
    act = jnp.where(cols < action_len, act, 0)
    cand = jnp.where(cols[None, :] < jnp.asarray(table.lengths)[:, None], cand, 0)
    hit = (jnp.asarray(table.lengths) == action_len) & jnp.all(cand == act[None, :], axis=1)
    return jnp.where(hit.any(), jnp.argmax(hit), -1).astype(jnp.int32)


def _encode_rows(tokenizer, texts: list[str], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Texts encoded as PAD-padded rows: tokens int32[F, L] and lengths int32[F]."""
    encoded = [tokenizer.encode(t) for t in texts]
    for name, text_, ids in zip(names, texts, encoded):
        if not ids and text_:
            raise ValueError(f"fragment {name!r} encodes to no tokens")
    width = max(1, max((len(e) for e in encoded), default=0))
    tokens = np.full((len(encoded), width), tokenizer.pad_id, np.int32)
    for i, ids in enumerate(encoded):
        tokens[i, : len(ids)] = ids
    return tokens, np.array([len(e) for e in encoded], np.int32)


_EDGE_CHARS = frozenset(" \t\r\n\"'`*_.,;:!?()[]{}<>")


def token_classes(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per token id, from its text alone: (edge bool[V]: only whitespace and punctuation,
    ends_word bool[V]: ends with a letter or digit). Cached on the tokenizer when it allows."""
    cached = getattr(tokenizer, "_token_classes", None)
    if cached is not None:
        return cached
    edge = np.zeros(tokenizer.vocab_size, bool)
    ends_word = np.zeros(tokenizer.vocab_size, bool)
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.decode([i])
        edge[i] = bool(piece) and all(ch in _EDGE_CHARS for ch in piece)
        ends_word[i] = bool(piece) and piece[-1].isalnum()
    try:
        tokenizer._token_classes = (edge, ends_word)
    except AttributeError:  # frozen tokenizers recompute
        pass
    return edge, ends_word


@dataclasses.dataclass(frozen=True, eq=False)
class LenientActions:
    """Spellings of each action a model may write (see `match_action`), host arrays.

    tokens int32[R, W] / lengths int32[R]: R spellings (case x leading space) of the actions;
    action int32[R] the fragment each spells; spaced bool[R] the spelling starts with a space;
    edge, ends_word bool[V] token classes (`token_classes`).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    action: np.ndarray
    spaced: np.ndarray
    edge: np.ndarray
    ends_word: np.ndarray

    @classmethod
    def build(cls, tokenizer: Tokenizer, texts: list[str]) -> LenientActions:
        rows, action = [], []
        for i, t in enumerate(texts):
            forms = (t, t.lower(), t.upper(), t.capitalize(), t.title())
            spellings = [p + f.strip() for f in forms for p in ("", " ") if f.strip()]
            for spelled in dict.fromkeys(spellings):
                rows.append(spelled)
                action.append(i)
        tokens, lengths = _encode_rows(tokenizer, rows, rows)
        spaced = np.array([r.startswith(" ") for r in rows], bool)
        edge, ends_word = token_classes(tokenizer)
        return cls(tokens, lengths, np.array(action, np.int32), spaced, edge, ends_word)

    def match(self, action_tokens: jax.Array, action_len: jax.Array) -> jax.Array:
        """int32[] the action `action_tokens[:action_len]` names (`match_action`), or -1."""
        a = action_tokens.shape[0]
        cols = jnp.arange(a)
        tok = jnp.clip(action_tokens.astype(jnp.int32), 0, len(self.edge) - 1)
        live = cols < action_len
        core = live & ~jnp.asarray(self.edge)[tok]
        first = jnp.where(core.any(), jnp.argmax(core), 0)
        last = jnp.where(core.any(), a - 1 - jnp.argmax(core[::-1]), -1)
        n = last + 1  # the reply ends at `last`, starts anywhere before
        width = self.tokens.shape[1]
        lengths = jnp.asarray(self.lengths)
        start = n - lengths  # [R] where each spelling would start
        idx = start[:, None] + jnp.arange(width)[None, :]  # [R, W]
        in_row = jnp.arange(width)[None, :] < lengths[:, None]
        got = jnp.where(in_row, tok[jnp.clip(idx, 0, a - 1)], 0)
        want = jnp.where(in_row, jnp.asarray(self.tokens), 0)
        prev = tok[jnp.clip(start - 1, 0, a - 1)]
        boundary = (start == first) | jnp.asarray(self.spaced) | ~jnp.asarray(self.ends_word)[prev]
        hit = (start >= first) & (lengths > 0) & jnp.all(got == want, axis=1) & boundary
        best = jnp.argmax(jnp.where(hit, lengths, -1))
        return jnp.where(hit.any(), jnp.asarray(self.action)[best], -1).astype(jnp.int32)


def hash_u32(x: jax.Array) -> jax.Array:
    """State hash: a 32-bit FNV-1a over the int32 contents of x (any shape).

    Equal contents always give equal hashes; distinct contents can collide: over every 5x5
    Sokoban grid with one player some different rooms share a value, while no two states of
    one room did. Step groups (GiGPO) compare anchors only within one task group.
    """
    words = jnp.ravel(x).astype(jnp.uint32)

    def body(h, w):
        for shift in (0, 8, 16, 24):
            h = (h ^ ((w >> shift) & jnp.uint32(0xFF))) * jnp.uint32(16777619)
        return h, None

    h, _ = jax.lax.scan(body, jnp.uint32(2166136261), words)
    return h


def env_fragment_tables(env) -> list[FragmentTable]:
    """Every FragmentTable an environment encodes text with (its complete text surface), as
    it declares them (`fragment_tables()` of the environment protocol, `envs.base`)."""
    tables = list(env.fragment_tables())
    for table in tables:
        if not isinstance(table, FragmentTable):
            raise TypeError(
                f"{type(env).__name__}.fragment_tables() must return FragmentTables, got "
                f"{type(table).__name__}"
            )
    return tables


def minimal_tokenizer(env) -> BuiltinTokenizer:
    """The built-in vocabulary restricted to the specials and the words `env` can emit.

    A tiny model trained from scratch explores a 20-token vocabulary far faster than the full
    built-in one; a real model keeps its own tokenizer.
    """
    base_tok = env.tokenizer
    if not isinstance(base_tok, BuiltinTokenizer):
        raise ValueError("env.vocab='minimal' needs the built-in tokenizer")
    used = set()
    for table in env_fragment_tables(env):
        used.update(int(t) for t, row_len, col in _cells(table) if col < row_len)
    words = _SPECIALS + tuple(w for i, w in enumerate(base_tok.words) if i in used)
    return BuiltinTokenizer(words=tuple(dict.fromkeys(words)))


def _cells(table: FragmentTable):
    for row, n in zip(table.tokens, table.lengths):
        for col, t in enumerate(row):
            yield t, n, col
