"""The pure train step: rollout, rewards, advantages and E x M optax updates in one program."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rl4agents import sharding
from rl4agents.credit import common as credit_common
from rl4agents.losses import aggregate as agg_lib
from rl4agents.losses import policy as policy_losses
from rl4agents.losses import regularizers
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train.state import TrainState
from rl4agents.types import Trajectory


@dataclasses.dataclass(frozen=True)
class LossConfig:
    policy_fn: Callable[..., Any]  # partial of a registered policy loss (hparams bound)
    agg: str = "token-mean"  # aggregation of the entropy / KL terms
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    value_coef: float = 0.5
    value_clip: float = 0.5


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything static a train step closes over (resolved from the config)."""

    graphdef: Any
    env: Any
    env_params: Any
    rollout: rollout_lib.RolloutConfig
    credit_fn: Callable[..., Any]  # partial of a registered credit function
    needs_values: bool
    loss: LossConfig
    optimizer: optax.GradientTransformation
    epochs: int = 1
    minibatches: int = 1
    mesh: Any = None


class Batch(NamedTuple):
    tokens: jax.Array  # int32[B, T]
    valid_mask: jax.Array  # bool[B, T]
    action_mask: jax.Array  # bool[B, T]
    logp_old: jax.Array  # f32[B, T]
    advantages: jax.Array  # f32[B, T]
    returns: jax.Array  # f32[B, T] (zeros without a critic)
    values_old: jax.Array  # f32[B, T] (zeros without a critic)
    logp_ref: jax.Array  # f32[B, T] (zeros without KL)


def loss_fn(params, batch: Batch, cfg: StepConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy loss + entropy bonus + KL to the reference (k-estimator, in the loss) + value loss."""
    model = nnx.merge(cfg.graphdef, params)
    lc = cfg.loss
    sc = rollout_lib.score(
        model, batch.tokens, batch.valid_mask, cfg.rollout.temperature, cfg.needs_values
    )
    mask = batch.action_mask
    pg_loss, metrics = lc.policy_fn(sc.logp, batch.logp_old, batch.advantages, mask)
    entropy = agg_lib.aggregate(sc.entropy, mask, lc.agg)
    loss = pg_loss - lc.entropy_coef * entropy
    metrics = {**metrics, "pg_loss": pg_loss, "entropy": entropy}
    if lc.kl_coef > 0:
        kl = agg_lib.aggregate(
            regularizers.kl_penalty(sc.logp, batch.logp_ref, lc.kl_estimator), mask, lc.agg
        )
        loss = loss + lc.kl_coef * kl
        metrics["kl_ref"] = kl
    if cfg.needs_values:
        v_loss, v_metrics = policy_losses.value_loss(
            sc.values, batch.values_old, batch.returns, mask, clip=lc.value_clip, agg=lc.agg
        )
        loss = loss + lc.value_coef * v_loss
        metrics = {**metrics, **v_metrics, "value_loss": v_loss}
    metrics["loss"] = loss
    return loss, jax.lax.stop_gradient(metrics)


def rollout_metrics(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
    """Scalar summaries of a batch of episodes."""
    turns = jnp.maximum(traj.turn_valid.sum(), 1)
    rewards = traj.outcome_reward.reshape(-1, group_size)
    return {
        "reward": traj.outcome_reward.mean(),
        "success": traj.success.mean(),
        "turns": traj.num_turns.mean(),
        "invalid_rate": (traj.turn_valid & ~traj.turn_action_valid).sum() / turns,
        "truncated": traj.truncated.mean(),
        "zero_std_groups": jnp.mean(jnp.all(rewards == rewards[:, :1], axis=1)),
        "action_tokens": traj.action_mask.sum(axis=1).mean(),
        "context_tokens": traj.valid_mask.sum(axis=1).mean(),
    }


def train_length(cfg: StepConfig) -> int:
    """Slots the update needs: everything up to the last action block (the final observation
    block is never trained on by the policy loss, so it is left out of the forward pass)."""
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    return lay.length - lay.obs


def prepare_batch(state: TrainState, traj: Trajectory, cfg: StepConfig):
    """Old values / reference log-probs (one teacher-forced pass each) and advantages.

    Returns a `Batch` cut to `train_length(cfg)` slots, and advantage metrics.
    """
    t_full, t_train = traj.tokens.shape[1], train_length(cfg)
    tokens, valid = traj.tokens[:, :t_train], traj.valid_mask[:, :t_train]

    def pad(x):  # [B, t_train] -> [B, T]; the cut slots hold no action tokens
        return jnp.pad(x, ((0, 0), (0, t_full - t_train)))

    values_old = logp_ref = None
    if cfg.needs_values:
        model = nnx.merge(cfg.graphdef, state.params)
        values_old = pad(
            rollout_lib.score(model, tokens, valid, cfg.rollout.temperature, True).values
        )
    if cfg.loss.kl_coef > 0:
        ref = nnx.merge(cfg.graphdef, state.ref_params)
        logp_ref = rollout_lib.score(ref, tokens, valid, cfg.rollout.temperature).logp
    out = cfg.credit_fn(traj, values_old)
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    batch = Batch(
        tokens=tokens,
        valid_mask=valid,
        action_mask=traj.action_mask[:, :t_train],
        logp_old=traj.logp_behavior[:, :t_train],
        advantages=out.advantages[:, :t_train],
        returns=zeros if out.returns is None else out.returns[:, :t_train],
        values_old=zeros if values_old is None else values_old[:, :t_train],
        logp_ref=zeros if logp_ref is None else logp_ref,
    )
    adv_metrics = {
        "adv_mean": credit_common.masked_mean(out.advantages, traj.action_mask),
        "adv_abs": credit_common.masked_mean(jnp.abs(out.advantages), traj.action_mask),
        **out.metrics,
    }
    return batch, adv_metrics


def train_step(
    state: TrainState, key_root: jax.Array, cfg: StepConfig
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL iteration; pure. The step's key is `fold_in(key_root, state.step)`.

    Args:
      state: the training state.
      key_root: the run's root key; per-step randomness derives from it and the step number,
        so a resumed run replays the same randomness.
      cfg: static step configuration.

    Returns:
      The updated state and a flat dict of f32[] metrics.
    """
    key = jax.random.fold_in(key_root, state.step)
    key_rollout, key_perm = jax.random.split(key)
    traj = rollout_lib.rollout(
        key_rollout,
        cfg.graphdef,
        state.params,
        cfg.env,
        cfg.env_params,
        cfg.rollout,
        shard_fn=lambda t: sharding.shard_batch(t, cfg.mesh),
    )
    traj = sharding.shard_batch(traj, cfg.mesh)
    batch, adv_metrics = prepare_batch(state, traj, cfg)
    b = traj.batch_size
    mb = b // cfg.minibatches
    grad_fn = jax.grad(loss_fn, has_aux=True)

    def _update(carry, idx):
        params, opt_state = carry
        minibatch = jax.tree.map(lambda x: x[idx], batch) if cfg.minibatches > 1 else batch
        minibatch = sharding.shard_batch(minibatch, cfg.mesh)
        grads, metrics = grad_fn(params, minibatch, cfg)
        updates, opt_state = cfg.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def _epoch(carry, e):
        if cfg.minibatches > 1:
            perm = jax.random.permutation(jax.random.fold_in(key_perm, e), b)
            order = perm.reshape(cfg.minibatches, mb)
        else:
            order = jnp.zeros((1, 1), jnp.int32)  # unused: the full batch is one minibatch
        return jax.lax.scan(_update, carry, order)

    (params, opt_state), metrics = jax.lax.scan(
        _epoch, (state.params, state.opt_state), jnp.arange(cfg.epochs)
    )
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics = {**metrics, **adv_metrics, **rollout_metrics(traj, cfg.rollout.group_size)}
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def evaluate(
    params,
    task_keys: jax.Array,
    key: jax.Array,
    cfg: StepConfig,
    env,
    env_params,
    rollout_cfg: rollout_lib.RolloutConfig,
) -> dict[str, jax.Array]:
    """Run the policy on fixed tasks and summarise (greedy or sampled per `rollout_cfg`)."""
    traj = rollout_lib.rollout(
        key,
        cfg.graphdef,
        params,
        env,
        env_params,
        rollout_cfg,
        task_keys=task_keys,
        shard_fn=lambda t: sharding.shard_batch(t, cfg.mesh),
    )
    m = rollout_metrics(traj, rollout_cfg.group_size)
    return {k: m[k] for k in ("reward", "success", "turns", "invalid_rate", "truncated")}
