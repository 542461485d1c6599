"""Token-level GAE (ppo_gae) and masked_whiten: hand cases and a NumPy loop reference (3.1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.credit import common
from rl4agents.credit.token import ppo_gae

RTOL, ATOL = 1e-5, 1e-6
ACTION_SLOTS = [1, 2, 5, 6]
_gae = jax.jit(ppo_gae, static_argnames=("whiten", "reward_placement"))


def _hand_traj(make_traj, turn_rewards):
    """One episode, T = 9: [prompt, a, a, pad, obs, a, a, pad, obs]; turns end at slots 2, 6."""
    traj = make_traj(num_groups=1, group_size=1, prompt=1, turns=2, act=3, obs=1)
    action = np.zeros((1, 9), bool)
    action[0, ACTION_SLOTS] = True
    obs = np.zeros((1, 9), bool)
    obs[0, [0, 4, 8]] = True
    return traj.replace(
        action_mask=jnp.asarray(action),
        obs_mask=jnp.asarray(obs),
        valid_mask=jnp.asarray(action | obs),
        turn_end=jnp.asarray([[2, 6]], jnp.int32),
        turn_valid=jnp.asarray([[True, True]]),
        turn_rewards=jnp.asarray([turn_rewards], jnp.float32),
        outcome_reward=jnp.asarray([sum(turn_rewards)], jnp.float32),
    )


def _hand_values():
    values = np.full((1, 9), 9.0, np.float32)  # junk off the action slots must be ignored
    values[0, ACTION_SLOTS] = [0.5, 0.6, 0.7, 0.8]
    return jnp.asarray(values)


@pytest.mark.parametrize(
    "gamma, lam, adv, ret",
    [
        # gamma = lam = 1: A_t = (sum of later rewards) - V_t, returns = 1
        (1.0, 1.0, [0.5, 0.4, 0.3, 0.2], [1.0, 1.0, 1.0, 1.0]),
        # gamma = lam = .5, right to left over action tokens only:
        # slot 6: d = 1 - .8 = .2, A = .2
        # slot 5: d = .5*.8 - .7 = -.3, A = -.3 + .25*.2 = -.25
        # slot 2: d = .5*.7 - .6 = -.25, A = -.25 + .25*(-.25) = -.3125
        # slot 1: d = .5*.6 - .5 = -.2, A = -.2 + .25*(-.3125) = -.278125
        (0.5, 0.5, [-0.278125, -0.3125, -0.25, 0.2], [0.221875, 0.2875, 0.45, 1.0]),
    ],
)
def test_ppo_gae__hand_skips_obs_and_pad(make_traj, gamma, lam, adv, ret):
    traj = _hand_traj(make_traj, [0.0, 1.0])
    out = _gae(traj, _hand_values(), gamma=gamma, lam=lam, whiten=False)
    want_adv, want_ret = np.zeros((1, 9)), np.zeros((1, 9))
    want_adv[0, ACTION_SLOTS], want_ret[0, ACTION_SLOTS] = adv, ret
    np.testing.assert_allclose(np.asarray(out.advantages), want_adv, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(out.returns), want_ret, rtol=RTOL, atol=ATOL)


def test_ppo_gae__reward_placement(make_traj):
    traj = _hand_traj(make_traj, [0.5, 1.0])
    values = _hand_values()
    # "turn": .5 at slot 2, 1 at slot 6 -> A = [1.5-.5, 1.5-.6, 1-.7, 1-.8]
    turn = _gae(traj, values, whiten=False).advantages[0, jnp.array(ACTION_SLOTS)]
    np.testing.assert_allclose(np.asarray(turn), [1.0, 0.9, 0.3, 0.2], rtol=RTOL, atol=ATOL)
    # "outcome": 1.5 at slot 6 -> A = 1.5 - V
    out = _gae(traj, values, whiten=False, reward_placement="outcome")
    got = np.asarray(out.advantages[0, jnp.array(ACTION_SLOTS)])
    np.testing.assert_allclose(got, [1.0, 0.9, 0.8, 0.7], rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="allowed"):
        ppo_gae(traj, values, reward_placement="token")
    with pytest.raises(ValueError, match="values"):
        ppo_gae(traj, None)


def test_masked_whiten__hand():
    # masked [1, 2, 3]: mean 2, unbiased var 1 -> [-1, 0, 1]; off-mask 100 -> 98
    x = jnp.asarray([1.0, 2.0, 3.0, 100.0])
    mask = jnp.asarray([True, True, True, False])
    np.testing.assert_allclose(
        np.asarray(common.masked_whiten(x, mask)), [-1, 0, 1, 98], rtol=RTOL, atol=ATOL
    )
    np.testing.assert_allclose(
        np.asarray(common.masked_whiten(x, mask, shift_mean=False)), [1, 2, 3, 100], rtol=RTOL
    )
    single = common.masked_whiten(x, jnp.asarray([False, True, False, False]))
    assert np.all(np.isfinite(np.asarray(single))) and float(single[1]) == 0.0


def _token_rewards_loop(traj, placement):
    turn_end, valid = np.asarray(traj.turn_end), np.asarray(traj.turn_valid)
    rewards = np.zeros(traj.tokens.shape)
    for b in range(rewards.shape[0]):
        ends = [k for k in range(turn_end.shape[1]) if valid[b, k] and turn_end[b, k] >= 0]
        if placement == "turn":
            for k in ends:
                rewards[b, turn_end[b, k]] += float(traj.turn_rewards[b, k])
        elif ends:
            rewards[b, turn_end[b, ends[-1]]] += float(traj.outcome_reward[b])
    return rewards


def _gae_loop(traj, values, gamma, lam, whiten, placement):
    """Token-by-token GAE over the action tokens of each episode (docs/methods.md, `ppo_gae`)."""
    mask, values = np.asarray(traj.action_mask), np.asarray(values, np.float64)
    rewards = _token_rewards_loop(traj, placement)
    adv = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        next_v, gae = 0.0, 0.0
        for t in reversed([t for t in range(mask.shape[1]) if mask[b, t]]):
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            gae = delta + gamma * lam * gae
            next_v = values[b, t]
            adv[b, t] = gae
    returns = (adv + values) * mask
    if whiten:
        xs = [adv[b, t] for b, t in zip(*np.nonzero(mask), strict=True)]
        n = len(xs)
        mean = sum(xs) / (n + 1e-8)
        var = sum((x - mean) ** 2 for x in xs) / (n + 1e-8) * n / (n - 1)
        adv = (adv - mean) / np.sqrt(var + 1e-8) * mask
    return adv, returns


@pytest.mark.parametrize(
    "gamma, lam, whiten, placement",
    [(1.0, 1.0, True, "turn"), (0.9, 0.8, False, "turn"), (0.95, 0.7, True, "outcome")],
)
def test_ppo_gae__matches_loop_reference(make_traj, gamma, lam, whiten, placement):
    traj = make_traj(seed=3, num_groups=2, group_size=3, turns=3, act=3, obs=2)
    values = np.random.default_rng(4).normal(size=traj.tokens.shape).astype(np.float32)
    out = _gae(
        traj, jnp.asarray(values), gamma=gamma, lam=lam, whiten=whiten, reward_placement=placement
    )
    want_adv, want_ret = _gae_loop(traj, values, gamma, lam, whiten, placement)
    np.testing.assert_allclose(np.asarray(out.advantages), want_adv, rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.returns), want_ret, rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("fill", [np.nan, np.inf, 1e30])
def test_ppo_gae__values_off_the_action_mask_are_ignored(make_traj, fill):
    # Observation and padding slots carry no value the advantage may read: any fill there,
    # NaN included, gives the advantages and (on the mask) returns of a zero fill.
    traj = make_traj(seed=3, num_groups=2, group_size=3, turns=3, act=3, obs=2)
    mask = np.asarray(traj.action_mask)
    values = np.random.default_rng(4).normal(size=mask.shape).astype(np.float32)
    want = _gae(traj, jnp.asarray(np.where(mask, values, 0.0)), gamma=0.9, lam=0.8)
    got = _gae(traj, jnp.asarray(np.where(mask, values, fill)), gamma=0.9, lam=0.8)
    np.testing.assert_array_equal(np.asarray(got.advantages), np.asarray(want.advantages))
    np.testing.assert_array_equal(np.asarray(got.returns) * mask, np.asarray(want.returns) * mask)
