"""A Hugging Face `tokenizer.json` as an rl4agents `Tokenizer` (see `rl4agents.text`).

`HFTokenizer(folder)` wraps `tokenizers.Tokenizer.from_file(folder/tokenizer.json)` and reads
the special tokens from the folder's other files. Environments built with it
(`envs.make(name, tokenizer=HFTokenizer(folder))`) encode their text fragments with the real
model's vocabulary, so their observations are what that model reads.

Special tokens, first source that names one wins:

  bos_id  `bos_token` of tokenizer_config.json / special_tokens_map.json; else `bos_token_id`
          of config.json, then generation_config.json; else the eos token (Qwen has no BOS,
          and its config.json names <|endoftext|>).
  eoa_id  (end of action: the token the policy emits to end its turn) `eos_token` of
          tokenizer_config.json / special_tokens_map.json (<|im_end|> for Qwen instruct,
          <|eot_id|> for Llama 3 instruct); else the first `eos_token_id` of
          generation_config.json, then config.json.
  pad_id  `pad_token`; else `pad_token_id` of config.json / generation_config.json; else the
          eoa token. Padding is always masked by `valid_mask`, so sharing an id with eoa is
          harmless.

Each can also be given by name to the constructor. A role no source names raises ValueError
naming the fields looked at.

`encode` never adds special tokens (no BOS from the post-processor): fragments are encoded
piecewise and the rollout puts BOS in front of the prompt itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def _read_json(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


class HFTokenizer:
    """`tokenizers.Tokenizer` from a local folder, satisfying `rl4agents.text.Tokenizer`.

    Args:
      folder: local folder with `tokenizer.json` (and optionally tokenizer_config.json,
        special_tokens_map.json, config.json, generation_config.json, chat_template.jinja).
      bos_token, eoa_token, pad_token: override the special tokens by their text.
      chat_template: override the folder's chat template (a jinja2 string).
      vocab_size: the model's vocabulary (embedding rows); defaults to config.json's
        `vocab_size` if the folder has one, else the tokenizer's own size. Must be at least
        the tokenizer's size (max token id + 1).

    Attributes:
      vocab_size: int, the model-side vocabulary size (see `vocab_size` above).
      tokenizer_size: int, max token id + 1 of the tokenizer itself (with added tokens).
      pad_id, bos_id, eoa_id: int special token ids (see the module docstring).
      chat_template: str or None.
      special_tokens: dict of role -> token text, passed to the chat template.

    Raises:
      FileNotFoundError: no tokenizer.json in `folder`.
      ValueError: the tokenizer does not fit `vocab_size` (naming the field), a special token
        is unknown to the vocabulary, or no source names a special token.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        bos_token: str | None = None,
        eoa_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        vocab_size: int | None = None,
    ):
        import tokenizers

        self.folder = os.fspath(folder)
        path = os.path.join(self.folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{self.folder} has no tokenizer.json")
        self._tok = tokenizers.Tokenizer.from_file(path)
        tok_cfg = _read_json(self.folder, "tokenizer_config.json")
        special_map = _read_json(self.folder, "special_tokens_map.json")
        model_cfg = _read_json(self.folder, "config.json")
        gen_cfg = _read_json(self.folder, "generation_config.json")

        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.tokenizer_size = max(
            self._tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1
        )
        field = "the vocab_size argument"
        if vocab_size is None and "vocab_size" in model_cfg:
            vocab_size, field = (
                int(model_cfg["vocab_size"]),
                f"{self.folder}/config.json vocab_size",
            )
        self.vocab_size = self.tokenizer_size if vocab_size is None else int(vocab_size)
        if self.tokenizer_size > self.vocab_size:
            raise ValueError(
                f"the tokenizer in {path} has {self.tokenizer_size} tokens (max id + 1) but "
                f"{field}={self.vocab_size}; vocab_size must be at least the tokenizer's size"
            )

        def from_text(role: str, explicit: str | None) -> int | None:
            text = explicit or _token_text(tok_cfg.get(role)) or _token_text(special_map.get(role))
            if text is None:
                return None
            token_id = self._tok.token_to_id(text)
            if token_id is None:
                raise ValueError(
                    f"special token {role}={text!r} is not in the vocabulary of {path}"
                )
            return token_id

        def from_ids(field: str) -> int | None:
            for source in (model_cfg, gen_cfg) if field != "eos_token_id" else (gen_cfg, model_cfg):
                value = _first_id(source.get(field))
                if value is not None:
                    return value
            return None

        eoa = from_text("eos_token", eoa_token)
        eoa = from_ids("eos_token_id") if eoa is None else eoa
        if eoa is None:
            raise ValueError(
                f"{self.folder}: no end-of-action token (tokenizer_config.json eos_token, "
                "generation_config.json / config.json eos_token_id); pass eoa_token="
            )
        bos = from_text("bos_token", bos_token)
        bos = from_ids("bos_token_id") if bos is None else bos
        pad = from_text("pad_token", pad_token)
        pad = from_ids("pad_token_id") if pad is None else pad
        self.eoa_id = int(eoa)
        self.bos_id = int(eoa if bos is None else bos)
        self.pad_id = int(eoa if pad is None else pad)
        for role in ("bos_id", "eoa_id", "pad_id"):
            if not 0 <= getattr(self, role) < self.vocab_size:
                raise ValueError(
                    f"{role}={getattr(self, role)} does not fit vocab_size={self.vocab_size}"
                )
        self.special_tokens = {
            "bos_token": self._tok.id_to_token(self.bos_id),
            "eos_token": self._tok.id_to_token(self.eoa_id),
            "pad_token": self._tok.id_to_token(self.pad_id),
        }
        unk = _token_text(tok_cfg.get("unk_token")) or _token_text(special_map.get("unk_token"))
        if unk is not None:
            self.special_tokens["unk_token"] = unk
        self.chat_template = chat_template or _find_chat_template(self.folder, tok_cfg)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (list of int < tokenizer_size), no special tokens added."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (ints); pad ids and ids past the tokenizer (embedding padding) dropped."""
        keep = [int(i) for i in ids if int(i) != self.pad_id and 0 <= int(i) < self.tokenizer_size]
        return self._tok.decode(keep, skip_special_tokens=False)

    def token_id(self, token: str) -> int:
        """The id of one token given by its text (a special token such as "<|im_end|>")."""
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary of {self.folder}")
        return token_id

    def special_token_prefix(self, text: str) -> str | None:
        """The longest special (added) token that `text` starts with, or None."""
        specials = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        found = [t for t in specials if t and text.startswith(t)]
        return max(found, key=len) if found else None

    def apply_chat_template(
        self,
        messages: Sequence[dict],
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs,
    ) -> str | list[int]:
        """Renders `messages` with the folder's chat template, as `transformers` does.

        Args:
          messages: [{"role": ..., "content": ...}, ...].
          add_generation_prompt: end with the header of an assistant turn.
          tokenize: return token ids (list of int; the template's own special tokens are
            parsed, none are added) instead of the text.
          **kwargs: more template variables (tools, documents, enable_thinking, ...).

        Returns:
          The rendered text (str), or its ids (list[int]) if `tokenize`.

        Raises:
          ValueError: the folder has no chat template.
        """
        if self.chat_template is None:
            raise ValueError(
                f"{self.folder} has no chat template (tokenizer_config.json chat_template, "
                "chat_template.jinja or chat_template.json)"
            )
        variables = {**self.special_tokens, "tools": None, "documents": None, **kwargs}
        text = _compile(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
        )
        return self.encode(text) if tokenize else text


def _find_chat_template(folder: str, tok_cfg: dict) -> str | None:
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default", next(iter(named.values()), None))
    if template:
        return template
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path) as f:
            return f.read()
    return _read_json(folder, "chat_template.json").get("chat_template")


def _compile(template: str):
    """A jinja2 template in transformers' sandboxed environment (same filters and globals)."""
    import datetime

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)
