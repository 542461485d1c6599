"""Turn-level critic estimators: turn_gae (RAGEN bi-level GAE, 3.4) and step_gae (StepPO, 3.5)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from tests.credit import reference as ref
from tests.credit.conftest import build_full, episodes_traj, per_turn, regroup, run_credit

RTOL, ATOL = 1e-5, 1e-5
SLOTS = [1, 2, 4, 5]  # action slots of a two-turn `episodes_traj` episode (act=2, obs=1)


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL)


def _values(traj, seed):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=traj.tokens.shape).astype(np.float32))


def _hand_values(on_slots, junk=9.0):
    values = np.full((1, 7), junk, np.float32)  # junk off the action slots must be ignored
    values[0, SLOTS] = on_slots
    return jnp.asarray(values)


# ------------------------------------------------------------------------------- turn_gae


def test_turn_gae__zero_reward_turn_is_not_merged():
    # turn rewards [0, 1]; V on slots 1, 2 | 4, 5 = .1, .2 | .3, .4; turn ends e0 = 2, e1 = 5;
    # gamma = lam = 1, turn_gamma = .5.
    # high level: k1: d = 1 - .4 = .6, A = .6, R1 = 1.0;
    #             k0: d = 0 + .5 * .4 - .2 = 0, A = 0 + .5 * .6 = .3, R0 = .3 + .2 = .5.
    # low level (restart at each turn end):
    #   5: 1.0 - .4 = .6;  4: 0 + .4 - .3 = .1, A = .7;
    #   2: .5 - .2 = .3;   1: 0 + .2 - .1 = .1, A = .4.
    # RAGEN's pinned code finds turn ends as reward != 0, so it would merge turn 0 into turn 1
    # and give [.9, .8, .7, .6].
    traj = episodes_traj([[0.0, 1.0]], [0])
    out = run_credit(
        "turn_gae", traj, _hand_values([0.1, 0.2, 0.3, 0.4]), turn_gamma=0.5, whiten=False
    )
    _close(np.asarray(out.advantages)[0, SLOTS], [0.4, 0.3, 0.7, 0.6])
    _close(np.asarray(out.returns)[0, SLOTS], [0.5, 0.5, 1.0, 1.0])


def test_turn_gae__hand_discounted():
    # turn rewards [.5, 1]; V = .1, .2 | .3, .4; gamma = .5, lam = .5, turn_gamma = .8.
    # high: k1: d = 1 - .4 = .6, A = .6, R1 = 1.0;
    #       k0: d = .5 + .8 * .4 - .2 = .62, A = .62 + .8 * .5 * .6 = .86, R0 = 1.06.
    # low: 5: 1.0 - .4 = .6; 4: .5 * .4 - .3 = -.1, A = -.1 + .25 * .6 = .05;
    #      2: 1.06 - .2 = .86; 1: .5 * .2 - .1 = 0, A = 0 + .25 * .86 = .215.
    traj = episodes_traj([[0.5, 1.0]], [0])
    values = _hand_values([0.1, 0.2, 0.3, 0.4])
    out = run_credit("turn_gae", traj, values, gamma=0.5, lam=0.5, turn_gamma=0.8, whiten=False)
    _close(np.asarray(out.advantages)[0, SLOTS], [0.215, 0.86, 0.05, 0.6])
    _close(np.asarray(out.returns)[0, SLOTS], [0.315, 1.06, 0.35, 1.0])
    # whitened: batch-global over the 4 action tokens (unbiased variance)
    adv = np.array([0.215, 0.86, 0.05, 0.6])
    want = (adv - adv.mean()) / math.sqrt(adv.var(ddof=1) + 1e-8)
    out = run_credit("turn_gae", traj, values, gamma=0.5, lam=0.5, turn_gamma=0.8)
    _close(np.asarray(out.advantages)[0, SLOTS], want)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams",
    [
        {},
        {"whiten": False},
        {"gamma": 0.9, "lam": 0.8, "turn_gamma": 0.7},
        {"gamma": 0.95, "lam": 0.9, "turn_gamma": 1.0, "whiten": False},
    ],
)
def test_turn_gae__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, penalty=False, empty=(5,)))
    values = _values(traj, seed + 10)
    out = run_credit("turn_gae", traj, values, **hparams)
    adv, returns = ref.turn_gae(traj, values, **hparams)
    _close(out.advantages, adv)
    _close(np.asarray(out.returns) * np.asarray(traj.action_mask), returns)


def test_turn_gae__zero_reward_turns_in_random_batch():
    # many exactly-zero turn rewards: every turn end must still restart the token recursion
    traj = regroup(build_full(3, penalty=False))
    rewards = np.asarray(traj.turn_rewards).copy()
    rewards[::2, :] = 0.0
    rewards[:, 1] = 0.0
    traj = traj.replace(turn_rewards=jnp.asarray(rewards))
    values = _values(traj, 4)
    out = run_credit("turn_gae", traj, values, turn_gamma=0.9, whiten=False)
    _close(out.advantages, ref.turn_gae(traj, values, turn_gamma=0.9, whiten=False)[0])


# ------------------------------------------------------------------------------- step_gae


def test_step_gae__hand():
    # episode 0: turn rewards [0, 1], V read at the first action slot of each turn:
    #   V0 = values[1] = .1, V1 = values[4] = .3 (slots 2, 5 hold junk 7).
    # gamma = lam = 1: k1: d = 1 - .3 = .7 -> A1 = .7, R1 = 1.0;
    #                  k0: d = 0 + .3 - .1 = .2 -> A0 = .9, R0 = 1.0.
    # gamma = lam = .5: k1: .7, R1 = 1.0; k0: d = .5 * .3 - .1 = .05, A0 = .05 + .25 * .7 = .225,
    #                  R0 = .325.
    traj = episodes_traj([[0.0, 1.0]], [0])
    values = _hand_values([0.1, 7.0, 0.3, 7.0])
    out = run_credit("step_gae", traj, values, whiten=False)
    _close(per_turn(traj, out.advantages)[0], [0.9, 0.7])
    _close(per_turn(traj, out.returns)[0], [1.0, 1.0])
    out = run_credit("step_gae", traj, values, gamma=0.5, lam=0.5, whiten=False)
    _close(per_turn(traj, out.advantages)[0], [0.225, 0.7])
    _close(per_turn(traj, out.returns)[0], [0.325, 1.0])


def test_step_gae__whitens_over_steps_not_tokens():
    # episode 0 as above (A = [.9, .7]), episode 1: one turn, reward 2, V = .5 -> A = 1.5.
    # Steps [.9, .7, 1.5]: mean 31/30, std(ddof=1) = sqrt(.52 / 3); token-weighted whitening
    # would count every value twice (2 action tokens per turn) and give a different scale.
    traj = episodes_traj([[0.0, 1.0], [2.0]], [0, 0])
    values = np.full((2, 7), 7.0, np.float32)
    values[0, [1, 4]] = [0.1, 0.3]
    values[1, 1] = 0.5
    out = run_credit("step_gae", traj, jnp.asarray(values))
    steps = np.array([0.9, 0.7, 1.5])
    want = (steps - steps.mean()) / (math.sqrt(0.52 / 3) + 1e-8)
    got = per_turn(traj, out.advantages)
    _close([got[0, 0], got[0, 1], got[1, 0]], want)
    _close(per_turn(traj, out.returns)[:, 0], [1.0, 2.0])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams", [{}, {"whiten": False}, {"gamma": 0.9, "lam": 0.7}, {"gamma": 0.5, "lam": 1.0}]
)
def test_step_gae__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, penalty=seed == 1, empty=(5,)))
    values = _values(traj, seed + 20)
    out = run_credit("step_gae", traj, values, **hparams)
    adv, returns = ref.step_gae(traj, values, **hparams)
    _close(out.advantages, adv)
    _close(np.asarray(out.returns) * np.asarray(traj.action_mask), returns)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams", [{}, {"gamma": 0.9, "lam": 0.8, "whiten": False, "reward_placement": "outcome"}]
)
def test_ppo_gae__token_penalty_is_subtracted_from_token_rewards(hparams, seed):
    # methods.md 3.1 / 7.2: token_reward = score - beta * KL per token, before GAE
    traj = regroup(build_full(seed, empty=(5,)))
    values = _values(traj, seed + 30)
    out = run_credit("ppo_gae", traj, values, **hparams)
    adv, returns = ref.ppo_gae(traj, values, **hparams)
    _close(out.advantages, adv)
    _close(out.returns, returns)


@pytest.mark.parametrize("name", ["turn_gae", "step_gae"])
def test_critic__needs_values(name):
    assert credit.requires_values(name)
    with pytest.raises(ValueError, match="values"):
        credit.get(name)(episodes_traj([[1.0]], [0]), None)
