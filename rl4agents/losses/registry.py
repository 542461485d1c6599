"""Registries for policy losses and loss-aggregation modes.

Policy loss signature:
    fn(logp, logp_old, advantages, mask, weights=None, *, <hparams>) -> (loss f32[], metrics)
`weights` f32[B, T] | None is a constant per-token multiplier (truncated importance sampling).
A loss that also takes `segment_ids` (e.g. GSPO per turn) receives the slot turn ids.
Aggregation signature:
    fn(loss f32[B, T], mask bool[B, T], scale: float | None) -> f32[]

Same rules as every registry (`rl4agents.registry.Registry`): duplicate names raise
ValueError, unknown names raise KeyError listing the known ones, hyperparameters are
keyword-only and `validate` binds a config dict to the signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rl4agents.registry import Registry

POLICY_LOSSES = Registry("policy loss", section="loss")
AGGREGATIONS = Registry("loss aggregation mode")


def register(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under `name` (duplicates raise ValueError)."""
    return POLICY_LOSSES.register(name)


def get(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name`; unknown names raise KeyError listing names()."""
    return POLICY_LOSSES.get(name)


def names() -> list[str]:
    """Sorted names of all registered policy losses."""
    return POLICY_LOSSES.names()


def defaults(name: str) -> dict[str, Any]:
    """Reference defaults of policy loss `name`."""
    return POLICY_LOSSES.defaults(name)


def validate(name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check `hparams` for policy loss `name`; return them merged with the defaults.

    Raises:
      KeyError: unknown `name`.
      ValueError: unknown field (names the field, the variant and the allowed fields); an
        unknown `agg` mode; or a value the loss refuses ("loss.ppo_clip: clip_low=-1.0;
        allowed: in [0, 1]").
    """
    bound = POLICY_LOSSES.validate(name, hparams)
    if "agg" in bound and bound["agg"] not in AGGREGATIONS.names():
        raise ValueError(
            f"{name}.agg={bound['agg']!r} is not a loss aggregation mode; "
            f"allowed: {AGGREGATIONS.names()}"
        )
    # Trace the loss once on abstract [2, 8] inputs (no computation): its own checks of the
    # hyperparameters (ranges, choices) then fail at start-up, not in the first train step.
    fn = get(name)
    f32 = jax.ShapeDtypeStruct((2, 8), jnp.float32)
    mask = jax.ShapeDtypeStruct((2, 8), jnp.bool_)
    extra = {}
    if "segment_ids" in inspect.signature(fn).parameters:
        extra["segment_ids"] = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    try:
        jax.eval_shape(lambda *a: fn(*a, **extra, **bound), f32, f32, f32, mask)
    except ValueError as e:
        raise ValueError(f"loss.{name}: {e}") from e
    return bound
