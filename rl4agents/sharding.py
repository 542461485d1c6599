"""Mesh construction and the shardings of parameters, optimizer state and batches.

Parallelism is `jax.jit` with `NamedSharding` over one named mesh, the modern form of `pmap`
data parallelism. Axes are named in the config (`data`, `fsdp`, `tensor`). One table,
`LOGICAL_RULES`, maps the model's logical dimensions (batch, embed, heads, kv_heads, mlp,
vocab) to mesh axes, and `PARAM_RULES` names the logical dimensions of every parameter by its
path; parameters, their optimizer moments and the frozen reference copy take their shardings
from these (`tree_shardings`), per-episode arrays (trajectories, the KV cache) shard their
leading batch axis as the "batch" rule says (`shard_batch`). With the default rules a
(data, fsdp, tensor) mesh is data parallel over `data`, ZeRO-3/FSDP over `fsdp` (parameters
and optimizer state split along `embed`, gathered by XLA where a layer needs them) and
Megatron-style tensor parallel over `tensor` (heads, MLP hidden units and vocabulary split).
A dimension the mesh axes do not divide stays replicated (a 23-word vocabulary on 8 devices).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

# Logical dimension -> mesh axes (a tuple shards over their product; None replicates).
LOGICAL_RULES: dict[str, tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),  # query heads x head_dim, flattened
    "kv_heads": ("tensor",),  # key/value heads x head_dim, flattened
    "mlp": ("tensor",),
    "norm": None,
}
BATCH_AXES = LOGICAL_RULES["batch"]
# The mesh axes the rules place anything on: a mesh axis of another name would hold nothing
# (every array replicated over it, no data parallelism) and is refused (`check_mesh_shape`).
MESH_AXES = tuple(dict.fromkeys(a for axes in LOGICAL_RULES.values() for a in axes or ()))

# Parameter path (regex on "a/b/c", matched at the end) -> logical dimensions of the array.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed/embedding", ("vocab", "embed")),
    (r"lm_head/kernel", ("embed", "vocab")),
    (r"q_proj/kernel", ("embed", "heads")),
    (r"(k_proj|v_proj)/kernel", ("embed", "kv_heads")),
    (r"o_proj/kernel", ("heads", "embed")),
    (r"q_proj/bias", ("heads",)),
    (r"(k_proj|v_proj)/bias", ("kv_heads",)),
    (r"(gate_proj|up_proj)/kernel", ("embed", "mlp")),
    (r"down_proj/kernel", ("mlp", "embed")),
    (r"value_proj/kernel", ("embed", None)),
    (r"value_proj/bias", (None,)),
    (r"[a-z_]*norm/scale", ("norm",)),  # input_norm, post_attn_norm, final_norm, q_norm, k_norm
    (r"entropy_avg", (None,)),  # EPO's (running average, steps seen): replicated
    # LoRA adapters (rl4agents.models.lora): A [in, r] keeps the kernel's input axis, B [r, out]
    # its output axis; the rank axis is replicated.
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/lora_a", ("embed", None)),
    (r"o_proj/lora_a", ("heads", None)),
    (r"down_proj/lora_a", ("mlp", None)),
    (r"q_proj/lora_b", (None, "heads")),
    (r"(k_proj|v_proj)/lora_b", (None, "kv_heads")),
    (r"(gate_proj|up_proj)/lora_b", (None, "mlp")),
    (r"(o_proj|down_proj)/lora_b", (None, "embed")),
)


def make_mesh(
    axes: Sequence[str], shape: Sequence[int], axis_types: str = "auto", devices=None
) -> jax.sharding.Mesh:
    """Build a mesh; one `-1` in `shape` takes the remaining devices.

    Raises:
      ValueError: naming mesh.shape / mesh.axis_types when they do not fit the devices.
    """
    check_mesh_shape(axes, shape, axis_types)
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    shape = list(shape)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if n % known:
            raise ValueError(f"mesh.shape={tuple(shape)} does not divide the {n} devices")
        shape[shape.index(-1)] = n // known
    if math.prod(shape) > n or n % math.prod(shape):
        raise ValueError(
            f"mesh.shape={tuple(shape)} needs {math.prod(shape)} devices; {n} are available "
            "and the mesh size must divide them"
        )
    kind = AxisType.Auto if axis_types == "auto" else AxisType.Explicit
    grid = np.array(devices[: math.prod(shape)]).reshape(shape)
    return jax.sharding.Mesh(grid, tuple(axes), axis_types=(kind,) * len(axes))


def check_mesh_shape(axes: Sequence[str], shape: Sequence[int], axis_types: str = "auto") -> None:
    """`make_mesh`'s checks that need no devices.

    Raises:
      ValueError: naming mesh.axes / mesh.shape / mesh.axis_types: an axis name the sharding
        rules do not use (`MESH_AXES`) or a repeated one, not one entry per axis, an entry
        that is not a whole number >= 1 or a single -1, an unknown axis type.
    """
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    if (
        not names
        or any(a not in MESH_AXES for a in names)
        or len(set(names)) != len(names)
        or isinstance(axes, str)
    ):
        raise ValueError(
            f"mesh.axes={axes!r}; allowed: a tuple of distinct names among {MESH_AXES} (the "
            "axes the sharding rules place arrays on)"
        )
    shape = tuple(shape)
    if len(shape) != len(axes):
        raise ValueError(f"mesh.shape={shape} must have one entry per axis in {tuple(axes)}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh.shape={shape} has more than one -1")
    if any(isinstance(s, bool) or not isinstance(s, int) or (s < 1 and s != -1) for s in shape):
        raise ValueError(
            f"mesh.shape={shape}; allowed: entries >= 1, at most one -1 (the remaining devices)"
        )
    if axis_types not in ("auto", "explicit"):
        raise ValueError(f"mesh.axis_types={axis_types!r}; allowed: 'auto', 'explicit'")


def abstract_mesh(axes: Sequence[str], shape: Sequence[int]) -> jax.sharding.AbstractMesh | None:
    """The mesh of `shape` without devices (`check_mesh_shape`d), for checks of the batch
    split before any device is chosen; None when a batch axis is -1 (sized by the devices)."""
    sizes = dict(zip(axes, shape, strict=True))
    if any(sizes[a] == -1 for a in BATCH_AXES if a in sizes):
        return None
    shape = tuple(1 if s == -1 else s for s in shape)  # a model axis of -1: any size divides
    return jax.sharding.AbstractMesh(shape, tuple(axes))


def batch_axes(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_size_divisor(mesh: jax.sharding.Mesh) -> int:
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int) -> NamedSharding:
    """Shard the leading (batch) axis over (`data`, `fsdp`); other axes replicated."""
    return NamedSharding(mesh, P(batch_axes(mesh), *([None] * (ndim - 1))))


def shard_batch(tree, mesh: jax.sharding.Mesh | None):
    """Constrain every array leaf of `tree` to batch sharding (inside jit); no-op without mesh."""
    if mesh is None:
        return tree

    def constrain(x):
        if not hasattr(x, "ndim") or x.ndim == 0:
            return x
        return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim))

    return jax.tree.map(constrain, tree)


def batch_constraint(mesh: jax.sharding.Mesh | None):
    """`shard_batch` bound to `mesh`: a function of a pytree, for the rollout's `shard_fn` and
    the model's hidden-state constraint (`Policy(..., shard=)`); the identity without mesh."""
    return functools.partial(shard_batch, mesh=mesh)


def path_str(path: tuple) -> str:
    """ "a/b/0/c" from a pytree key path (dict keys, attributes, indices; nnx `.value` dropped)."""
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def logical_axes(path: str) -> tuple[str | None, ...] | None:
    """The logical dimensions of the parameter at `path` (see `PARAM_RULES`), or None."""
    for pattern, axes in PARAM_RULES:
        if re.search(f"(^|/){pattern}$", path):
            return axes
    return None


def logical_spec(
    axes: Sequence[str | None], shape: Sequence[int], mesh: jax.sharding.Mesh, rules=None
) -> P:
    """PartitionSpec of an array with logical dimensions `axes` under `rules` on `mesh`.

    Mesh axes of size 1 are left out of the spec. A dimension whose mesh axes are absent from
    the mesh, already used by an earlier dimension, or do not divide its size is replicated.
    """
    rules = LOGICAL_RULES if rules is None else rules
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match an array of shape {shape}")
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape):
        mesh_axes = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        mesh_axes = tuple(
            a
            for a in (mesh_axes or ())
            if a in mesh.axis_names and mesh.shape[a] > 1 and a not in used
        )
        n = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or size % n:
            spec.append(None)
            continue
        used.update(mesh_axes)
        spec.append(mesh_axes if len(mesh_axes) > 1 else mesh_axes[0])
    return P(*spec)


def tree_shardings(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings for a training-state pytree (params, optimizer state, reference copy).

    Every leaf whose path ends in a parameter path of `PARAM_RULES` (a parameter, or its Adam
    moments inside the optimizer state) gets that parameter's sharding; scalars (the step,
    Adam's count) are replicated.

    Args:
      tree: pytree of arrays or `jax.ShapeDtypeStruct`s.
      mesh: the mesh.

    Raises:
      ValueError: an array of rank >= 1 matches no rule (naming its path).
    """

    def one(path, leaf):
        shape = tuple(getattr(leaf, "shape", ()))
        if not shape:
            return replicated(mesh)
        name = path_str(path)
        axes = logical_axes(name)
        if axes is None:
            raise ValueError(
                f"no sharding rule for the array at {name!r} (shape {shape}); add its "
                "logical axes to rl4agents.sharding.PARAM_RULES"
            )
        return NamedSharding(mesh, logical_spec(axes, shape, mesh))

    return jax.tree_util.tree_map_with_path(one, tree)


def describe(tree: Any) -> list[str]:
    """ "path: shape spec" lines of a pytree of shardings or sharded arrays (golden files)."""
    lines = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shard = getattr(leaf, "sharding", leaf)
        spec = getattr(shard, "spec", shard)
        shape = tuple(getattr(leaf, "shape", ()))
        lines.append(f"{path_str(path) or '<root>'}: {shape} {spec}")
    return lines
