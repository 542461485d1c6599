"""A character-level tokenizer for tests: the exact text a chat model's tokenizer would read."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
    """One token per printable ASCII character or newline; decode inverts encode exactly."""

    chars: str = "".join(chr(i) for i in range(32, 127)) + "\n"
    pad_id = 0
    bos_id = 1
    eoa_id = 2

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 3

    def encode(self, text: str) -> list[int]:
        return [self.chars.index(ch) + 3 for ch in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i) - 3] for i in ids if int(i) >= 3)
