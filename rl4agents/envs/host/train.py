"""Training on host environments: a `StepConfig` for `HostSpec` layouts and a host train step.

The learning half of a train step, `train.step.update`, works on any `Trajectory`; here it is
fed by `host_rollout` instead of the jitted rollout: `host_train_step` rolls out on the host
and then runs one jitted `update` (credit, then epochs x minibatches optimizer steps).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl4agents import credit, losses
from rl4agents.envs.host import pool as pool_lib
from rl4agents.envs.host import registry
from rl4agents.envs.host import rollout as host_rollout_lib
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib


def step_config(
    spec: pool_lib.HostSpec,
    model_cfg: policy_lib.ModelConfig,
    rollout_cfg: rollout_lib.RolloutConfig,
    *,
    credit_name: str = "grpo",
    credit_kwargs: dict[str, Any] | None = None,
    policy_loss: str = "ppo_clip",
    policy_kwargs: dict[str, Any] | None = None,
    lr: float = 1e-3,
    grad_clip: float = 1.0,
    entropy_coef: float = 0.0,
    kl_coef: float = 0.0,
    epochs: int = 1,
    minibatches: int = 1,
    mesh=None,
) -> step_lib.StepConfig:
    """A `StepConfig` for host episodes, resolved the way `train.experiment.build` does.

    `spec` stands in for the environment (the update only reads its layout sizes). Estimators
    that need a greedy rollout per task (ReMax) are not available on host environments.

    Raises:
      ValueError: a critic estimator without a value head, a greedy-baseline estimator, a
        batch the minibatches do not divide, or an invalid layout.
    """
    credit_kw = credit.validate(credit_name, credit_kwargs or {})
    needs_values = credit.requires_values(credit_name)
    if needs_values and model_cfg.value_head == "none":
        raise ValueError(
            f"credit_name={credit_name!r} needs a critic but model value_head='none'; "
            "allowed: 'shared' or 'separate'"
        )
    if credit.requires_greedy(credit_name):
        raise ValueError(f"credit_name={credit_name!r} needs greedy rollouts; not on host envs")
    if rollout_cfg.batch_size % minibatches:
        raise ValueError(
            f"minibatches={minibatches} does not divide the batch of {rollout_cfg.batch_size}"
        )
    rollout_lib.make_layout(spec, rollout_cfg)  # raises if one turn does not fit
    policy_fn = losses.get(policy_loss)
    policy_kw = losses.validate(policy_loss, policy_kwargs or {})
    loss_cfg = step_lib.LossConfig(
        policy_fn=functools.partial(policy_fn, **policy_kw),
        agg=policy_kw.get("agg", "token-mean"),
        agg_scale=policy_kw.get("agg_scale"),
        entropy_coef=entropy_coef,
        kl_coef=kl_coef,
        policy_takes_segments="segment_ids" in inspect.signature(policy_fn).parameters,
    )
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(model_cfg, nnx.Rngs(0))))
    return step_lib.StepConfig(
        graphdef=graphdef,
        env=spec,
        env_params=None,
        rollout=rollout_cfg,
        credit_fn=functools.partial(credit.get(credit_name), **credit_kw),
        needs_values=needs_values,
        loss=loss_cfg,
        optimizer=state_lib.make_optimizer(lr=lr, grad_clip=grad_clip),
        epochs=epochs,
        minibatches=minibatches,
        mesh=mesh,
    )


def init_state(
    key: jax.Array, model_cfg: policy_lib.ModelConfig, cfg: step_lib.StepConfig
) -> state_lib.TrainState:
    """Fresh parameters, optimizer state and, when KL is on, a frozen reference copy."""
    _, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(key)))
    ref = jax.tree.map(jnp.copy, params) if cfg.loss.kl_coef > 0 else None
    return state_lib.TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=cfg.optimizer.init(params),
        ref_params=ref,
        kl_coef=step_lib.initial_kl_coef(cfg.loss),
    )


def jit_update(cfg: step_lib.StepConfig):
    """`update` jitted: `(state, traj, key_perm) -> (state, metrics)`, the state donated."""
    return jax.jit(functools.partial(step_lib.update, cfg=cfg), donate_argnums=(0,))


def host_train_step(
    state: state_lib.TrainState,
    key_root: jax.Array,
    pool: pool_lib.HostPool,
    tokenizer,
    cfg: step_lib.StepConfig,
    update_fn,
) -> tuple[state_lib.TrainState, dict[str, float], host_rollout_lib.HostInfo]:
    """One RL iteration on host environments: `host_rollout`, then `update_fn`.

    Args:
      state: the training state (donated to `update_fn`).
      key_root: the run's root key; the step's key is `fold_in(key_root, state.step)`, and
        the games reset from training seeds (`registry.split_seeds`: even; held-out splits
        use odd ones).
      pool: the environments.
      tokenizer: the run's tokenizer.
      cfg: the step configuration (`step_config`).
      update_fn: `jit_update(cfg)`, built once and reused (one compilation).

    Returns:
      The new state, a flat dict of float metrics (the update's and `HostInfo.metrics()`),
      and the rollout's `HostInfo`.
    """
    key = jax.random.fold_in(key_root, jax.device_get(state.step))
    key_rollout, key_perm = jax.random.split(key)
    seeds = registry.split_seeds(
        host_rollout_lib.task_seeds(key_rollout, cfg.rollout.num_tasks), "train"
    )
    traj, info = host_rollout_lib.host_rollout_info(
        key_rollout, cfg.graphdef, state.params, pool, tokenizer, cfg.rollout, seeds
    )
    state, metrics = update_fn(state, traj, key_perm)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return state, {**metrics, **info.metrics()}, info
