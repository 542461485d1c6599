"""AT-GRPO (`credit.agent_turn.at_grpo`, arXiv 2510.11062): hand-derived values on alternating
guide/walker episodes, a plain-loop NumPy reference over random trajectories, the reduction to
`turn_return` with one agent, and its configuration checks."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.credit import agent_turn
from tests.credit.conftest import build_full, build_traj, episodes_traj


def _turn_adv(out, traj) -> np.ndarray:
    """f32[B, K]: the advantage on each valid turn's action tokens (checked to be constant)."""
    adv, mask, ids = (np.asarray(x) for x in (out.advantages, traj.action_mask, traj.turn_ids))
    per_turn = np.zeros(traj.turn_valid.shape, np.float64)
    for b, k in zip(*np.nonzero(np.asarray(traj.turn_valid))):
        vals = adv[b][mask[b] & (ids[b] == k)]
        assert vals.size and np.all(vals == vals[0])
        per_turn[b, k] = vals[0]
    assert np.all(adv[~mask] == 0.0)
    return per_turn


def test_at_grpo__hand_values_two_agents_one_task():
    """Two episodes of one task, guide (turns 0, 2) and walker (turn 1, 3).

    Episode 0: rewards [0, -0.1 (walker's invalid move), 0, 1.0 (goal)].
    Episode 1: rewards [-0.1 (guide's invalid message), 0, 0].
    Each agent's return counts the team reward and its own penalties only (gamma = 1):
      turn 0 (guide):  ep0 1.0 (the walker's -0.1 is not the guide's); ep1 -0.1
      turn 1 (walker): ep0 -0.1 + 1.0 = 0.9; ep1 0.0
      turn 2 (guide):  ep0 1.0; ep1 0.0
      turn 3 (walker): ep0 1.0 alone in its group -> 0
    Groups of two with "mean": A = R - mean = +-(R0 - R1) / 2.
    """
    traj = episodes_traj(
        [[0.0, -0.1, 0.0, 1.0], [-0.1, 0.0, 0.0]],
        [5, 5],
        action_valid=[[True, False, True, True], [False, True, True]],
    )
    out = agent_turn.at_grpo(traj, norm="mean")
    adv = _turn_adv(out, traj)
    expected = np.array([[0.55, 0.45, 0.5, 0.0], [-0.55, -0.45, -0.5, 0.0]])
    np.testing.assert_allclose(adv, expected, atol=1e-6)
    # "std": each group of two is +-1 / (1 + eps) scaled: (R - mean) / (|R0 - R1| / sqrt 2).
    adv = _turn_adv(agent_turn.at_grpo(traj, norm="std", eps=1e-6), traj)
    s = 1.0 / math.sqrt(2.0)
    np.testing.assert_allclose(adv[:, :3], [[s] * 3, [-s] * 3], rtol=1e-5)
    assert adv[0, 3] == 0.0


def test_at_grpo__team_coef_and_discount():
    """team_coef 0.5 scales the team reward, not the penalties; gamma discounts per turn."""
    traj = episodes_traj(
        [[0.0, 0.0, 1.0], [-0.2, 0.0, 0.0]], [0, 0], action_valid=[[1, 1, 1], [0, 1, 1]]
    )
    u = np.asarray(agent_turn.agent_rewards(traj, 2, 0.5))
    np.testing.assert_allclose(u[0], [[0, 0, 0.5], [0, 0, 0.5]])
    np.testing.assert_allclose(u[1], [[-0.2, 0, 0], [0, 0, 0]])  # the guide's own penalty
    adv = _turn_adv(agent_turn.at_grpo(traj, gamma=0.5, team_coef=0.5, norm="mean"), traj)
    # turn 0 (guide): R = 0.5 * 0.25 = 0.125 vs -0.2; turn 1 (walker): 0.25 vs 0; turn 2: 0.5 vs 0
    np.testing.assert_allclose(adv[0], [0.1625, 0.125, 0.25], atol=1e-6)
    np.testing.assert_allclose(adv[1], [-0.1625, -0.125, -0.25], atol=1e-6)


def _reference(traj, num_agents, gamma, team_coef, norm, group_by, eps):
    """Plain loops in float64: per-agent rewards, the acting agent's return, group z-scores."""
    r = np.asarray(traj.turn_rewards, np.float64)
    valid = np.asarray(traj.turn_valid)
    parsed = np.asarray(traj.turn_action_valid)
    gids = np.asarray(traj.group_ids)
    mask, ids = np.asarray(traj.action_mask), np.asarray(traj.turn_ids)
    pen = None if traj.token_penalty is None else np.asarray(traj.token_penalty, np.float64)
    batch, turns = valid.shape

    def reward(b, a, j):
        if not valid[b, j]:
            return 0.0
        own_turn = j % num_agents == a
        if not parsed[b, j]:  # the whole reward is the acting agent's penalty
            value = r[b, j] if own_turn else 0.0
        else:
            value = team_coef * r[b, j]
        if pen is not None and own_turn:
            value -= sum(pen[b, t] for t in range(mask.shape[1]) if mask[b, t] and ids[b, t] == j)
        return value

    ret = np.zeros((batch, turns))
    for b in range(batch):
        for k in range(turns):
            if valid[b, k]:
                a = k % num_agents
                ret[b, k] = sum(gamma ** (j - k) * reward(b, a, j) for j in range(k, turns))
    adv = np.zeros((batch, turns))
    for b in range(batch):
        for k in range(turns):
            if not valid[b, k]:
                continue
            members = [
                ret[c, k]
                for c in range(batch)
                if valid[c, k] and (group_by == "batch" or gids[c] == gids[b])
            ]
            if len(members) < 2:
                continue
            mean = sum(members) / len(members)
            std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
            adv[b, k] = ret[b, k] - mean
            if norm == "std":
                adv[b, k] /= std + eps
    out = np.zeros(mask.shape)
    for b in range(batch):
        for t in range(mask.shape[1]):
            if mask[b, t] and ids[b, t] >= 0:
                out[b, t] = adv[b, ids[b, t]]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "kw",
    [
        dict(num_agents=2, gamma=1.0, team_coef=1.0, norm="std", group_by="task"),
        dict(num_agents=2, gamma=0.9, team_coef=0.5, norm="mean", group_by="task"),
        dict(num_agents=3, gamma=0.8, team_coef=1.0, norm="std", group_by="batch"),
        dict(num_agents=1, gamma=1.0, team_coef=2.0, norm="mean", group_by="batch"),
    ],
    ids=["two_std", "two_mean_discounted", "three_batch", "one_agent"],
)
def test_at_grpo__matches_the_loop_reference(seed, kw):
    traj = build_full(seed, turns=4, group_size=3, extra_pad=2)
    out = agent_turn.at_grpo(traj, eps=1e-6, **kw)
    ref = _reference(traj, eps=1e-6, **kw)
    np.testing.assert_allclose(np.asarray(out.advantages), ref, rtol=2e-4, atol=2e-5)
    assert set(out.metrics) == {"agent_turn_group_size", "frac_turns_grouped", "agent_return_mean"}


def test_at_grpo__one_agent_without_penalties_is_turn_return_by_group():
    traj = build_traj(3, turns=4, group_size=4)  # every action parses, no KL
    ours = agent_turn.at_grpo(traj, num_agents=1, gamma=0.9, eps=1e-6)
    theirs = credit.get("turn_return")(traj, gamma=0.9, norm="group", eps=1e-6)
    np.testing.assert_allclose(
        np.asarray(ours.advantages), np.asarray(theirs.advantages), rtol=1e-6, atol=1e-7
    )


def test_at_grpo__registered_with_groups_and_checked():
    assert "at_grpo" in credit.names()
    assert credit.requires_groups("at_grpo") and not credit.requires_values("at_grpo")
    assert credit.defaults("at_grpo")["num_agents"] == 2
    with pytest.raises(ValueError, match=r"credit.at_grpo: num_agents=0; allowed: a whole"):
        credit.validate("at_grpo", {"num_agents": 0})
    with pytest.raises(ValueError, match=r"credit.at_grpo: unknown group_by 'agent'; allowed"):
        credit.validate("at_grpo", {"group_by": "agent"})
    with pytest.raises(ValueError, match=r"credit.at_grpo: gamma=1.5"):
        credit.validate("at_grpo", {"gamma": 1.5})


def test_at_grpo__no_advantage_outside_action_tokens_and_jit_safe():
    import jax

    traj = build_full(1, turns=3)
    out = jax.jit(lambda t: agent_turn.at_grpo(t))(traj)
    assert np.all(np.asarray(out.advantages)[~np.asarray(traj.action_mask)] == 0.0)
    assert jnp.isfinite(out.advantages).all()
