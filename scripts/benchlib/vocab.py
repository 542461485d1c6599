"""Word-level tokenizers that reproduce the peers' `tokenizers.WordLevel` vocabularies.

The peer benchmark scripts build a `tokenizers.WordLevel` model wrapped in
`PreTrainedTokenizerFast`: newlines are replaced by `" <nl> "`, text is split on whitespace,
each word maps to its id (unknown words to `<unk>`), and no special tokens are added. Decoding
joins words with spaces and drops the declared specials (`<pad>`, `<eos>`, `<unk>`). This module
replicates that in plain Python, so the benchmark needs neither `tokenizers` nor `transformers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

PAD, EOS, UNK = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class WordLevelTokenizer:
    """The peers' WordLevel tokenizer, with the ids `rl4agents.text.Tokenizer` asks for.

    Attributes:
      words: the vocabulary, id = position.
      bos_id: token the rollout puts before the prompt.
      eoa_id: end-of-action token (the peers' `<eos>`); -1 disables it (never sampled).
      newline: word that stands for "\\n" in the text, or "" if the vocabulary has none.
    """

    words: tuple[str, ...]
    bos_id: int
    eoa_id: int = EOS
    newline: str = ""
    pad_id: int = PAD
    unk_id: int = UNK
    skip_ids: tuple[int, ...] = (PAD, EOS, UNK)  # dropped by `decode` (skip_special_tokens)

    def __post_init__(self):
        object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.words)})

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        return self._index[word]

    def encode(self, text: str) -> list[int]:
        if self.newline:
            text = text.replace("\n", f" {self.newline} ")
        return [self._index.get(w, self.unk_id) for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        out = " ".join(self.words[int(i)] for i in ids if int(i) not in self.skip_ids)
        if self.newline:
            out = out.replace(f" {self.newline} ", "\n")
        return out


def filler_vocab(size: int) -> tuple[str, ...]:
    """The single-turn bench vocabulary: `<pad>`, `<eos>`, `<unk>`, then `w3` .. `w<size-1>`."""
    return ("<pad>", "<eos>", "<unk>") + tuple(f"w{i}" for i in range(3, size))


def pad_vocab(words: Sequence[str], size: int) -> tuple[str, ...]:
    """`words` (deduplicated, order kept) then fillers `w<i>` up to `size` entries (mt_common)."""
    out = list(dict.fromkeys(words))
    i = len(out)
    while len(out) < size:
        out.append(f"w{i}")
        i += 1
    return tuple(out)
