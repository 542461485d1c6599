"""The benchmark jobs in rl4agents terms: jitted rollouts and real train steps, timed.

`scripts/bench.py` drives these. Every timing blocks on the outputs (`block_until_ready`)
and reports the first call (trace + compile + run) apart from the timed repeats.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rl4agents import sharding
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import resolve
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib


@dataclasses.dataclass
class Timing:
    """Seconds of the first call and of each timed repeat."""

    first_s: float
    times_s: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min(self) -> float:
        return min(self.times_s)

    @property
    def max(self) -> float:
        return max(self.times_s)

    def as_dict(self) -> dict[str, Any]:
        return dict(
            first_s=round(self.first_s, 4),
            times_s=[round(t, 4) for t in self.times_s],
            median_s=round(self.median, 4),
            min_s=round(self.min, 4),
            max_s=round(self.max, 4),
        )


def time_calls(fn: Callable[[int], Any], repeats: int) -> tuple[Timing, list[Any]]:
    """Call `fn(i)` once to warm up, then `repeats` times; block on each result.

    Returns the timing and the blocked outputs of the timed calls.
    """
    t0 = time.perf_counter()
    jax.block_until_ready(fn(0))
    first = time.perf_counter() - t0
    times, outs = [], []
    for i in range(1, repeats + 1):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(i))
        times.append(time.perf_counter() - t0)
        outs.append(out)
    return Timing(first, times), outs


def make_rollout_fn(
    graphdef,
    env,
    env_params,
    cfg: rollout_lib.RolloutConfig,
    mesh,
    task_keys: jax.Array | None = None,
):
    """Jitted `(key, params) -> Trajectory`, sharded over the mesh like the train step's."""
    shard_fn = sharding.batch_constraint(mesh)

    def run(key, params):
        return rollout_lib.rollout(
            key, graphdef, params, env, env_params, cfg, task_keys=task_keys, shard_fn=shard_fn
        )

    return jax.jit(run)


def peer_step_config(
    env,
    rollout_cfg: rollout_lib.RolloutConfig,
    model_cfg: policy_lib.ModelConfig,
    mesh,
    *,
    lr: float = 1e-5,
    clip: float = 0.2,
    std_eps: float = 1e-4,
    agg: str = "token-mean",
) -> step_lib.StepConfig:
    """The peers' GRPO update as a `StepConfig`: group-normalised outcome advantages (unbiased
    std + 1e-4, as TRL), clipped surrogate (eps 0.2, no dual clip), beta 0, no entropy bonus,
    one AdamW update per batch (TRL defaults: weight decay 0, gradient clipping at norm 1)."""
    return resolve.step_config(
        env,
        model_cfg,
        rollout_cfg,
        mesh,
        credit_name="grpo",
        credit_kwargs={"eps": std_eps, "scale": "group"},
        policy_loss="ppo_clip",
        policy_kwargs={"clip_low": clip, "clip_high": clip, "dual_clip_c": None, "agg": agg},
        optim=state_lib.make_optimizer(lr=lr, weight_decay=0.0, grad_clip=1.0),
        shared_prompt=rollout_lib.make_layout(env, rollout_cfg).prompt,  # as train.share_prompt
    )


def make_experiment(
    step_cfg: step_lib.StepConfig, model_cfg: policy_lib.ModelConfig, mesh
) -> experiment_lib.Experiment:
    """An `Experiment` around a hand-built `StepConfig`, jitted exactly as `build` does."""
    state_sh = experiment_lib.state_shardings(model_cfg, step_cfg, mesh)
    train_step = experiment_lib.jit_train_step(step_cfg, mesh, state_sh)
    return experiment_lib.Experiment(None, step_cfg.env, model_cfg, step_cfg, mesh, train_step)


def time_rollout(rollout_fn, params, repeats: int, key: jax.Array) -> tuple[Timing, dict]:
    """Time `rollout_fn(fold_in(key, i), params)`; count tokens and turns per call."""
    timing, trajs = time_calls(lambda i: rollout_fn(jax.random.fold_in(key, i), params), repeats)
    counts = [
        dict(
            action_tokens=int(t.action_mask.sum()),
            context_tokens=int(t.valid_mask.sum()),
            slots=int(t.tokens.size),
            env_steps=int(t.turn_valid.sum()),
            episodes=int(t.tokens.shape[0]),
            mean_return=float(t.outcome_reward.mean()),
            valid_action_frac=float(t.turn_action_valid.sum() / jnp.maximum(t.turn_valid.sum(), 1)),
        )
        for t in trajs
    ]
    return timing, per_second(timing, counts)


def per_second(timing: Timing, counts: list[dict]) -> dict:
    """Median counts per call and median per-second rates (count / seconds, per repeat)."""
    out = {}
    for name in counts[0]:
        values = [c[name] for c in counts]
        out[name] = statistics.median(values)
        if name in ("action_tokens", "context_tokens", "slots", "env_steps", "episodes"):
            rates = [v / t for v, t in zip(values, timing.times_s)]
            out[f"{name}_per_s"] = statistics.median(rates)
    return out


def time_train_step(exp: experiment_lib.Experiment, repeats: int, seed: int = 0):
    """Time `exp.train_step` (donated state fed back); returns timing and the last metrics."""
    holder = {"state": exp.init_state(jax.random.key(seed))}
    key_root = jax.random.key(seed + 1)

    def call(_):
        holder["state"], metrics = exp.train_step(holder["state"], key_root)
        return metrics

    timing, metrics = time_calls(call, repeats)
    return timing, {k: float(v) for k, v in metrics[-1].items()}


def env_throughput(env, num_envs: int, num_steps: int, repeats: int, key: jax.Array) -> dict:
    """Jitted, vmapped `reset` and `num_steps` scanned `step`s of `num_envs` episodes with
    uniformly random valid actions; returns resets/s and steps/s (medians)."""
    params = env.default_params("train")
    action_table = jnp.asarray(
        [
            list(env.action_tokens(a)) + [0] * (env.max_action_len - len(env.action_tokens(a)))
            for a in range(env.num_actions)
        ],
        jnp.int32,
    )
    action_lens = jnp.asarray([len(env.action_tokens(a)) for a in range(env.num_actions)])

    @jax.jit
    def reset(key):
        return jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, num_envs), params)

    @jax.jit
    def steps(key, state):
        def _env_step(state, k):
            keys = jax.random.split(k, num_envs)
            acts = jax.random.randint(k, (num_envs,), 0, env.num_actions)
            state, ts = jax.vmap(env.step, in_axes=(0, 0, 0, 0, None))(
                keys, state, action_table[acts], action_lens[acts], params
            )
            return state, ts.reward

        return jax.lax.scan(_env_step, state, jax.random.split(key, num_steps))

    t_reset, states = time_calls(lambda i: reset(jax.random.fold_in(key, i)), repeats)
    state0 = states[0][0]
    t_step, _ = time_calls(lambda i: steps(jax.random.fold_in(key, i), state0), repeats)
    return dict(
        num_envs=num_envs,
        num_steps=num_steps,
        reset=t_reset.as_dict(),
        step_scan=t_step.as_dict(),
        resets_per_s=num_envs / t_reset.median,
        steps_per_s=num_envs * num_steps / t_step.median,
    )
