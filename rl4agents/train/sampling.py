"""Which episodes a step trains on, and their rewards.

Reward shaping (DAPO's overlong penalty, `shape_rewards`), DAPO dynamic sampling (rollouts
refilled with informative groups, `dynamic_rollout`, `informative_groups`) and ReMax's
greedy baseline (`greedy_baseline`). Each takes the step's `StepConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.credit import common as credit_common
from rl4agents.losses import shaping
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.types import Trajectory

if TYPE_CHECKING:
    from rl4agents.train.step import StepConfig


def shape_rewards(traj: Trajectory, cfg: StepConfig) -> Trajectory:
    """DAPO overlong penalty on each turn's (or each episode's) number of action tokens.

    "turn": `turn_rewards[b, k] += overlong_penalty(len_k, A, buffer, factor)`; "episode": the
    penalty of the episode's total action tokens against `K * A` is added to its last turn.
    `outcome_reward` is recomputed as the sum of turn rewards. Identity when the buffer is 0.
    """
    sh = cfg.shaping
    if sh.overlong_buffer <= 0:
        return traj
    lay = cfg.layout
    _, count, _ = credit_common.turn_token_stats(jnp.zeros(traj.tokens.shape), traj)
    if sh.overlong_per == "turn":
        pen = shaping.overlong_penalty(count, lay.action, sh.overlong_buffer, sh.overlong_factor)
        pen = jnp.where(traj.turn_valid, pen, 0.0)
    else:
        total = jnp.sum(count, axis=1)
        pen_ep = shaping.overlong_penalty(
            total, lay.turns * lay.action, sh.overlong_buffer, sh.overlong_factor
        )
        last = jnp.arange(traj.max_turns)[None, :] == (traj.num_turns[:, None] - 1)
        pen = jnp.where(last & traj.turn_valid, pen_ep[:, None], 0.0)
    rewards = traj.turn_rewards + pen
    return traj.replace(turn_rewards=rewards, outcome_reward=rewards.sum(axis=1))


def informative_groups(traj: Trajectory, group_size: int) -> jax.Array:
    """bool[num_tasks]: the group's episode rewards are not all equal (DAPO's filter)."""
    r = traj.outcome_reward.reshape(-1, group_size)
    return ~jnp.all(r == r[:, :1], axis=1)


def _group_scatter(buf, new, dest, group_size):
    """Write the groups of `new` to group slots `dest` of `buf` (out-of-range dest: dropped)."""

    def put(b, n):
        if b is None:
            return None
        shape = (-1, group_size) + b.shape[1:]
        out = b.reshape(shape).at[dest].set(n.reshape(shape), mode="drop")
        return out.reshape(b.shape)

    return jax.tree.map(put, buf, new, is_leaf=lambda x: x is None)


def dynamic_rollout(key, params, cfg: StepConfig, shard_fn):
    """DAPO dynamic sampling: roll out batches until `num_tasks` informative groups are found
    (or `max_gen_batches` batches), keeping only groups whose rewards are not all equal.

    Inside one `lax.while_loop`: batch i uses `fold_in(key, i)`; its informative groups fill
    the next free group slots in order. Slots still free at the end hold empty episodes (no
    action tokens), which add nothing to any loss (DAPO raises instead; a jitted step cannot).
    A group left out (all rewards equal) takes its KL and ECHO terms with it, as in DAPO;
    without dynamic sampling nothing filters on advantages, so a group whose advantages are
    all 0 still trains its KL and ECHO terms.

    Returns:
      (Trajectory with group ids 0..num_tasks-1, metrics: `ds/gen_batches`,
      `ds/filled_frac`, and reward/success over every generated episode).
    """
    rc, g = cfg.rollout, cfg.rollout.group_size
    n = rc.num_tasks

    def gen(i):
        traj = rollout_lib.rollout(
            jax.random.fold_in(key, i),
            cfg.graphdef,
            params,
            cfg.env,
            cfg.env_params,
            rc,
            shard_fn=shard_fn,
        )
        return shape_rewards(traj, cfg)

    shapes = jax.eval_shape(gen, 0)
    empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    empty = empty.replace(
        turn_end=jnp.full(shapes.turn_end.shape, -1, jnp.int32),
        turn_ids=jnp.full(shapes.turn_ids.shape, -1, jnp.int32),
        truncated=jnp.ones(shapes.truncated.shape, bool),
    )

    def cond(carry):
        i, _, filled, _ = carry
        return (filled < n) & (i < cfg.sampling.max_gen_batches)

    def body(carry):
        i, buf, filled, sums = carry
        traj = gen(i)
        ok = informative_groups(traj, g)
        dest = jnp.where(ok, filled + jnp.cumsum(ok) - 1, n)
        buf = _group_scatter(buf, traj, dest, g)
        sums = sums + jnp.stack([traj.outcome_reward.sum(), traj.success.sum(), 1.0 * ok.sum()])
        return i + 1, buf, jnp.minimum(filled + ok.sum(), n), sums

    init = (jnp.zeros((), jnp.int32), empty, jnp.zeros((), jnp.int32), jnp.zeros(3))
    i, traj, filled, sums = jax.lax.while_loop(cond, body, init)
    b = rc.batch_size
    traj = traj.replace(group_ids=jnp.arange(b, dtype=jnp.int32) // g)
    generated = (i * b).astype(jnp.float32)
    metrics = {
        "ds/gen_batches": i.astype(jnp.float32),
        "ds/filled_frac": filled / n,
        "ds/informative_frac": sums[2] / (i * n),
        "reward_all": sums[0] / generated,
        "success_all": sums[1] / generated,
    }
    return traj, metrics


def greedy_baseline(key, params, traj: Trajectory, cfg: StepConfig, shard_fn) -> Trajectory:
    """Add ReMax's baseline: the score of one greedy episode on each episode's task."""
    rc = dataclasses.replace(cfg.rollout, group_size=1, greedy=True)
    greedy = rollout_lib.rollout(
        jax.random.fold_in(key, 1),
        cfg.graphdef,
        params,
        cfg.env,
        cfg.env_params,
        rc,
        task_keys=rollout_lib.default_task_keys(key, cfg.rollout.num_tasks),
        shard_fn=shard_fn,
    )
    greedy = shape_rewards(greedy, cfg)
    return traj.replace(baseline_reward=greedy.outcome_reward[traj.group_ids])
