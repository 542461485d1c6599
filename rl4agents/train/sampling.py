"""Which episodes a step trains on, and their rewards.

Reward shaping (DAPO's overlong penalty, `shape_rewards`), DAPO dynamic sampling (rollouts
refilled with informative groups, `dynamic_rollout`, `informative_groups`), episode filters
(`EPISODE_FILTERS`: SimpleTIR's void-turn filter, RAGEN-2's top-p reward-variance filter,
applied by `filter_episodes`) and ReMax's greedy baseline (`greedy_baseline`). Each takes the
step's `StepConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common as credit_common
from rl4agents.losses import shaping
from rl4agents.registry import Registry
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


# Episode filters: `fn(traj, group_size, *, <hparams>) -> bool[B]`, the episodes the update
# keeps (config `sampling.filter`, hyperparameters `sampling.<name>.*`).
EPISODE_FILTERS = Registry("episode filter")


@EPISODE_FILTERS.register("void_turn")
def void_turn(traj: Trajectory, group_size: int) -> jax.Array:
    """SimpleTIR's filter (arXiv 2509.02479): drop every episode with a void turn.

    A void turn is a turn that happened (`turn_valid`) in which the policy produced neither a
    valid action nor an answer: the environment did not accept its text as an action
    (`~turn_action_valid`; an answer is an action in every environment here). An episode
    with one leaves the update whole: `keep_b = ~any_k(turn_valid_bk & ~turn_action_valid_bk)`.

    Args:
      traj: B episodes.
      group_size: G (unused: the filter reads each episode alone).

    Returns:
      bool[B] the episodes kept.
    """
    del group_size
    void = traj.turn_valid & ~traj.turn_action_valid
    return ~jnp.any(void, axis=1)


@EPISODE_FILTERS.register("top_p_variance")
def top_p_variance(traj: Trajectory, group_size: int, *, p: float = 0.9) -> jax.Array:
    """RAGEN-2's reward-variance top-p filter (arXiv 2604.06268): keep the groups of highest
    reward variance until they hold a fraction `p` of the batch's total.

    With `v_g` the (population) variance of the outcome rewards of task group g, the groups
    sorted by decreasing `v_g` (ties in task order), and `C_j` the sum of the `v` of the
    groups sorted before group j, group j is kept iff `C_j < p sum_g v_g`: the shortest
    prefix whose variance reaches `p` of the total. When every group has variance 0, every
    group is kept. With `p = 1` every group with `v_g > 0` is kept (DAPO's filter without
    the refill).

    Args:
      traj: B = N x G episodes, the G samples of a task contiguous.
      group_size: G.
      p: the fraction of the total variance to keep, in (0, 1] (RAGEN-2's default 0.9).

    Returns:
      bool[B] the episodes kept (whole groups).
    """
    check_range("p", p, 0.0, 1.0, low_open=True)
    r = traj.outcome_reward.reshape(-1, group_size).astype(jnp.float32)
    var = jnp.var(r, axis=1)
    order = jnp.argsort(-var, stable=True)
    ranked = var[order]
    before = jnp.cumsum(ranked) - ranked
    total = jnp.sum(var)
    keep_ranked = (before < p * total) | (total <= 0)
    keep = jnp.zeros_like(keep_ranked).at[order].set(keep_ranked)
    return jnp.repeat(keep, group_size)


def validate_filter(name: str, hparams: dict | None, group_size: int) -> dict:
    """Check `hparams` for episode filter `name`; return them merged with the defaults.

    Raises:
      KeyError: unknown `name`.
      ValueError: an unknown field, or a value the filter refuses ("sampling.top_p_variance:
        p=0.0; allowed: in (0, 1]"), found by tracing it once on an abstract batch.
    """
    bound = EPISODE_FILTERS.validate(name, hparams)
    b, k = 2 * group_size, 1
    f32, i32, flag = jnp.float32, jnp.int32, jnp.bool_
    probe = Trajectory(
        tokens=jax.ShapeDtypeStruct((b, 1), i32),
        valid_mask=jax.ShapeDtypeStruct((b, 1), flag),
        action_mask=jax.ShapeDtypeStruct((b, 1), flag),
        obs_mask=jax.ShapeDtypeStruct((b, 1), flag),
        turn_ids=jax.ShapeDtypeStruct((b, 1), i32),
        turn_end=jax.ShapeDtypeStruct((b, k), i32),
        logp_behavior=jax.ShapeDtypeStruct((b, 1), f32),
        turn_rewards=jax.ShapeDtypeStruct((b, k), f32),
        turn_valid=jax.ShapeDtypeStruct((b, k), flag),
        turn_action_valid=jax.ShapeDtypeStruct((b, k), flag),
        anchors=jax.ShapeDtypeStruct((b, k), jnp.uint32),
        outcome_reward=jax.ShapeDtypeStruct((b,), f32),
        success=jax.ShapeDtypeStruct((b,), flag),
        done=jax.ShapeDtypeStruct((b,), flag),
        truncated=jax.ShapeDtypeStruct((b,), flag),
        group_ids=jax.ShapeDtypeStruct((b,), i32),
        num_turns=jax.ShapeDtypeStruct((b,), i32),
    )
    try:
        jax.eval_shape(lambda t: EPISODE_FILTERS.get(name)(t, group_size, **bound), probe)
    except ValueError as e:
        raise ValueError(f"sampling.{name}: {e}") from e
    return bound


def filter_episodes(traj: Trajectory, cfg: StepConfig) -> tuple[Trajectory, dict[str, jax.Array]]:
    """Apply the step's episode filter (`cfg.sampling.filter_fn`, bound to its
    hyperparameters): a dropped episode keeps its rewards but loses its action and
    observation tokens and its turns (`turn_valid`), so, like a slot dynamic sampling left
    empty, it is in no group or step statistic (`credit.common.trainable_episodes`) and adds
    nothing to any loss term (policy, entropy, KL, value, ECHO).

    Returns:
      (the filtered Trajectory, {"filter/kept_frac": f32[] share of episodes kept}).
    """
    keep = cfg.sampling.filter_fn(traj, cfg.rollout.group_size)
    rows = keep[:, None]
    traj = traj.replace(
        action_mask=traj.action_mask & rows,
        obs_mask=traj.obs_mask & rows,
        turn_valid=traj.turn_valid & rows,
    )
    return traj, {"filter/kept_frac": jnp.mean(keep.astype(jnp.float32))}


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
