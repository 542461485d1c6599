"""Small Hugging Face tokenizer folders built locally (no downloads), shared by the tests of the
importer, zero-shot evaluation and the real-model bench: a byte-level BPE with ChatML specials
and template, trained on a corpus the test chooses, the skip marker of tests that need the
`hf` extra, and where the SmolLM2 tests keep the converted SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The converted folder's name, inside `smollm2_root` (and in runs/models for get_model.py).
SMOLLM2 = "smollm2-135m-instruct"


def needs(*modules: str) -> pytest.MarkDecorator:
    """A skip marker for tests that import `modules` (the `hf` extra)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {missing} (pip install .[hf])")


def smollm2_root(config: pytest.Config) -> str | None:
    """The folder that holds SmolLM2's GGUF file and its converted folder `SMOLLM2`
    (tests/models/test_smollm2.py makes both): `$RL4AGENTS_SMOLLM2_DIR` if set, else the
    "smollm2" folder of pytest's cache; None without either (the cache plugin is off)."""
    root = os.environ.get("RL4AGENTS_SMOLLM2_DIR")
    if root:
        return root
    cache = getattr(config, "cache", None)
    return None if cache is None else str(cache.mkdir("smollm2"))


def write_chatml_tokenizer(folder, corpus, vocab_size=300, bos_token="<|im_start|>", config=None):
    """Train a byte-level BPE of `vocab_size` tokens on `corpus` (list of str) with the ChatML
    specials <|endoftext|> (id 0, the pad), <|im_start|> (1) and <|im_end|> (2, the eos) and
    write it to `folder` as tokenizer.json and tokenizer_config.json (ChatML template,
    `bos_token`; None for none), plus `config` (a dict) as config.json when given.

    Returns the trained `tokenizers.Tokenizer`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
    return tok


def write_tiny_llama(folder, corpus, seed=0, **config):
    """A random Llama with a ChatML BPE tokenizer (`write_chatml_tokenizer` on `corpus`) saved to
    `folder` as a Hugging Face checkpoint; `config` overrides the `transformers.LlamaConfig`
    fields (default: vocab 320, d=32, d_ff 64, 1 layer, 2 heads, 1 KV head, 2,048 positions,
    untied head).

    Returns (the `tokenizers.Tokenizer`, the `transformers.LlamaForCausalLM`), the model as
    saved, for a test to adjust and save again.
    """
    import torch
    import transformers

    tok = write_chatml_tokenizer(folder, corpus)
    fields = dict(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**fields, **config}))
    model.save_pretrained(str(folder), safe_serialization=True)
    return tok, model
