"""Turn-level critic estimators: turn_gae (RAGEN bi-level GAE, 3.4) and step_gae (StepPO, 3.5)."""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.credit import token as token_lib
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
    # docs/methods.md, `ppo_gae` and "KL in the loss vs in the reward":
    # token_reward = score - beta * KL per token, before GAE
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


# ------------------------------------------------------------------- bootstrap_truncated

# One two-turn episode (rewards .5, 1; the turn limit K = 2 cut it: truncated, not done) with
# one padding slot appended (`with_tail_slot`): slots 0 prompt | 1, 2 act | 3 obs | 4, 5 act |
# 6 obs | 7 pad. V on the action slots .1, .2 | .3, .4; V at slot 7, the value after the final
# observation, is the tail 2.0; junk 9.0 on the other slots must be ignored.
TAIL = 2.0


def _truncated_case(done=False):
    traj = token_lib.with_tail_slot(episodes_traj([[0.5, 1.0]], [0]))
    traj = traj.replace(truncated=jnp.asarray([True]), done=jnp.asarray([done]))
    values = np.full((1, 8), 9.0, np.float32)
    values[0, SLOTS] = [0.1, 0.2, 0.3, 0.4]
    values[0, 7] = TAIL
    return traj, jnp.asarray(values)


# gamma = lam = .5 (turn_gamma .8); hand derivations:
# ppo_gae, reverse over action slots from next_v = 2.0:
#   5: 1 + .5*2 - .4 = 1.6;  4: .5*.4 - .3 + .25*1.6 = .3;  2: .5 + .5*.3 - .2 + .25*.3 = .525;
#   1: .5*.2 - .1 + .25*.525 = .13125; returns = A + V.
# turn_gae high level: k1: 1 + .8*2 - .4 = 2.2, R1 = 2.6; k0: .5 + .8*.4 - .2 + .8*.5*2.2 = 1.5,
#   R0 = 1.7; low level: 5: 2.6 - .4 = 2.2; 4: .5*.4 - .3 + .25*2.2 = .45; 2: 1.7 - .2 = 1.5;
#   1: .5*.2 - .1 + .25*1.5 = .375.
# step_gae (V_k at the turn's first action slot: .1, .3): k1: 1 + .5*2 - .3 = 1.7, R1 = 2.0;
#   k0: .5 + .5*.3 - .1 + .25*1.7 = .975, R0 = 1.075.
# Terminal (no bootstrap) for comparison: ppo_gae [.115625, .4625, .05, .6].
BOOTSTRAP_HAND = {
    "ppo_gae": ({}, [0.13125, 0.525, 0.3, 1.6], [0.23125, 0.725, 0.6, 2.0]),
    "turn_gae": ({"turn_gamma": 0.8}, [0.375, 1.5, 0.45, 2.2], [0.475, 1.7, 0.75, 2.6]),
    "step_gae": ({}, [0.975, 0.975, 1.7, 1.7], [1.075, 1.075, 2.0, 2.0]),
}


@pytest.mark.parametrize("name", sorted(BOOTSTRAP_HAND))
def test_bootstrap_truncated__hand(name):
    extra, adv, ret = BOOTSTRAP_HAND[name]
    traj, values = _truncated_case()
    hp = dict(gamma=0.5, lam=0.5, whiten=False, **extra)
    out = run_credit(name, traj, values, bootstrap_truncated=True, **hp)
    _close(np.asarray(out.advantages)[0, SLOTS], adv)
    _close(np.asarray(out.returns)[0, SLOTS], ret)
    assert float(out.metrics["frac_bootstrapped"]) == 1.0
    # Off (the default) or a row the environment ended: terminal, the tail is never read.
    terminal = run_credit(name, traj, values.at[0, 7].set(0.0), **hp)
    assert not np.allclose(np.asarray(terminal.advantages)[0, SLOTS], adv)
    for traj_, hp_ in ((traj, {}), (_truncated_case(done=True)[0], {"bootstrap_truncated": True})):
        got = run_credit(name, traj_, values, **hp, **hp_)
        _close(np.asarray(got.advantages), np.asarray(terminal.advantages))
        _close(np.asarray(got.returns), np.asarray(terminal.returns))
    if name == "ppo_gae":
        _close(np.asarray(terminal.advantages)[0, SLOTS], [0.115625, 0.4625, 0.05, 0.6])


def test_truncation_tail__reads_the_slot_after_the_last_valid_one():
    # Row 0 fills all 7 slots (no slot after it: stays terminal); row 1 took one turn of two
    # (cut by the context limit: truncated, not done), its last valid slot is its obs slot 3,
    # so its tail is V at slot 4; row 2 took no turn (nothing to train on: no tail).
    traj = episodes_traj([[0.5, 1.0], [0.3], []], [0, 0, 0])
    traj = traj.replace(truncated=jnp.asarray([True, True, True]), done=jnp.zeros(3, bool))
    values = jnp.arange(21, dtype=jnp.float32).reshape(3, 7)
    tail, boot = token_lib.truncation_tail(traj, values)
    np.testing.assert_array_equal(np.asarray(boot), [False, True, False])
    np.testing.assert_array_equal(np.asarray(tail), [0.0, 11.0, 0.0])
    padded = token_lib.with_tail_slot(traj)
    tail, boot = token_lib.truncation_tail(padded, jnp.arange(24.0).reshape(3, 8))
    np.testing.assert_array_equal(np.asarray(boot), [True, True, False])
    np.testing.assert_array_equal(np.asarray(tail), [7.0, 12.0, 0.0])


def test_bootstraps_truncated__reads_the_resolved_hyperparameter():
    on = functools.partial(
        credit.get("ppo_gae"), **credit.validate("ppo_gae", {"bootstrap_truncated": True})
    )
    assert token_lib.bootstraps_truncated(on)
    assert not token_lib.bootstraps_truncated(functools.partial(credit.get("ppo_gae")))
    assert not token_lib.bootstraps_truncated(credit.get("grpo"))
