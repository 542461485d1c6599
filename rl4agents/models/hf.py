"""Hugging Face checkpoints: Llama, Qwen2 and Qwen3 safetensors folders in and out.

A checkpoint folder is what `transformers`' `save_pretrained` writes: `config.json` and either
`model.safetensors` or shards listed in `model.safetensors.index.json`. Nothing is fetched
from a hub; `folder` is always a local path.

`load_pretrained` reads each tensor with the `safetensors` numpy API, checks its name and
shape against the architecture, transposes torch's `Linear` weights (`[out, in]`) to Flax
kernels (`[in, out]`), casts to the requested dtype and places it directly with its target
sharding, so a model is never assembled unsharded on one device first. `export_pretrained`
writes the reverse mapping, a folder that `transformers.AutoModelForCausalLM` loads.

Name mapping (torch name -> path in `Policy`'s parameter state):

  model.embed_tokens.weight                   model.embed.embedding          [V, D]
  model.layers.N.input_layernorm.weight       model.layers.N.input_norm.scale
  model.layers.N.self_attn.{q,k,v}_proj.weight  .attn.{q,k,v}_proj.kernel    (transposed)
  model.layers.N.self_attn.{q,k,v}_proj.bias    .attn.{q,k,v}_proj.bias      (Qwen2)
  model.layers.N.self_attn.{q,k}_norm.weight    .attn.{q,k}_norm.scale       (Qwen3)
  model.layers.N.self_attn.o_proj.weight        .attn.o_proj.kernel          (transposed)
  model.layers.N.post_attention_layernorm.weight  .post_attn_norm.scale
  model.layers.N.mlp.{gate,up,down}_proj.weight   .mlp.{gate,up,down}_proj.kernel (transposed)
  model.norm.weight                           model.final_norm.scale
  lm_head.weight                              lm_head.kernel (transposed; absent when tied)

With LoRA on (`lora_rank` > 0, `rl4agents.models.lora`), loading fills the adapters fresh (A
random, B zero: the loaded model computes exactly the checkpoint's function) and exporting
folds them into the kernels, so the written folder is a plain checkpoint of the adapted model.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl4agents import sharding as sharding_lib
from rl4agents.models import lora as lora_lib
from rl4agents.models import policy as policy_lib

# model_type -> the `architectures` entry transformers writes for a causal LM.
SUPPORTED = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# ModelConfig fields that do not change the checkpoint's tensors; callers may set them.
RUNTIME_FIELDS = (
    "value_head",
    "dtype",
    "param_dtype",
    "remat",
    "scan_layers",
    "attn_chunk",
    "logit_chunk",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
)
# Buffers some older checkpoints carry; recomputed from the config, so skipped.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


class TensorSpec(NamedTuple):
    """Where one checkpoint tensor goes in the policy's parameter state."""

    path: tuple[str | int, ...]  # keys into `nnx.to_pure_dict(nnx.state(policy))`
    shape: tuple[int, ...]  # shape in the checkpoint (torch layout)
    transpose: bool  # torch Linear weight [out, in] <-> Flax kernel [in, out]


def _canonical_dtype(dtype: Any) -> str:
    name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}; allowed: 'float32', 'bfloat16'")
    return name


def _field(hf: dict, name: str, default: Any = None) -> Any:
    value = hf.get(name, default)
    return default if value is None else value


def _rope_settings(hf: dict) -> tuple[float, tuple[float, float, float, float] | None]:
    """(rope_theta, llama3 scaling or None) from either config style.

    transformers >= 5 writes `rope_parameters = {rope_type, rope_theta, ...}`; older versions
    write top-level `rope_theta` and an optional `rope_scaling = {rope_type|type, ...}`.
    """
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    field = "rope_parameters" if params else "rope_scaling"
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(
            f"config.json {field}.rope_type={rope_type!r} is not supported; "
            "supported: 'default', 'llama3'"
        )
    try:
        scale = (
            float(merged["factor"]),
            float(merged["low_freq_factor"]),
            float(merged["high_freq_factor"]),
            float(merged["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ValueError(f"config.json {field} (rope_type 'llama3') lacks {e.args[0]!r}") from None
    return theta, scale


def _check_supported(hf: dict) -> str:
    model_type = hf.get("model_type")
    supported = (
        f"supported model_type: {sorted(SUPPORTED)}, architectures: {list(SUPPORTED.values())}"
    )
    if model_type not in SUPPORTED:
        raise ValueError(f"config.json model_type={model_type!r} is not supported; {supported}")
    archs = hf.get("architectures") or [SUPPORTED[model_type]]
    bad = [a for a in archs if a != SUPPORTED[model_type]]
    if bad:
        raise ValueError(
            f"config.json architectures={archs} is not supported for model_type={model_type!r} "
            f"(expected [{SUPPORTED[model_type]!r}]); {supported}"
        )
    return model_type


def _check_unsupported_features(hf: dict, model_type: str) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r} is not supported; supported: 'silu'")
    if model_type in ("llama", "qwen3") and hf.get("attention_bias"):
        raise ValueError(
            "config.json attention_bias=true is not supported (o_proj has no bias here); "
            "supported: false"
        )
    if hf.get("mlp_bias"):
        raise ValueError("config.json mlp_bias=true is not supported; supported: false")
    if hf.get("use_sliding_window") and hf.get("sliding_window") is not None:
        # transformers slides layers i >= max_window_layers unless layer_types says otherwise.
        num_layers = int(hf.get("num_hidden_layers", 0))
        first = int(_field(hf, "max_window_layers", num_layers))
        types = hf.get("layer_types") or ["sliding_attention"] * (num_layers - first)
        if "sliding_attention" in types:
            raise ValueError(
                "config.json use_sliding_window=true (sliding-window layers) is not supported; "
                "supported: false"
            )
    factor = hf.get("partial_rotary_factor")
    if factor not in (None, 1, 1.0):
        raise ValueError(f"config.json partial_rotary_factor={factor} is not supported; use 1.0")


def config_from_hf(
    hf_config: dict, *, dtype: Any = "float32", **overrides
) -> policy_lib.ModelConfig:
    """The `ModelConfig` of a Llama, Qwen2 or Qwen3 `config.json`.

    Args:
      hf_config: the parsed `config.json`.
      dtype: "float32" or "bfloat16" (or the jnp dtype); both the parameter dtype and the
        compute dtype, unless `overrides` set `dtype`/`param_dtype` separately.
      **overrides: runtime fields of `ModelConfig` (`RUNTIME_FIELDS`: value_head, dtype,
        param_dtype, remat, scan_layers, attn_chunk, logit_chunk, lora_rank, lora_alpha,
        lora_targets);
        architecture fields come from the checkpoint only.

    Returns:
      The ModelConfig (qkv_bias for Qwen2, qk_norm for Qwen3; rope_theta, rope_scaling,
      norm_eps, tie_embeddings and head_dim from the file).

    Raises:
      ValueError: unsupported model_type/architectures (naming the value and the supported
        ones), an unsupported feature (naming its config field), or an override of an
        architecture field.
    """
    model_type = _check_supported(hf_config)
    _check_unsupported_features(hf_config, model_type)
    bad = sorted(set(overrides) - set(RUNTIME_FIELDS))
    if bad:
        raise ValueError(f"cannot override {bad} of a pretrained model; allowed: {RUNTIME_FIELDS}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
        if name not in hf_config:
            raise ValueError(f"config.json lacks the field {name!r}")
    num_heads = int(_field(hf_config, "num_attention_heads", 0))
    if num_heads <= 0:
        raise ValueError("config.json lacks the field 'num_attention_heads'")
    d_model = int(hf_config["hidden_size"])
    theta, scaling = _rope_settings(hf_config)
    name = _canonical_dtype(dtype)
    return policy_lib.ModelConfig(
        vocab_size=int(hf_config["vocab_size"]),
        d_model=d_model,
        num_layers=int(hf_config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(_field(hf_config, "num_key_value_heads", num_heads)),
        head_dim=int(_field(hf_config, "head_dim", d_model // num_heads)),
        d_ff=int(hf_config["intermediate_size"]),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(_field(hf_config, "rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        tie_embeddings=bool(_field(hf_config, "tie_word_embeddings", False)),
        **{"dtype": name, "param_dtype": name, **overrides},
    )


def model_type_for(cfg: policy_lib.ModelConfig) -> str:
    """The HF model_type a config exports as: qwen2 (q/k/v bias), qwen3 (q/k norm) or llama.

    Raises:
      ValueError: the config has both q/k/v biases and q/k norms (no such HF architecture).
    """
    if cfg.qkv_bias and cfg.qk_norm:
        raise ValueError(
            "model.qkv_bias=True with model.qk_norm=True matches no supported HF architecture "
            f"({sorted(SUPPORTED)})"
        )
    return "qwen2" if cfg.qkv_bias else "qwen3" if cfg.qk_norm else "llama"


def config_to_hf(
    cfg: policy_lib.ModelConfig, model_type: str | None = None, extra: dict | None = None
) -> dict:
    """A `config.json` dict for `cfg` that `transformers` reads (rope in the pre-5.0 style).

    Args:
      cfg: the model config.
      model_type: "llama", "qwen2" or "qwen3"; defaults to `model_type_for(cfg)`.
      extra: fields copied over the result (token ids, max_position_embeddings).

    Returns:
      The config dict.
    """
    inferred = model_type_for(cfg)
    model_type = model_type or inferred
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type={model_type!r}; supported: {sorted(SUPPORTED)}")
    if model_type != inferred:
        raise ValueError(
            f"model_type={model_type!r} does not fit model.qkv_bias={cfg.qkv_bias}, "
            f"model.qk_norm={cfg.qk_norm} (that is {inferred!r})"
        )
    out = {
        "architectures": [SUPPORTED[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": 32768,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling is not None:
        factor, low, high, old_len = cfg.rope_scaling
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": int(old_len),
        }
    if model_type in ("llama", "qwen3"):
        out["attention_bias"] = False
    if model_type == "llama":
        out["mlp_bias"] = False
    else:
        out["use_sliding_window"] = False
    out.update(extra or {})
    return out


def tensor_specs(cfg: policy_lib.ModelConfig) -> dict[str, TensorSpec]:
    """Every checkpoint tensor of `cfg`'s architecture: torch name -> `TensorSpec`."""
    d, hd, f, v = cfg.d_model, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    specs = {
        "model.embed_tokens.weight": TensorSpec(("model", "embed", "embedding"), (v, d), False)
    }
    for i in range(cfg.num_layers):
        pre, at = f"model.layers.{i}.", ("model", "layers", i)
        linears = {
            "self_attn.q_proj": (("attn", "q_proj"), (q, d)),
            "self_attn.k_proj": (("attn", "k_proj"), (kv, d)),
            "self_attn.v_proj": (("attn", "v_proj"), (kv, d)),
            "self_attn.o_proj": (("attn", "o_proj"), (d, q)),
            "mlp.gate_proj": (("mlp", "gate_proj"), (f, d)),
            "mlp.up_proj": (("mlp", "up_proj"), (f, d)),
            "mlp.down_proj": (("mlp", "down_proj"), (d, f)),
        }
        for name, (sub, shape) in linears.items():
            specs[f"{pre}{name}.weight"] = TensorSpec(at + sub + ("kernel",), shape, True)
            if cfg.qkv_bias and name in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
            ):
                specs[f"{pre}{name}.bias"] = TensorSpec(at + sub + ("bias",), shape[:1], False)
        if cfg.qk_norm:
            for n in ("q_norm", "k_norm"):
                specs[f"{pre}self_attn.{n}.weight"] = TensorSpec(
                    at + ("attn", n, "scale"), (hd,), False
                )
        specs[f"{pre}input_layernorm.weight"] = TensorSpec(
            at + ("input_norm", "scale"), (d,), False
        )
        specs[f"{pre}post_attention_layernorm.weight"] = TensorSpec(
            at + ("post_attn_norm", "scale"), (d,), False
        )
    specs["model.norm.weight"] = TensorSpec(("model", "final_norm", "scale"), (d,), False)
    if not cfg.tie_embeddings:
        specs["lm_head.weight"] = TensorSpec(("lm_head", "kernel"), (v, d), True)
    return specs


def read_config(folder: str | os.PathLike) -> dict:
    """The parsed `config.json` of a checkpoint folder."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no config.json (not a Hugging Face checkpoint)")
    with open(path) as f:
        return json.load(f)


def tensor_files(folder: str | os.PathLike) -> dict[str, str]:
    """Checkpoint tensor name -> the safetensors file holding it (index file or all shards)."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(folder, file) for name, file in weight_map.items()}
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors file")
    out = {}
    for file in files:
        with safe_open(os.path.join(folder, file), framework="numpy") as f:
            out.update({name: os.path.join(folder, file) for name in f.keys()})
    return out


def _check_token_ids(hf: dict, vocab_size: int) -> None:
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = hf.get(field)
        ids = value if isinstance(value, list) else [] if value is None else [value]
        if any(not 0 <= int(i) < vocab_size for i in ids):
            raise ValueError(
                f"config.json {field}={value} does not fit the config's vocab_size={vocab_size}"
            )


ShardingFn = Callable[[str, tuple[int, ...]], jax.sharding.Sharding | None]


def _placement(mesh, shardings: ShardingFn | None) -> ShardingFn:
    if shardings is not None:
        return shardings
    if mesh is not None:  # the logical-axis rules of rl4agents.sharding, as in training

        def place(path: str, shape: tuple[int, ...]) -> jax.sharding.Sharding:
            slashed = path.replace(".", "/")
            axes = sharding_lib.logical_axes(slashed) or lora_lib.logical_axes(slashed)
            if axes is None:
                raise ValueError(f"no sharding rule for parameter {path!r}")
            return jax.sharding.NamedSharding(mesh, sharding_lib.logical_spec(axes, shape, mesh))

        return place
    return lambda path, shape: None  # the default device, uncommitted (as jnp arrays are)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _get(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_pretrained(
    folder: str | os.PathLike,
    dtype: Any = "float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    shardings: ShardingFn | None = None,
    check_tokenizer: bool = True,
    lora_seed: int = 0,
    **overrides,
) -> tuple[policy_lib.Policy, policy_lib.ModelConfig]:
    """Loads a local Llama / Qwen2 / Qwen3 safetensors checkpoint into a `Policy`.

    Args:
      folder: local checkpoint folder (`config.json` + `model.safetensors` or sharded files
        with `model.safetensors.index.json`).
      dtype: "float32" or "bfloat16": parameter and compute dtype (checkpoint tensors of any
        float dtype are cast).
      mesh: if given, every parameter is placed straight into its `NamedSharding` on it under
        the logical-axis rules of `rl4agents.sharding` (as training shards it), one tensor at
        a time, unless `shardings` says otherwise.
      shardings: optional `(param_path, shape) -> Sharding`, param_path like
        "model.layers.0.attn.q_proj.kernel" and shape in our layout; overrides the default.
      check_tokenizer: if the folder has `tokenizer.json`, check that its vocabulary and
        special tokens fit `vocab_size` (needs the `tokenizers` package).
      lora_seed: seed of the LoRA adapters' A matrices (with `lora_rank` > 0).
      **overrides: runtime `ModelConfig` fields (`RUNTIME_FIELDS`). A `shared` value head
        starts at zero; a `separate` critic starts as a copy of the pretrained trunk. With
        `lora_rank` > 0 every adapter starts with A uniform in +-1/sqrt(in) and B = 0 (the
        adapters are float32 whatever `dtype` is), so the model equals the checkpoint's.

    Returns:
      (policy, cfg): the `Policy` with parameters in `dtype`, kernels in Flax layout
      (`[in, out]`), embedding `[V, D]`; and its `ModelConfig`.

    Raises:
      ValueError: unsupported architecture, a missing tensor (named), a tensor of the wrong
        shape (named, expected vs got), an unexpected tensor, or token ids / a tokenizer that
        do not fit `vocab_size` (the field named).
    """
    from safetensors import safe_open

    folder = os.fspath(folder)
    hf = read_config(folder)
    cfg = config_from_hf(hf, dtype=dtype, **overrides)
    _check_token_ids(hf, cfg.vocab_size)
    if check_tokenizer and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from rl4agents.models import hf_tokenizer

        hf_tokenizer.HFTokenizer(folder)  # raises unless it fits config.json's vocab_size
    specs = tensor_specs(cfg)
    files = tensor_files(folder)
    missing = [name for name in specs if name not in files]
    if missing:
        raise ValueError(
            f"{folder}: missing tensor {missing[0]!r}"
            + (f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else "")
        )
    tied_head = cfg.tie_embeddings and "lm_head.weight" in files  # transformers ignores it too
    unexpected = [
        n
        for n in files
        if n not in specs
        and not n.endswith(_IGNORED_SUFFIXES)
        and not (tied_head and n == "lm_head.weight")
    ]
    if unexpected:
        raise ValueError(
            f"{folder}: unexpected tensor {unexpected[0]!r} for model_type="
            f"{hf['model_type']!r} ({len(unexpected)} unexpected in all)"
        )

    abstract = nnx.eval_shape(lambda: policy_lib.Policy(cfg, nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    pure = nnx.to_pure_dict(abstract_state)
    place = _placement(mesh, shardings)
    np_dtype = jnp.dtype(cfg.param_dtype)
    handles: dict[str, Any] = {}  # open (memory-mapped) safetensors files
    host: dict[tuple, np.ndarray] = {}  # trunk arrays kept for a separate critic only
    for name, spec in specs.items():
        file = files[name]
        if file not in handles:
            handles[file] = safe_open(file, framework="numpy")
        shape = tuple(handles[file].get_slice(name).get_shape())
        if shape != spec.shape:
            raise ValueError(
                f"{folder}: tensor {name!r} has shape {shape}; expected {spec.shape} "
                f"for model_type={hf['model_type']!r} with this config.json"
            )
        array = handles[file].get_tensor(name).astype(np_dtype, copy=False)
        if spec.transpose:
            array = array.T
        _set(pure, spec.path, jax.device_put(array, place(_dotted(spec.path), array.shape)))
        if cfg.value_head == "separate" and spec.path[0] == "model":
            host[spec.path] = array
    if cfg.value_head != "none":
        for key in ("kernel", "bias"):
            shape = _get(pure, ("value_proj", key)).shape
            zeros = np.zeros(shape, np_dtype)
            _set(
                pure, ("value_proj", key), jax.device_put(zeros, place(f"value_proj.{key}", shape))
            )
    for path, array in host.items():  # separate critic: its own copy of the trunk
        critic_path = ("critic",) + path[1:]
        _set(pure, critic_path, jax.device_put(array, place(_dotted(critic_path), array.shape)))
    if cfg.lora_rank:
        _init_adapters(pure, cfg, lora_seed, place)
    for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
        if isinstance(leaf, jax.ShapeDtypeStruct):  # every parameter must have been filled
            raise AssertionError(f"parameter {jax.tree_util.keystr(path)} was not loaded")
    nnx.replace_by_pure_dict(abstract_state, pure)
    return nnx.merge(graphdef, abstract_state), cfg


def _init_adapters(pure: dict, cfg: policy_lib.ModelConfig, seed: int, place: ShardingFn) -> None:
    """Fills every LoRA leaf of `pure` in place: A from `lora.init_a`, B zeros."""
    leaves = jax.tree_util.tree_flatten_with_path(pure)[0]
    paths = [tuple(_key(k) for k in path) for path, _ in leaves]
    adapters = [p for p in paths if p[-1] in lora_lib.PARAM_NAMES]
    keys = jax.random.split(jax.random.key(seed), max(len(adapters), 1))
    for key, path in zip(keys, adapters):
        shape = tuple(_get(pure, path).shape)
        if path[-1] == "lora_a":
            array = lora_lib.init_a(key, shape[0], cfg.lora_rank)
        else:
            array = np.zeros(shape, np.float32)
        _set(pure, path, jax.device_put(array, place(_dotted(path), shape)))


def _key(entry: Any) -> str | int:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    raise TypeError(f"unexpected pytree key {entry!r}")


def _pure_params(model_or_state: Any) -> dict:
    if isinstance(model_or_state, nnx.Module):
        return nnx.to_pure_dict(nnx.state(model_or_state, nnx.Param))
    if isinstance(model_or_state, nnx.State):
        return nnx.to_pure_dict(model_or_state)
    if isinstance(model_or_state, dict):
        return model_or_state
    raise TypeError(f"expected a Policy, an nnx.State or a pure dict; got {type(model_or_state)}")


def export_pretrained(
    model_or_state: Any,
    cfg: policy_lib.ModelConfig,
    folder: str | os.PathLike,
    tokenizer_folder: str | os.PathLike | None = None,
    *,
    model_type: str | None = None,
) -> str:
    """Writes a policy as a Hugging Face folder (`config.json` + `model.safetensors`).

    The value head and a separate critic are not exported (they have no HF counterpart).
    Parameters keep their dtype (f32 or bf16); `config.json` records it as `torch_dtype`.
    With LoRA on (`cfg.lora_rank` > 0) each adapted kernel is written merged,
    W + (lora_alpha / lora_rank) A B (`lora.merged_params`, in float32, then cast to W's
    dtype), and the config is the base architecture's: transformers loads it as a plain model.

    Args:
      model_or_state: a `Policy`, its `nnx.State` (`nnx.state(policy, nnx.Param)`), or that
        state's pure dict; fully addressable arrays (one host).
      cfg: the policy's `ModelConfig`.
      folder: output folder (created; existing files of the same names are overwritten).
      tokenizer_folder: optional folder whose tokenizer files (tokenizer.json,
        tokenizer_config.json, chat template, generation_config.json, ...) are copied, and
        whose config.json supplies bos/eos/pad token ids and max_position_embeddings.
      model_type: "llama", "qwen2" or "qwen3"; inferred from `cfg` by default.

    Returns:
      The folder path.
    """
    from safetensors.numpy import save_file

    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    params = _pure_params(model_or_state)
    if cfg.lora_rank:
        params = lora_lib.merged_params(params, cfg)
    extra = {}
    if tokenizer_folder is not None:
        src = os.fspath(tokenizer_folder)
        if os.path.isfile(os.path.join(src, "config.json")):
            src_cfg = read_config(src)
            keep = ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings")
            extra = {k: src_cfg[k] for k in keep if src_cfg.get(k) is not None}
        if os.path.abspath(src) != os.path.abspath(folder):
            for name in _TOKENIZER_FILES:
                if os.path.isfile(os.path.join(src, name)):
                    shutil.copyfile(os.path.join(src, name), os.path.join(folder, name))
    hf_config = config_to_hf(cfg, model_type, extra)
    tensors = {}
    for name, spec in tensor_specs(cfg).items():
        try:
            leaf = _get(params, spec.path)
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"parameter {_dotted(spec.path)!r} (for {name!r}) is missing"
            ) from None
        array = np.asarray(jax.device_get(leaf))
        array = array.T if spec.transpose else array
        if array.shape != spec.shape:
            raise ValueError(
                f"parameter {_dotted(spec.path)!r} has shape {array.shape} in checkpoint layout; "
                f"expected {spec.shape} for {name!r}"
            )
        tensors[name] = np.ascontiguousarray(array)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):  # a stale shard index would shadow the new file
        os.remove(index)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
        f.write("\n")
    return folder


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(graphdef, state, tokens, num_new):
    model = nnx.merge(graphdef, state)
    b, s = tokens.shape
    total = s + num_new
    positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    causal = jnp.arange(total)[None, :] <= jnp.arange(s)[:, None]  # [S, total]
    cache = policy_lib.init_cache(model.cfg, b, total)
    out = model(tokens, positions, jnp.broadcast_to(causal, (b, s, total)), cache, 0)
    first = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)

    def _decode_step(carry, i):
        cache, token = carry
        pos = s + i
        mask = jnp.broadcast_to(jnp.arange(total) <= pos, (b, 1, total))
        step = model(token[:, None], jnp.full((b, 1), pos, jnp.int32), mask, cache, pos)
        nxt = jnp.argmax(step.logits[:, 0], axis=-1).astype(jnp.int32)
        return (step.cache, nxt), nxt

    _, rest = jax.lax.scan(_decode_step, (out.cache, first), jnp.arange(num_new - 1))
    return jnp.concatenate([first[:, None], rest.T], axis=1)


def greedy_generate(model: policy_lib.Policy, tokens: jax.Array, num_new: int) -> jax.Array:
    """Greedy continuation with the KV cache (the parity check against `generate`).

    Args:
      model: the policy.
      tokens: int32[B, S] prompts (no padding).
      num_new: number of tokens to generate (>= 1).

    Returns:
      int32[B, num_new] the argmax continuation.
    """
    graphdef, state = nnx.split(model)
    return _greedy(graphdef, state, jnp.asarray(tokens, jnp.int32), int(num_new))
