"""LoRA: low-rank adapters on the policy's projections, base weights frozen.

LoRA (Hu et al., arXiv 2106.09685) replaces a projection `y = x W` (W: [in, out], the Flax
kernel layout) by

    y = x W + (alpha / r) * (x A) B,        A: [in, r],  B: [r, out],

and trains A and B only. B starts at zero, so the adapted model is the base model exactly until
the first update; A starts uniform in +-1/sqrt(in) (PEFT's default, Kaiming-uniform with
a = sqrt(5)). The low-rank path is computed on the activations, never as a dense [in, out]
matrix, so the update's backward pass costs O(tokens * r * (in + out)) per projection instead
of a full weight gradient; the policy stops gradients at every base parameter (`freeze`) so
that those gradients are not computed at all.

Targets are the decoder's seven projections by short name: "q", "k", "v", "o" (attention) and
"gate", "up", "down" (MLP). The adapters live next to the kernel they adapt, as
`nnx.LoRAParam`s named `lora_a` / `lora_b` (e.g. `model.layers.3.attn.q_proj.lora_a`), and
are kept in float32 whatever the base parameters' dtype: they are the trained (master) weights.
A value head (`value_proj`) is trained as well: it is new, so there is nothing to freeze.

Why not qwix (the library Tunix uses for LoRA): it adds adapters by intercepting a module's
`dot_general` and recognising its right operand as one of that module's parameters. The
policy multiplies q/k/v and gate/up as one product over concatenated kernels, inside the
attention / MLP module (`policy.Attention._qkv`, `policy.MLP`), which qwix cannot attribute to
a projection, and it creates adapters lazily on the first call, which the abstract model
construction of `hf.load_pretrained` and the train step's graphdef do not make.

`merged_params` folds the adapters into the kernels (`W + (alpha / r) A B`) for export as a
plain checkpoint (`hf.export_pretrained` calls it); `mask_optimizer` wraps an optimizer so that
only trainable leaves get updates and optimizer state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl4agents import sharding

# Short target name -> (submodule of a block, projection attribute).
TARGETS: dict[str, tuple[str, str]] = {
    "q": ("attn", "q_proj"),
    "k": ("attn", "k_proj"),
    "v": ("attn", "v_proj"),
    "o": ("attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}
ALL_TARGETS = tuple(TARGETS)
PARAM_NAMES = ("lora_a", "lora_b")
# Leaves trained besides the adapters: the value head (fresh, see the module docstring).
_HEAD_NAMES = ("value_proj",)
# Logical axes of the adapters: their entries of `rl4agents.sharding.PARAM_RULES`.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = tuple(
    rule for rule in sharding.PARAM_RULES if "lora_" in rule[0]
)


def check_settings(rank: int, alpha: float, targets: Sequence[str]) -> None:
    """Raises a one-line ValueError for a bad `model.lora.*` value.

    Args:
      rank: adapter rank r (0 = LoRA off).
      alpha: the scale numerator; the adapter's output is multiplied by alpha / r.
      targets: short names of the adapted projections (`ALL_TARGETS`).
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
        raise ValueError(f"model.lora.rank={rank!r}; allowed: an integer >= 0 (0 = off)")
    if not rank:
        return
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"model.lora.alpha={alpha!r}; allowed: a finite number > 0")
    if isinstance(targets, str) or not targets:
        raise ValueError(
            f"model.lora.targets={targets!r}; allowed: a non-empty tuple of {ALL_TARGETS}"
        )
    bad = [t for t in targets if t not in TARGETS]
    if bad or len(set(targets)) != len(targets):
        raise ValueError(
            f"model.lora.targets={tuple(targets)!r}; allowed: distinct names of {ALL_TARGETS}"
        )


def scale(cfg: Any) -> float:
    """alpha / r of a `ModelConfig` with LoRA on."""
    return cfg.lora_alpha / cfg.lora_rank


def targets_in(cfg: Any, submodule: str) -> tuple[str, ...]:
    """Projection attributes of `submodule` ("attn" or "mlp") that `cfg` adapts."""
    if not cfg.lora_rank:
        return ()
    return tuple(TARGETS[t][1] for t in cfg.lora_targets if TARGETS[t][0] == submodule)


def attach(linear: nnx.Linear, rank: int, rngs: nnx.Rngs) -> None:
    """Adds `lora_a` (f32[in, r], uniform in +-1/sqrt(in)) and `lora_b` (f32[r, out], zeros)
    to `linear`."""
    d_in, d_out = linear.in_features, linear.out_features
    bound = 1.0 / math.sqrt(d_in)
    a = jax.random.uniform(rngs.params(), (d_in, rank), jnp.float32, -bound, bound)
    linear.lora_a = nnx.LoRAParam(a)
    linear.lora_b = nnx.LoRAParam(jnp.zeros((rank, d_out), jnp.float32))


def init_a(key: jax.Array, d_in: int, rank: int) -> np.ndarray:
    """The initial A of `attach` for a projection with `d_in` inputs, as a host array."""
    bound = 1.0 / math.sqrt(d_in)
    return np.asarray(jax.random.uniform(key, (d_in, rank), jnp.float32, -bound, bound))


def freeze(x: jax.Array, on: bool) -> jax.Array:
    """`x` with its gradient stopped when `on` (a base parameter under LoRA); else `x`."""
    return jax.lax.stop_gradient(x) if on else x


def _product(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """x @ w with both operands cast to the compute dtype `dtype`; a bfloat16 product
    accumulates in and returns float32 (as the model's dense layers compute)."""
    acc = jnp.float32 if dtype == jnp.bfloat16 else None
    return jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=acc)


def delta(linear: nnx.Linear, x: jax.Array, factor: float, dtype) -> jax.Array:
    """factor * (x A) B of `linear`'s adapter: x [..., in] -> [..., out].

    Both products take operands in the compute dtype `dtype` (A and B are float32 master
    weights); in bfloat16 each accumulates in float32, the rank-r middle is cast back to
    bfloat16, and the result is float32, to be added to the base product's float32 result.
    """
    xa = _product(x, linear.lora_a[...], dtype)
    return factor * _product(xa, linear.lora_b[...], dtype)


def project(linear: nnx.Linear, x: jax.Array, cfg: Any, adapt: bool) -> jax.Array:
    """`linear(x)` with its base kernel (and bias) frozen, plus the adapter when `adapt`.

    Inputs and kernel are cast to the compute dtype `cfg.dtype`, as the model's dense layers
    do: in bfloat16, bf16 operands whose product accumulates in float32 (the result is
    float32; callers cast it back to the compute dtype).
    """
    ct = jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32
    y = _product(x, freeze(linear.kernel[...], True), ct)
    if linear.bias is not None:
        y = y + freeze(linear.bias[...], True).astype(y.dtype)
    if adapt:
        y = y + delta(linear, x, scale(cfg), ct)
    return y


def _names(path: tuple) -> list[str]:
    out = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                out.append(str(getattr(entry, attr)))
                break
    return out


def is_trainable(path: tuple) -> bool:
    """Whether the leaf at pytree key `path` is trained under LoRA: an adapter (`lora_a`,
    `lora_b`) or the value head."""
    names = _names(path)
    return any(n in PARAM_NAMES or n in _HEAD_NAMES for n in names)


def labels(params: Any) -> Any:
    """ "train" / "freeze" for every leaf of `params` (an nnx.State or its pure dict)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "train" if is_trainable(path) else "freeze", params
    )


def mask_optimizer(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer` applied to the LoRA adapters and the value head only.

    Every other leaf gets a zero update (its value stays bit-identical) and no optimizer
    state: `optax.multi_transform` keeps the inner optimizer's state (Adam moments, the
    clipping norm) over the trainable leaves alone. The labels are read from the parameter
    tree's paths (`labels`), so the wrapper needs no tree at construction.
    """
    return optax.multi_transform({"train": optimizer, "freeze": optax.set_to_zero()}, labels)


def count(params: Any) -> tuple[int, int]:
    """(trainable, total) element counts of a parameter tree under LoRA."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    total = sum(int(np.prod(x.shape)) for _, x in flat)
    trainable = sum(int(np.prod(x.shape)) for p, x in flat if is_trainable(p))
    return trainable, total


def logical_axes(path: str) -> tuple[str | None, ...] | None:
    """Logical axes of an adapter at "a/b/c" path `path` (`PARAM_RULES`), or None."""
    for pattern, axes in PARAM_RULES:
        if re.search(f"(^|/){pattern}$", path):
            return axes
    return None


def merged_params(params: dict, cfg: Any) -> dict:
    """The pure parameter dict with every adapter folded into its kernel.

    For each adapted projection, kernel <- W + (alpha / r) A B, computed in float32 and cast
    back to the kernel's dtype; the `lora_a` / `lora_b` leaves are dropped. The result is the
    base architecture's parameter tree (what `hf.export_pretrained` writes).

    Args:
      params: `nnx.to_pure_dict` of the policy's parameters (layers keyed by int), arrays on
        one host.
      cfg: the policy's `ModelConfig` (`lora_rank` > 0).

    Returns:
      A new nested dict (numpy arrays where merged); the input is not modified.
    """
    factor = scale(cfg)

    def walk(node):
        if not isinstance(node, dict):
            return node
        if "lora_a" in node and "kernel" in node:
            w = np.asarray(jax.device_get(node["kernel"]))
            a = np.asarray(jax.device_get(node["lora_a"]), np.float32)
            b = np.asarray(jax.device_get(node["lora_b"]), np.float32)
            merged = w.astype(np.float32) + np.float32(factor) * (a @ b)
            rest = {k: walk(v) for k, v in node.items() if k not in PARAM_NAMES}
            return {**rest, "kernel": merged.astype(w.dtype)}
        return {k: walk(v) for k, v in node.items()}

    return walk(params)
