"""Synthetic `Trajectory` builders for credit tests (NumPy, slot layout of `rl4agents.types`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.types import Trajectory


def build_traj(
    seed: int = 0,
    num_groups: int = 3,
    group_size: int = 4,
    prompt: int = 3,
    turns: int = 3,
    act: int = 3,
    obs: int = 2,
    extra_pad: int = 0,
    group_id_offset: int = 0,
    *,
    anchor_pool: int = 0,
    invalid_prob: float = 0.0,
    entropy: bool = False,
    baseline: bool = False,
    penalty: bool = False,
    empty: Sequence[int] = (),
) -> Trajectory:
    """Random episodes in the slot layout: P prompt slots, then K x (A action + O obs) slots.

    Each episode uses a random prefix of the prompt block, 1..K turns, 1..A action tokens and
    0..O observation tokens per turn; unused slots are padding (so padding sits between turns),
    and `extra_pad` pad slots are appended at the end. Random draws do not depend on
    `extra_pad`, so the same seed gives the same episodes.

    Optional extras come from a second generator, so they do not change the draws above:
      anchor_pool: if > 0, anchors of *all* K turns (also the turns that did not happen, which
        estimators must ignore) are drawn from `1..anchor_pool`, so step groups of size > 1
        exist; 0 keeps all anchors 0.
      invalid_prob: probability that a valid turn's action did not parse.
      entropy: random positive `entropy_behavior` on action slots (0 elsewhere).
      baseline: random `baseline_reward f32[B]`.
      penalty: random positive `token_penalty` on action slots (0 elsewhere).
      empty: episodes that took no turn (no action tokens, outcome 0).
    """
    rng = np.random.default_rng(seed)
    batch = num_groups * group_size
    slots = prompt + turns * (act + obs)
    valid = np.zeros((batch, slots), bool)
    action = np.zeros((batch, slots), bool)
    obs_mask = np.zeros((batch, slots), bool)
    turn_ids = -np.ones((batch, slots), np.int32)
    turn_end = -np.ones((batch, turns), np.int32)
    turn_valid = np.zeros((batch, turns), bool)
    num_turns = rng.integers(1, turns + 1, size=batch)
    rewards = rng.normal(size=(batch, turns)).astype(np.float32)
    for b in range(batch):
        p = rng.integers(1, prompt + 1)
        valid[b, :p] = obs_mask[b, :p] = True
        for k in range(num_turns[b]):
            start = prompt + k * (act + obs)
            a, o = rng.integers(1, act + 1), rng.integers(0, obs + 1)
            valid[b, start : start + a] = action[b, start : start + a] = True
            valid[b, start + act : start + act + o] = obs_mask[b, start + act : start + act + o] = (
                True
            )
            turn_ids[b, start : start + a] = k
            turn_ids[b, start + act : start + act + o] = k
            turn_end[b, k] = start + a - 1
            turn_valid[b, k] = True
    for b in empty:
        valid[b, prompt:] = action[b] = obs_mask[b, prompt:] = False
        turn_ids[b], turn_end[b], turn_valid[b], num_turns[b] = -1, -1, False, 0
    rewards = np.where(turn_valid, rewards, 0.0).astype(np.float32)

    extra = np.random.default_rng([seed, 1])
    anchors = extra.integers(1, max(anchor_pool, 1) + 1, size=(batch, turns))
    anchors = (anchors if anchor_pool > 0 else np.zeros_like(anchors)).astype(np.uint32)
    action_valid = turn_valid & (extra.random((batch, turns)) >= invalid_prob)
    entropy_slots = np.where(action, extra.uniform(0.1, 3.0, size=action.shape), 0.0)
    baseline_reward = extra.normal(size=batch)
    penalty_slots = np.where(action, extra.uniform(0.0, 0.2, size=action.shape), 0.0)

    pad = np.zeros((batch, extra_pad), bool)
    valid, action, obs_mask = (np.concatenate([x, pad], 1) for x in (valid, action, obs_mask))
    turn_ids = np.concatenate([turn_ids, -np.ones((batch, extra_pad), np.int32)], 1)
    tokens = np.where(valid, rng.integers(1, 100, size=valid.shape), 0).astype(np.int32)
    logp = np.where(action, -rng.random(valid.shape), 0.0).astype(np.float32)

    def padded(x):
        return jnp.asarray(np.pad(x, ((0, 0), (0, extra_pad))), jnp.float32)

    return Trajectory(
        tokens=jnp.asarray(tokens),
        valid_mask=jnp.asarray(valid),
        action_mask=jnp.asarray(action),
        obs_mask=jnp.asarray(obs_mask),
        turn_ids=jnp.asarray(turn_ids),
        turn_end=jnp.asarray(turn_end),
        logp_behavior=jnp.asarray(logp),
        turn_rewards=jnp.asarray(rewards),
        turn_valid=jnp.asarray(turn_valid),
        turn_action_valid=jnp.asarray(action_valid),
        anchors=jnp.asarray(anchors),
        outcome_reward=jnp.asarray(rewards.sum(1)),
        success=jnp.asarray(rewards.sum(1) > 0),
        done=jnp.asarray(num_turns < turns),
        truncated=jnp.asarray(num_turns == turns),
        group_ids=jnp.asarray(
            np.repeat(np.arange(num_groups) + group_id_offset, group_size), jnp.int32
        ),
        num_turns=jnp.asarray(num_turns.astype(np.int32)),
        entropy_behavior=padded(entropy_slots) if entropy else None,
        baseline_reward=jnp.asarray(baseline_reward, jnp.float32) if baseline else None,
        token_penalty=padded(penalty_slots) if penalty else None,
    )


def build_full(seed: int = 0, extra_pad: int = 0, **kwargs) -> Trajectory:
    """`build_traj` with every optional input filled and step groups of size > 1."""
    options = dict(anchor_pool=3, invalid_prob=0.3, entropy=True, baseline=True, penalty=True)
    return build_traj(seed, extra_pad=extra_pad, **{**options, **kwargs})


def episodes_traj(
    turn_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[int],
    *,
    act: int = 2,
    obs: int = 1,
    outcome: Sequence[float] | None = None,
    anchors: Sequence[Sequence[int]] | None = None,
    action_valid: Sequence[Sequence[bool]] | None = None,
    entropy: Sequence[Sequence[float]] | None = None,
    baseline: Sequence[float] | None = None,
) -> Trajectory:
    """Hand-written episodes: one prompt slot, then K x (`act` action + `obs` obs) slots.

    Episode b takes `len(turn_rewards[b])` turns (0 = empty response); every turn uses all
    `act` action slots, so turn k of any episode occupies slots `1 + k (act + obs) + [0, act)`.
    `outcome` defaults to the sum of turn rewards; per-turn `anchors` default to 0,
    `action_valid` to True, `entropy` (one value per turn, on all its action slots) to None.
    """
    batch = len(turn_rewards)
    turns = max(1, max(len(r) for r in turn_rewards))
    slots = 1 + turns * (act + obs)
    action = np.zeros((batch, slots), bool)
    obs_mask = np.zeros((batch, slots), bool)
    obs_mask[:, 0] = True
    turn_ids = -np.ones((batch, slots), np.int32)
    turn_end = -np.ones((batch, turns), np.int32)
    turn_valid = np.zeros((batch, turns), bool)
    rewards = np.zeros((batch, turns), np.float32)
    anchor = np.zeros((batch, turns), np.uint32)
    parsed = np.zeros((batch, turns), bool)
    ent = np.zeros((batch, slots), np.float32)
    for b, episode in enumerate(turn_rewards):
        for k, r in enumerate(episode):
            start = 1 + k * (act + obs)
            action[b, start : start + act] = True
            obs_mask[b, start + act : start + act + obs] = True
            turn_ids[b, start : start + act + obs] = k
            turn_end[b, k] = start + act - 1
            turn_valid[b, k] = True
            rewards[b, k] = r
            anchor[b, k] = 0 if anchors is None else anchors[b][k]
            parsed[b, k] = True if action_valid is None else action_valid[b][k]
            if entropy is not None:
                ent[b, start : start + act] = entropy[b][k]
    scores = rewards.sum(1) if outcome is None else np.asarray(outcome, np.float32)
    num_turns = turn_valid.sum(1).astype(np.int32)
    tokens = np.where(action | obs_mask, 7, 0).astype(np.int32)
    return Trajectory(
        tokens=jnp.asarray(tokens),
        valid_mask=jnp.asarray(action | obs_mask),
        action_mask=jnp.asarray(action),
        obs_mask=jnp.asarray(obs_mask),
        turn_ids=jnp.asarray(turn_ids),
        turn_end=jnp.asarray(turn_end),
        logp_behavior=jnp.asarray(np.where(action, -0.5, 0.0).astype(np.float32)),
        turn_rewards=jnp.asarray(rewards),
        turn_valid=jnp.asarray(turn_valid),
        turn_action_valid=jnp.asarray(parsed),
        anchors=jnp.asarray(anchor),
        outcome_reward=jnp.asarray(scores, jnp.float32),
        success=jnp.asarray(scores > 0),
        done=jnp.asarray(num_turns < turns),
        truncated=jnp.asarray(num_turns == turns),
        group_ids=jnp.asarray(group_ids, jnp.int32),
        num_turns=jnp.asarray(num_turns),
        entropy_behavior=None if entropy is None else jnp.asarray(ent),
        baseline_reward=None if baseline is None else jnp.asarray(baseline, jnp.float32),
    )


def per_turn(traj: Trajectory, tokens) -> np.ndarray:
    """f64[B, K] the value each turn's action tokens hold (NaN for turns without tokens).

    Asserts that the value is constant over the turn's action tokens and exactly 0 off
    `action_mask`, i.e. that `tokens f32[B, T]` is a per-turn broadcast.
    """
    x = np.asarray(tokens, np.float64)
    mask, ids = np.asarray(traj.action_mask), np.asarray(traj.turn_ids)
    np.testing.assert_array_equal(x[~mask], 0.0)
    out = np.full(traj.turn_valid.shape, np.nan)
    for b, k in np.ndindex(out.shape):
        vals = x[b][mask[b] & (ids[b] == k)]
        if vals.size:
            np.testing.assert_allclose(vals, vals[0], rtol=1e-6, atol=1e-7)
            out[b, k] = vals[0]
    return out


def with_outcome(traj: Trajectory, scores, group_ids) -> Trajectory:
    """Replace the per-episode scores and group ids (batch size must match)."""
    return traj.replace(
        outcome_reward=jnp.asarray(scores, jnp.float32),
        group_ids=jnp.asarray(group_ids, jnp.int32),
    )


@pytest.fixture
def make_traj():
    return build_traj


@pytest.fixture
def set_outcome():
    return with_outcome


SPARSE_GROUPS = (40, 40, 40, 3, 3, 3, 3, 1000, 17, 17, 17, 17)  # one singleton (1000)


def regroup(traj: Trajectory, group_ids: Sequence[int] = SPARSE_GROUPS) -> Trajectory:
    """Replace the group ids (sparse, non-contiguous values with a singleton by default)."""
    return traj.replace(group_ids=jnp.asarray(group_ids, jnp.int32))


@functools.cache
def _jitted(name: str, hparams: tuple) -> Callable:
    return jax.jit(functools.partial(credit.get(name), **dict(hparams)))


def run_credit(name: str, traj: Trajectory, values=None, **hparams):
    """Call credit function `name` under a cached jit (one compile per name, hparams, shape)."""
    return _jitted(name, tuple(sorted(hparams.items())))(traj, values)
