"""Training state and optimizer."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
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
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping and a warm-up then constant or cosine schedule."""
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
    return optax.chain(*parts)
