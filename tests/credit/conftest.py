"""Synthetic `Trajectory` builders for credit tests (NumPy, slot layout of `rl4agents.types`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

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
) -> Trajectory:
    """Random episodes in the slot layout: P prompt slots, then K x (A action + O obs) slots.

    Each episode uses a random prefix of the prompt block, 1..K turns, 1..A action tokens and
    0..O observation tokens per turn; unused slots are padding (so padding sits between turns),
    and `extra_pad` pad slots are appended at the end. Random draws do not depend on
    `extra_pad`, so the same seed gives the same episodes.
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
    rewards = np.where(turn_valid, rewards, 0.0).astype(np.float32)
    pad = np.zeros((batch, extra_pad), bool)
    valid, action, obs_mask = (np.concatenate([x, pad], 1) for x in (valid, action, obs_mask))
    turn_ids = np.concatenate([turn_ids, -np.ones((batch, extra_pad), np.int32)], 1)
    tokens = np.where(valid, rng.integers(1, 100, size=valid.shape), 0).astype(np.int32)
    logp = np.where(action, -rng.random(valid.shape), 0.0).astype(np.float32)
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
        turn_action_valid=jnp.asarray(turn_valid),
        anchors=jnp.zeros((batch, turns), jnp.uint32),
        outcome_reward=jnp.asarray(rewards.sum(1)),
        success=jnp.asarray(rewards.sum(1) > 0),
        done=jnp.asarray(num_turns < turns),
        truncated=jnp.asarray(num_turns == turns),
        group_ids=jnp.asarray(
            np.repeat(np.arange(num_groups) + group_id_offset, group_size), jnp.int32
        ),
        num_turns=jnp.asarray(num_turns.astype(np.int32)),
    )


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
