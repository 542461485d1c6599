"""Mesh construction and the shardings of parameters and batches.

Parallelism is `jax.jit` with `NamedSharding` over one named mesh, the modern form of `pmap`
data parallelism. Axes are named in the config (`data`, `fsdp`, `tensor`); the batch axis of
every per-episode array maps to (`data`, `fsdp`); parameters are replicated here (data
parallel), the logical-axis rules for FSDP/tensor sharding come with the scale-out work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def make_mesh(
    axes: Sequence[str], shape: Sequence[int], axis_types: str = "auto", devices=None
) -> jax.sharding.Mesh:
    """Build a mesh; one `-1` in `shape` takes the remaining devices.

    Raises:
      ValueError: naming mesh.shape / mesh.axis_types when they do not fit the devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    shape = list(shape)
    if len(shape) != len(axes):
        raise ValueError(f"mesh.shape={tuple(shape)} must have one entry per axis in {tuple(axes)}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh.shape={tuple(shape)} has more than one -1")
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
    if axis_types not in ("auto", "explicit"):
        raise ValueError(f"mesh.axis_types={axis_types!r}; allowed: 'auto', 'explicit'")
    kind = AxisType.Auto if axis_types == "auto" else AxisType.Explicit
    grid = np.array(devices[: math.prod(shape)]).reshape(shape)
    return jax.sharding.Mesh(grid, tuple(axes), axis_types=(kind,) * len(axes))


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
