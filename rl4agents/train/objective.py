"""The loss the update minimises, and the batch it reads.

`prepare_batch` runs the teacher-forced passes a step needs before its updates (old values,
reference log-probs, the learner's log-probs for TIS and the masking corrections of
`losses.mismatch`), applies the KL-in-reward penalty and
assigns credit, giving a `Batch`; `loss_fn` composes the policy loss with the entropy bonus,
the KL to the reference, the value loss and the ECHO term on one (mini/micro)batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl4agents import sharding
from rl4agents.credit import common as credit_common
from rl4agents.credit import token as credit_token
from rl4agents.losses import aggregate as agg_lib
from rl4agents.losses import mismatch as mismatch_lib
from rl4agents.losses import policy as policy_losses
from rl4agents.losses import regularizers
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import views
from rl4agents.train.state import TrainState
from rl4agents.types import Trajectory

if TYPE_CHECKING:
    from rl4agents.train.step import StepConfig


class Batch(NamedTuple):
    tokens: jax.Array  # int32[B, T]
    valid_mask: jax.Array  # bool[B, T]
    # bool[B, T] (less the tokens a mismatch correction drops, and the branches' tokens under
    # `StepConfig.train_roots_only`)
    action_mask: jax.Array
    logp_old: jax.Array  # f32[B, T]
    advantages: jax.Array  # f32[B, T]
    returns: jax.Array  # f32[B, T] (zeros without a critic)
    values_old: jax.Array  # f32[B, T] (zeros without a critic)
    logp_ref: jax.Array  # f32[B, T] on `score_slots` (0 elsewhere; zeros without KL)
    weights: jax.Array  # f32[B, T] per-token loss weights (TIS, MIS; ones otherwise)
    obs_target: jax.Array  # bool[B, T] environment-observation tokens (ECHO targets)
    turn_ids: jax.Array  # int32[B, T] turn index per slot, -1 for prompt/pad
    # int32[B, R] the slots the losses read (every slot an action token can occupy), scored
    # alone by the teacher-forced pass; None: score every slot (ECHO reads observation slots)
    score_slots: jax.Array | None = None
    # f32[B, 2] EPO's running entropy average and steps seen, the same on every row (so that
    # minibatches carry it); None without EPO
    entropy_avg: jax.Array | None = None


# `loss_fn` metrics that are (parts of) the aggregated loss, summed like the gradient when
# microbatches are accumulated (`microbatch.accumulated_grads`).
LOSS_METRICS = ("loss", "pg_loss", "entropy", "kl_ref", "value_loss", "epo_penalty")


def loss_fn(params, batch: Batch, cfg: StepConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy loss + entropy bonus + EPO's entropy smoothing + KL to the reference
    (k-estimator, in the loss) + value loss + ECHO.

    The entropy, KL and value terms use the policy loss's aggregation (`agg`, and `agg_scale`
    for "seq-mean-token-sum-norm"), as verl applies one `agg_loss` mode to every term.
    """
    lc = cfg.loss
    prefix, group = views.shared_prefix(cfg, full_batch=False)
    forks = views.fork_prefix(cfg, full_batch=False)
    sc = rollout_lib.score_params(
        cfg.graphdef,
        params,
        batch.tokens,
        batch.valid_mask,
        cfg.rollout.temperature,
        cfg.needs_values,
        slots=batch.score_slots,
        prefix=prefix,
        group=group,
        shard=sharding.batch_constraint(cfg.mesh),
        role_params=cfg.rollout.role_params,
        turn_ids=batch.turn_ids,
        forks=forks,
    )
    mask = batch.action_mask
    extra = {"segment_ids": batch.turn_ids} if lc.policy_takes_segments else {}
    pg_loss, metrics = lc.policy_fn(
        sc.logp, batch.logp_old, batch.advantages, mask, batch.weights, **extra
    )
    entropy = agg_lib.aggregate(sc.entropy, mask, lc.agg, lc.agg_scale)
    loss = pg_loss - lc.entropy_coef * entropy
    metrics = {**metrics, "pg_loss": pg_loss, "entropy": entropy}
    if lc.epo_coef > 0:  # no penalty before the average has seen a step
        avg, seen = batch.entropy_avg[0, 0], batch.entropy_avg[0, 1] > 0
        penalty = regularizers.entropy_smoothing_penalty(
            entropy, avg, low=lc.epo_low, high=lc.epo_high
        )
        penalty = jnp.where(seen, penalty, 0.0)
        loss = loss + lc.epo_coef * penalty
        metrics["epo_penalty"] = penalty
    if lc.echo_coef > 0:
        echo = regularizers.echo_loss(sc.logp, batch.obs_target)
        loss = loss + lc.echo_coef * echo
        metrics["echo_ce"] = echo
    if lc.kl_coef > 0 and not lc.kl_in_reward:
        kl = agg_lib.aggregate(
            regularizers.kl_penalty(sc.logp, batch.logp_ref, lc.kl_estimator),
            mask,
            lc.agg,
            lc.agg_scale,
        )
        loss = loss + lc.kl_coef * kl
        metrics["kl_ref"] = kl
    if cfg.needs_values:
        v_loss, v_metrics = policy_losses.value_loss(
            sc.values,
            batch.values_old,
            batch.returns,
            mask,
            clip=lc.value_clip,
            agg=lc.agg,
            agg_scale=lc.agg_scale,
        )
        loss = loss + lc.value_coef * v_loss
        metrics = {**metrics, **v_metrics, "value_loss": v_loss}
    metrics["loss"] = loss
    return loss, jax.lax.stop_gradient(metrics)


def epo_rows(state: TrainState, rows: int) -> jax.Array:
    """f32[rows, 2]: `state.entropy_avg` on every row (EPO's running entropy average)."""
    if state.entropy_avg is None:
        raise ValueError(
            "loss.epo_coef > 0 needs TrainState.entropy_avg; build the state with "
            "entropy_avg=step.initial_entropy_avg(cfg.loss)"
        )
    return jnp.broadcast_to(state.entropy_avg.astype(jnp.float32), (rows, 2))


def root_rows(n: int, cfg: StepConfig) -> jax.Array:
    """bool[n]: the update's rows (episodes, or their step rows under context="window") that
    belong to the B = num_tasks x group_size roots of a branching rollout, which come first."""
    if n % cfg.num_rows:
        raise ValueError(
            f"the update got {n} rows, but rollout.branch makes {cfg.num_rows} episodes per "
            "step; allowed: the episodes of a branching rollout (or their step rows)"
        )
    return jnp.arange(n) < cfg.rollout.batch_size * (n // cfg.num_rows)


def prepare_batch(
    state: TrainState, traj: Trajectory, cfg: StepConfig, rows: rollout_lib.StepRows | None = None
):
    """Old values / reference log-probs (one teacher-forced pass each) and advantages.

    Credit is assigned on the episodes (`traj`, full-history slots); the update trains on the
    episodes cut to `views.train_length(cfg)` slots, or with `rows` (context="window") on the
    step rows, with values, penalties and advantages moved between the two on action slots.
    Under `cfg.train_roots_only` the branches' tokens leave the batch's `action_mask` after
    the credit has read them.

    Returns a `Batch` of N rows and advantage metrics.
    """
    view = views.full_view(traj, cfg) if rows is None else views.window_view(rows, cfg)
    tokens, valid, mask = view.tokens, view.valid, view.action_mask
    lc = cfg.loss
    # The losses read log-probs only on action slots (ECHO also on observation slots): score
    # those alone (see `rollout_lib.score`). Old values stay on every slot for the credit.
    slots = None
    if lc.echo_coef <= 0:
        slots = jnp.broadcast_to(
            jnp.asarray(view.action_slots), (tokens.shape[0], len(view.action_slots))
        )
    values_old = logp_ref = logp_learner = None
    kl_metrics = {}
    prefix, group = views.shared_prefix(cfg, full_batch=True) if rows is None else (0, 1)
    forks = views.fork_prefix(cfg, full_batch=True) if rows is None else None
    pin = sharding.batch_constraint(cfg.mesh)
    corrects = lc.tis_cap > 0 or lc.mismatch_fn is not None  # needs the learner's log-probs
    if cfg.needs_values or corrects:
        sc = rollout_lib.score_params(
            cfg.graphdef,
            state.params,
            tokens,
            valid,
            cfg.rollout.temperature,
            cfg.needs_values,
            prefix=prefix,
            group=group,
            shard=pin,
            role_params=cfg.rollout.role_params,
            turn_ids=view.turn_ids,
            forks=forks,
        )
        values_old = sc.values
        logp_learner = sc.logp
    logp_behavior = view.logp_behavior
    if lc.kl_coef > 0:
        logp_ref = rollout_lib.score_params(
            cfg.graphdef,
            state.ref_params,
            tokens,
            valid,
            cfg.rollout.temperature,
            slots=slots,
            prefix=prefix,
            group=group,
            shard=pin,
            role_params=cfg.rollout.role_params,
            turn_ids=view.turn_ids,
            forks=forks,
        ).logp
        if lc.kl_in_reward:
            # r_t -= beta * KL(old, ref) on action tokens (docs/methods.md, KL in the loss vs
            # in the reward, and the adaptive controller). "old" is the learner's log-probs
            # where a pass computed them (verl's recomputed old_log_probs), else the sampler's:
            # the same up to numerics without a mismatch.
            logp_kl = logp_behavior if logp_learner is None else logp_learner
            kl = regularizers.kl_penalty(logp_kl, logp_ref, lc.kl_reward_estimator)
            beta = state.kl_coef if lc.kl_ctrl == "adaptive" else lc.kl_coef
            traj = traj.replace(token_penalty=view.to_slots(jnp.where(mask, beta * kl, 0.0)))
            # Rows without action tokens (unfilled or finished) are left out of the KL and n.
            kl_now, kl_rows = regularizers.sequence_mean_kl(kl, mask)
            kl_metrics = {
                "kl_reward": kl_now,
                "kl_rows": kl_rows,
                "kl_coef": jnp.asarray(beta, jnp.float32),
            }
    if credit_token.bootstraps_truncated(cfg.credit_fn):  # needs the value after a row's end
        model = nnx.merge(cfg.graphdef, state.params)
        out = views.tail_credit(model, traj, cfg, rows is not None, prefix, group, pin, forks)
    else:
        out = cfg.credit_fn(traj, None if values_old is None else view.to_slots(values_old))
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    weights = jnp.ones(tokens.shape, jnp.float32)
    logp_old = logp_behavior
    if lc.tis_cap > 0:  # the learner's log-probs are the PPO anchor; w corrects the sampler
        weights = policy_losses.tis_weights(
            logp_learner, logp_behavior, mask, cap=lc.tis_cap, mode=lc.tis_mode
        )
        logp_old = jnp.where(mask, logp_learner, 0.0)
    elif lc.mismatch_fn is not None:  # as TIS, and tokens outside the band leave the loss
        weights, keep = lc.mismatch_fn(logp_learner, logp_behavior, mask)
        kl_metrics = {**kl_metrics, **mismatch_lib.kept_metrics(keep, mask)}
        mask = keep
        logp_old = jnp.where(mask, logp_learner, 0.0)
    if cfg.train_roots_only:  # the branches served the credit alone (VinePPO's value rollouts)
        mask = mask & root_rows(mask.shape[0], cfg)[:, None]
    batch = Batch(
        tokens=tokens,
        valid_mask=valid,
        action_mask=mask,
        logp_old=logp_old,
        advantages=view.from_slots(out.advantages),
        returns=zeros if out.returns is None else view.from_slots(out.returns),
        values_old=zeros if values_old is None else jnp.where(mask, values_old, 0.0),
        logp_ref=zeros if logp_ref is None else logp_ref,
        weights=weights,
        obs_target=view.obs_target,
        turn_ids=view.turn_ids,
        score_slots=slots,
        entropy_avg=None if lc.epo_coef <= 0 else epo_rows(state, tokens.shape[0]),
    )
    adv_metrics = {
        "adv_mean": credit_common.masked_mean(out.advantages, traj.action_mask),
        "adv_abs": credit_common.masked_mean(jnp.abs(out.advantages), traj.action_mask),
        **out.metrics,
        **kl_metrics,
    }
    return batch, adv_metrics
