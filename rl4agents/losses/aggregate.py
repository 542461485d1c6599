"""Loss aggregation modes (verl `agg_loss`; docs/methods.md, Aggregation modes).

All modes reduce a per-token loss `l f32[B, T]` with mask `m bool[B, T]` to a scalar. Rows with
no masked token are excluded from the sequence means; every division is guarded, so an
all-masked batch gives 0, and values off the mask (even NaN or inf) never enter the result.

Each mode declares, as its registry attribute `microbatch_weighting`, how the losses of
equal microbatches add up to the loss of their whole minibatch (`microbatch_weights`, used by
gradient accumulation): "tokens" (a mean over action tokens), "rows" (a mean over rows with an
action token), "sum" (a sum divided by a constant), or "equal" (the default of a mode that
declares none: the mean of the microbatch losses).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.losses.registry import AGGREGATIONS

# The values of an aggregation mode's `microbatch_weighting` (see `microbatch_weights`).
MICROBATCH_WEIGHTINGS = ("tokens", "rows", "sum", "equal")


def _prepare(loss: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    chex.assert_rank(loss, 2)
    chex.assert_equal_shape([loss, mask])
    m = mask.astype(loss.dtype)
    return jnp.where(mask.astype(bool), loss, 0.0), m  # where, not l * m: NaN off the mask is 0


@AGGREGATIONS.register("token-mean", microbatch_weighting="tokens")
def token_mean(loss: jax.Array, mask: jax.Array, scale: float | None = None) -> jax.Array:
    """`sum_{i,t} m l / sum_{i,t} m` (verl default; DAPO token-level loss)."""
    del scale
    lm, m = _prepare(loss, mask)
    return jnp.sum(lm) / jnp.maximum(jnp.sum(m), 1.0)


def _seq_mean(per_row: jax.Array, m: jax.Array) -> jax.Array:
    nonempty = (jnp.sum(m, axis=1) > 0).astype(per_row.dtype)
    return jnp.sum(per_row * nonempty) / jnp.maximum(jnp.sum(nonempty), 1.0)


@AGGREGATIONS.register("seq-mean-token-sum", microbatch_weighting="rows")
def seq_mean_token_sum(loss: jax.Array, mask: jax.Array, scale: float | None = None) -> jax.Array:
    """`mean_{i: sum_t m > 0} sum_t m l`."""
    del scale
    lm, m = _prepare(loss, mask)
    return _seq_mean(jnp.sum(lm, axis=1), m)


@AGGREGATIONS.register("seq-mean-token-mean", microbatch_weighting="rows")
def seq_mean_token_mean(loss: jax.Array, mask: jax.Array, scale: float | None = None) -> jax.Array:
    """`mean_{i: sum_t m > 0} (sum_t m l / sum_t m)` (original GRPO; GSPO)."""
    del scale
    lm, m = _prepare(loss, mask)
    per_row = jnp.sum(lm, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    return _seq_mean(per_row, m)


@AGGREGATIONS.register("seq-mean-token-sum-norm", microbatch_weighting="sum")
def seq_mean_token_sum_norm(
    loss: jax.Array, mask: jax.Array, scale: float | None = None
) -> jax.Array:
    """`sum_{i,t} m l / C` with `C = scale`, or the padded length T if None (Dr. GRPO).

    Not divided by the number of sequences (verl). In the slot layout T counts all slots
    (prompt and observations included), so set `scale` to a fixed constant such as the
    maximum number of action tokens to keep the scale from drifting.
    """
    lm, _ = _prepare(loss, mask)
    denom = float(loss.shape[1]) if scale is None else scale
    return jnp.sum(lm) / denom


def aggregate(
    loss: jax.Array, mask: jax.Array, mode: str = "token-mean", scale: float | None = None
) -> jax.Array:
    """Reduce a per-token loss to a scalar with aggregation `mode` (verl `agg_loss`).

    | mode | formula |
    | token-mean | `sum m l / sum m` |
    | seq-mean-token-sum | `mean_{i: sum_t m > 0} sum_t m l` |
    | seq-mean-token-mean | `mean_{i: sum_t m > 0} (sum_t m l / sum_t m)` |
    | seq-mean-token-sum-norm | `sum m l / C`, `C = scale` or T |

    Dr. GRPO (https://arxiv.org/abs/2503.20783) motivates the last mode.

    Args:
      loss: f32[B, T] per-token loss.
      mask: bool[B, T] tokens that count (action tokens).
      mode: a name in `AGGREGATIONS.names()`; unknown modes raise KeyError.
      scale: constant `C` for "seq-mean-token-sum-norm"; ignored by the other modes.

    Returns:
      f32[] aggregated loss (0 when the mask is empty).
    """
    check_range("agg_scale", scale, 0.0, low_open=True, allow_none=True, note="(None = T)")
    return AGGREGATIONS.get(mode)(loss, mask, scale)


def microbatch_weights(mask: jax.Array, mode: str = "token-mean") -> jax.Array:
    """Weights `w_j` with `sum_j w_j L_j = L` for the losses `L_j` of k equal microbatches of
    one minibatch whose loss is `L`, all aggregated with `mode`.

    By the mode's `microbatch_weighting`: "tokens": each microbatch's share of the action
    tokens; "rows": its share of the rows with an action token (empty rows leave the sequence
    means); "sum": 1 (sums over a constant C add up); "equal", or a minibatch without action
    tokens: 1/k.

    Args:
      mask: bool[k, b, T] the microbatches' action masks.
      mode: a name in `AGGREGATIONS.names()`; unknown modes raise KeyError.

    Returns:
      f32[k] weights.
    """
    chex.assert_rank(mask, 3)
    k = mask.shape[0]
    weighting = AGGREGATIONS.attr(mode, "microbatch_weighting", "equal")
    if weighting not in MICROBATCH_WEIGHTINGS:
        raise ValueError(
            f"loss aggregation mode {mode!r} has microbatch_weighting={weighting!r}; "
            f"allowed: {MICROBATCH_WEIGHTINGS}"
        )
    if weighting == "sum":
        return jnp.ones((k,), jnp.float32)
    if weighting == "tokens":
        units = mask.sum(axis=(1, 2))
    elif weighting == "rows":
        units = mask.any(axis=2).sum(axis=1)
    else:
        return jnp.full((k,), 1.0 / k, jnp.float32)
    units = units.astype(jnp.float32)
    total = units.sum()
    return jnp.where(total > 0, units / jnp.maximum(total, 1.0), 1.0 / k)
