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

    @classmethod
    def build(cls, tokenizer: Tokenizer, fragments: dict[str, str]) -> FragmentTable:
        encoded = [tokenizer.encode(text) for text in fragments.values()]
        for name, ids in zip(fragments, encoded):
            if not ids and fragments[name]:
                raise ValueError(f"fragment {name!r} encodes to no tokens")
        width = max(1, max(len(e) for e in encoded))
        tokens = np.full((len(encoded), width), tokenizer.pad_id, np.int32)
        for i, ids in enumerate(encoded):
            tokens[i, : len(ids)] = ids
        lengths = np.array([len(e) for e in encoded], np.int32)
        return cls(tuple(fragments), tokens, lengths)

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
    """Index of the fragment that equals the action exactly, or -1.

    Args:
      table: candidate actions as fragments, tokens int32[N, L].
      action_tokens: int32[A] sampled tokens (the end-of-action token excluded).
      action_len: int32[] number of valid tokens in action_tokens.

    Returns:
      int32[] index into table, or -1 when the action matches no candidate.
    """
    width = max(table.width, action_tokens.shape[0])
    cand = np.zeros((table.tokens.shape[0], width), np.int32)
    cand[:, : table.width] = table.tokens
    act = jnp.zeros((width,), jnp.int32).at[: action_tokens.shape[0]].set(action_tokens)
    cols = jnp.arange(width)
    act = jnp.where(cols < action_len, act, 0)
    cand = jnp.where(cols[None, :] < jnp.asarray(table.lengths)[:, None], cand, 0)
    hit = (jnp.asarray(table.lengths) == action_len) & jnp.all(cand == act[None, :], axis=1)
    return jnp.where(hit.any(), jnp.argmax(hit), -1).astype(jnp.int32)


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
