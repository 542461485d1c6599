"""Training state and optimizer."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32[] number of updates applied
    params: Any  # nnx.State of the policy (and value head)
    opt_state: Any  # optax state
    ref_params: Any  # nnx.State of the frozen reference policy, or None (no KL term)
    # f32[] the KL coefficient beta under the adaptive controller (loss.kl_ctrl="adaptive"),
    # updated every step and checkpointed with the rest; None for a fixed beta.
    kl_coef: Any = None
    # f32[2] EPO's running entropy average and the number of steps it has seen (loss.epo_coef
    # > 0, `step.initial_entropy_avg`), updated every step like kl_coef; None without EPO.
    entropy_avg: Any = None
    # The sampler's parameters under `train.staleness` = k > 0: a tuple of k copies of
    # `params`, oldest first; entry i holds the parameters before update `step - k + i`
    # (the initial parameters while `step < k`). The step samples its episodes with entry 0
    # and appends the parameters it updated from (`step.advance_stale`). Sharded like
    # `params` and checkpointed with the rest: k more copies of the parameters in memory
    # (k x 4 bytes per f32 parameter). None when k = 0.
    stale_params: Any = None


def make_optimizer(
    *,
    lr: float,
    b1: float = 0.9,
    b2: float = 0.999,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    warmup_steps: int = 0,
    schedule: str = "constant",
    total_steps: int = 1,
    skip_zero_grad: bool = False,
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping and a warm-up then constant or cosine schedule;
    `skip_zero_grad`: wrapped in `skip_zero_updates`."""
    if schedule == "constant":
        sched = (
            optax.join_schedules(
                [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)],
                [warmup_steps],
            )
            if warmup_steps
            else optax.constant_schedule(lr)
        )
    elif schedule == "cosine":
        sched = optax.warmup_cosine_decay_schedule(
            0.0, lr, max(warmup_steps, 1), max(total_steps, warmup_steps + 1)
        )
    else:
        raise ValueError(f"optim.schedule={schedule!r}; allowed: 'constant', 'cosine'")
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
    parts.append(optax.adamw(sched, b1=b1, b2=b2, weight_decay=weight_decay))
    opt = optax.chain(*parts)
    return skip_zero_updates(opt) if skip_zero_grad else opt


def skip_zero_updates(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner`, except that an update whose gradient is exactly zero is no update at all: the
    parameters and `inner`'s state (moments, step count, schedule) stay as they were.

    Under GRPO a batch in which every group's rewards are equal has zero advantage everywhere
    and, without other loss terms, a zero gradient. Adam still moves the parameters on such a
    step: its first moment m decays by b1 per step while the square root of its bias-corrected
    second moment shrinks more slowly, so one informative gradient goes on moving every
    parameter by up to about lr per step, in that gradient's sign, for tens of steps after it
    (steps of m_hat / sqrt(v_hat) with nothing new in m). Where informative batches are rare
    (sparse success) those stale moves are most of what the policy does. Skipping the empty
    updates keeps Adam's state as of the last informative one; schedules then count applied
    updates. The check is on the whole gradient (a KL or entropy term keeps it nonzero).
    """

    def update(grads, state, params=None):
        updates, new_state = inner.update(grads, state, params)
        live = optax.tree.norm(grads) > 0
        updates = jax.tree.map(lambda u: jnp.where(live, u, jnp.zeros_like(u)), updates)
        new_state = jax.tree.map(lambda n, o: jnp.where(live, n, o), new_state, state)
        return updates, new_state

    return optax.GradientTransformation(inner.init, update)
