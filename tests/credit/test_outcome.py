"""Outcome-level baselines: hand cases, loop references, edge cases.

Formulas: docs/methods.md, "Outcome-level, critic-free estimators".

Covers grpo (token penalty, stats_over="steps"), dr_grpo, rloo, reinforce_pp,
reinforce_pp_baseline and remax. The loop references live in `reference.py`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from tests.credit import reference as ref
from tests.credit.conftest import (
    build_full,
    episodes_traj,
    per_turn,
    regroup,
    run_credit,
)

RTOL, ATOL = 1e-5, 1e-5


def _episode_values(traj, adv):
    """f64[B] per-episode value of a per-episode broadcast (NaN for empty episodes)."""
    table = per_turn(traj, adv)
    for row in table:
        finite = row[~np.isnan(row)]
        np.testing.assert_allclose(finite, finite[:1].repeat(finite.size), rtol=1e-6, atol=1e-7)
    return np.array([row[~np.isnan(row)][0] if (~np.isnan(row)).any() else np.nan for row in table])


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------- hand cases


def _five_episodes():
    # groups: {0: scores 1, 0}, {1: scores 2, 4}, {2: score 5}; one turn each, 2 action tokens
    return episodes_traj([[1.0], [0.0], [2.0], [4.0], [5.0]], [0, 0, 1, 1, 2])


def test_grpo__stats_over_steps_hand():
    # group 0: A (2 turns, score 1), B (1 turn, score 0). Per step: [1, 1, 0]:
    #   mean 2/3, var (2 (1/3)^2 + (2/3)^2) / 2 = 1/3 -> A = (1/3)/sqrt(1/3) = .57735,
    #   B = (-2/3)/sqrt(1/3) = -1.1547. Per trajectory: [1, 0] -> +-1/sqrt(2).
    # group 1: one 1-turn episode, score 3: weight 1 -> singleton -> raw 3 (both modes).
    # group 2: one 2-turn episode, score 4: weight 2 is not a singleton under "steps":
    #   mean 4, std 0 -> 0; under "trajectories" it is a singleton -> raw 4.
    traj = episodes_traj(
        [[0.5, 0.5], [0.0], [3.0], [1.0, 3.0]], [0, 0, 1, 2], outcome=[1.0, 0.0, 3.0, 4.0]
    )
    steps = _episode_values(traj, run_credit("grpo", traj, stats_over="steps").advantages)
    _close(steps, [1 / 3 / (math.sqrt(1 / 3) + 1e-6), -2 / 3 / (math.sqrt(1 / 3) + 1e-6), 3, 0])
    trajs = _episode_values(traj, run_credit("grpo", traj).advantages)
    h = 0.5 / (math.sqrt(0.5) + 1e-6)
    _close(trajs, [h, -h, 3, 4])
    zero = _episode_values(traj, run_credit("grpo", traj, singleton_policy="zero").advantages)
    _close(zero, [h, -h, 0, 0])


def test_grpo__token_penalty_lowers_the_score():
    # both outcomes 1; penalty .25 on each of episode 0's two action tokens -> s = [.5, 1]
    # -> mean .75, std sqrt(.125) -> A = -+.25 / .353553 = -+.707107
    traj = episodes_traj([[1.0], [1.0]], [0, 0])
    penalty = np.where(np.asarray(traj.action_mask), 0.25, 0.0)
    penalty[1] = 0.0
    traj = traj.replace(token_penalty=jnp.asarray(penalty, jnp.float32))
    a = 0.25 / (math.sqrt(0.125) + 1e-6)
    _close(_episode_values(traj, run_credit("grpo", traj).advantages), [-a, a])
    _close(_episode_values(traj, run_credit("dr_grpo", traj).advantages), [-0.25, 0.25])
    _close(_episode_values(traj, run_credit("rloo", traj).advantages), [-0.5, 0.5])


def test_dr_grpo__hand():
    # s - mean_g: [.5, -.5 | -1, 1 | 5 raw]; "zero" singleton -> 0
    traj = _five_episodes()
    _close(_episode_values(traj, run_credit("dr_grpo", traj).advantages), [0.5, -0.5, -1, 1, 5])
    zero = run_credit("dr_grpo", traj, singleton_policy="zero").advantages
    _close(_episode_values(traj, zero), [0.5, -0.5, -1, 1, 0])


def test_rloo__hand():
    # k/(k-1) (s - mean): group of 4 [1, 0, 0, 1] -> 4/3 * +-.5 = +-.666667;
    # pair [2, 4] -> 2 * -+1 = -+2 (= s_i - the other score); singleton 5 -> raw 5.
    traj = episodes_traj([[1.0], [0.0], [0.0], [1.0], [2.0], [4.0], [5.0]], [7, 7, 7, 7, 1, 1, 9])
    got = _episode_values(traj, run_credit("rloo", traj).advantages)
    _close(got, [2 / 3, -2 / 3, -2 / 3, 2 / 3, -2, 2, 5])


def test_opo__hand_length_weighted_baseline():
    # group 0: ep0 score 1 with 1 turn (2 action tokens), ep1 score 0 with 3 turns (6 tokens)
    #   -> b = (2 * 1 + 6 * 0) / 8 = .25 (turns: (1 * 1 + 3 * 0) / 4 = .25) -> A = [.75, -.25];
    # group 1: ep2 alone, score 5 -> raw 5 ("zero": 0).
    traj = episodes_traj([[1.0], [0.0, 0.0, 0.0], [5.0]], [0, 0, 1])
    for length in ("tokens", "turns"):
        got = run_credit("opo", traj, length=length).advantages
        _close(_episode_values(traj, got), [0.75, -0.25, 5.0])
    got = run_credit("opo", traj, singleton_policy="zero").advantages
    _close(_episode_values(traj, got), [0.75, -0.25, 0.0])


def _two_turn_episode():
    # slots: 0 prompt | 1 2 action (turn 0) | 3 obs | 4 5 action (turn 1) | 6 obs
    return episodes_traj([[0.5, 1.0]], [0])


def test_reinforce_pp__hand_returns():
    traj = _two_turn_episode()
    slots = [1, 2, 4, 5]
    cases = {
        # gamma .5, turn rewards .5 @ 2, 1 @ 5.
        # seq_end: 5: 1; 4: .5; 2: .5 + .5*.5 = .75; 1: .375 (carried across the obs slot).
        ("seq_end", "turn", 0.5): [0.375, 0.75, 0.5, 1.0],
        # mask (verl): obs slot 3 writes .25 then resets, so turn 0 never sees turn 1:
        # 2: .5; 1: .25.
        ("mask", "turn", 0.5): [0.25, 0.5, 0.5, 1.0],
        # outcome 1.5 @ 5, gamma 1: seq_end -> 1.5 everywhere; mask -> 0 on turn 0.
        ("seq_end", "outcome", 1.0): [1.5, 1.5, 1.5, 1.5],
        ("mask", "outcome", 1.0): [0.0, 0.0, 1.5, 1.5],
    }
    for (reset_on, placement, gamma), want in cases.items():
        out = run_credit(
            "reinforce_pp", traj, gamma=gamma, reset_on=reset_on, reward_placement=placement
        )
        want_full = np.zeros(traj.tokens.shape)
        want_full[0, slots] = want
        # advantages = masked_whiten(G) over the 4 action tokens (unbiased variance)
        g = np.array(want)
        whitened = np.zeros(traj.tokens.shape)
        whitened[0, slots] = (g - g.mean()) / math.sqrt(g.var(ddof=1) + 1e-8)
        _close(out.advantages, whitened)
        if out.returns is not None:  # docs/methods.md, `reinforce_pp`: returns G, may be None
            _close(np.asarray(out.returns) * np.asarray(traj.action_mask), want_full)


def test_reinforce_pp__hand_whitened():
    # gamma 1, "turn": seq_end G = [1.5, 1.5, 1, 1]: mean 1.25, unbiased var 4 * .0625 / 3
    # -> A = +-.25 / .288675 = +-.866025; mask G = [.5, .5, 1, 1] -> the mirror image.
    traj = _two_turn_episode()
    a = 0.25 / math.sqrt(0.25 / 3 + 1e-8)
    for reset_on, sign in (("seq_end", 1.0), ("mask", -1.0)):
        adv = run_credit("reinforce_pp", traj, reset_on=reset_on, reward_placement="turn")
        _close(np.asarray(adv.advantages)[0, [1, 2, 4, 5]], sign * np.array([a, a, -a, -a]))
    # default (seq_end, outcome): every token's return is 1.5 -> whitened to 0
    _close(run_credit("reinforce_pp", traj).advantages, np.zeros(traj.tokens.shape))


def test_reinforce_pp_baseline__hand():
    # centred [.5, -.5 | -1, 1 | 5], each on 2 tokens: mean 1, unbiased var 2 * 22.5 / 9 = 5
    # -> A = ([.5, -.5, -1, 1, 5] - 1) / sqrt(5) = [-.2236, -.6708, -.8944, 0, 1.7889].
    # "zero": [.5, -.5, -1, 1, 0]: mean 0, var 2 * 2.5 / 9 -> / .745356.
    traj = _five_episodes()
    got = run_credit("reinforce_pp_baseline", traj).advantages
    want = (np.array([0.5, -0.5, -1, 1, 5]) - 1) / math.sqrt(5 + 1e-8)
    _close(_episode_values(traj, got), want)
    got = run_credit("reinforce_pp_baseline", traj, singleton_policy="zero").advantages
    want = np.array([0.5, -0.5, -1, 1, 0]) / math.sqrt(5 / 9 + 1e-8)
    _close(_episode_values(traj, got), want)


def test_remax__hand():
    traj = _two_turn_episode().replace(baseline_reward=jnp.asarray([0.25]))
    slots = [1, 2, 4, 5]
    # outcome 1.5 on slot 5: returns 1.5 everywhere, A = 1.5 - .25
    out = run_credit("remax", traj)
    _close(np.asarray(out.advantages)[0, slots], [1.25] * 4)
    # turn rewards .5 @ 2, 1 @ 5: returns [1.5, 1.5, 1, 1] (no discount, obs slots skipped)
    out = run_credit("remax", traj, reward_placement="turn")
    _close(np.asarray(out.advantages)[0, slots], [1.25, 1.25, 0.75, 0.75])
    if out.returns is not None:  # critic-free: returns may be omitted
        _close(np.asarray(out.returns)[0, slots], [1.5, 1.5, 1.0, 1.0])
    # penalty .1 on each action token: returns 1.5 - .1 * (number of tokens at or after t)
    penalty = np.where(np.asarray(traj.action_mask), 0.1, 0.0).astype(np.float32)
    out = run_credit("remax", traj.replace(token_penalty=jnp.asarray(penalty)))
    _close(np.asarray(out.advantages)[0, slots], np.array([1.1, 1.2, 1.3, 1.4]) - 0.25)


def test_remax__needs_baseline():
    assert credit.requires_greedy("remax")
    with pytest.raises(ValueError, match="baseline_reward"):
        credit.get("remax")(_two_turn_episode(), None)


# ------------------------------------------------------------------------ loop references

OUTCOME_CASES = [
    ("grpo", {}),
    ("grpo", {"stats_over": "steps"}),
    ("grpo", {"stats_over": "steps", "singleton_policy": "zero"}),
    ("grpo", {"stats_over": "steps", "scale": "none"}),
    ("grpo", {"scale": "batch", "eps": 1e-4}),
    ("dr_grpo", {}),
    ("dr_grpo", {"singleton_policy": "zero", "stats_over": "steps"}),
    ("rloo", {}),
    ("reinforce_pp_baseline", {}),
    ("reinforce_pp_baseline", {"singleton_policy": "zero"}),
    ("opo", {}),
    ("opo", {"length": "turns", "singleton_policy": "zero"}),
]
REFERENCES = {
    "grpo": ref.grpo,
    "dr_grpo": ref.dr_grpo,
    "rloo": ref.rloo,
    "reinforce_pp_baseline": ref.reinforce_pp_baseline,
    "opo": ref.opo,
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name, hparams", OUTCOME_CASES)
def test_outcome__matches_loop_reference(name, hparams, seed):
    # sparse group ids with a singleton, token penalties, an empty episode (index 5)
    traj = regroup(build_full(seed, empty=(5,)))
    out = run_credit(name, traj, **hparams)
    _close(out.advantages, REFERENCES[name](traj, **hparams))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams",
    [
        {},
        {"reset_on": "mask"},
        {"gamma": 0.9, "reward_placement": "turn"},
        {"gamma": 0.8, "reset_on": "mask", "reward_placement": "turn"},
    ],
)
def test_reinforce_pp__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, empty=(5,)))
    out = run_credit("reinforce_pp", traj, **hparams)
    adv, returns = ref.reinforce_pp(traj, **hparams)
    _close(out.advantages, adv)
    if out.returns is not None:
        _close(np.asarray(out.returns) * np.asarray(traj.action_mask), returns)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("placement", ["outcome", "turn"])
def test_remax__matches_loop_reference(placement, seed):
    traj = regroup(build_full(seed, empty=(5,)))
    out = run_credit("remax", traj, reward_placement=placement)
    adv, returns = ref.remax(traj, reward_placement=placement)
    _close(out.advantages, adv)
    if out.returns is not None:
        _close(np.asarray(out.returns) * np.asarray(traj.action_mask), returns)


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize(
    "name, hparams",
    [
        ("grpo", {}),
        ("grpo", {"stats_over": "steps"}),
        ("dr_grpo", {}),
        ("rloo", {}),
        ("reinforce_pp_baseline", {}),
    ],
)
def test_outcome__all_equal_scores_give_zero(name, hparams):
    # every group tied (episode 1 reaches 1 in two turns): 0 / (0 + eps) = 0, no NaN
    traj = episodes_traj([[1.0], [0.5, 0.5], [1.0], [2.0], [2.0]], [0, 0, 0, 1, 1])
    out = run_credit(name, traj, **hparams)
    np.testing.assert_array_equal(np.asarray(out.advantages), 0.0)


@pytest.mark.parametrize("name, divisor", [("grpo", 1 + 1e-6), ("dr_grpo", 1.0), ("rloo", 1.0)])
def test_outcome__all_singletons_raw_or_zero(name, divisor):
    # verl: a group of one keeps its raw score (grpo: mean 0, std 1); TRL ("zero"): 0
    traj = episodes_traj([[0.5], [-1.0], [2.0]], [4, 5, 6])
    raw = _episode_values(traj, run_credit(name, traj).advantages)
    _close(raw, np.array([0.5, -1.0, 2.0]) / divisor)
    if "singleton_policy" in credit.fields(name):
        zero = run_credit(name, traj, singleton_policy="zero").advantages
        np.testing.assert_array_equal(np.asarray(zero), 0.0)


def test_outcome__episode_without_action_tokens_is_no_group_member():
    # Episode 2 takes no turn (outcome 0): nothing to train on, so it is in no statistic
    # (OpenRLHF counted such fully masked siblings). grpo: [1, 0] -> mean 1/2, std sqrt(1/2),
    # under "trajectories" and "steps" alike; counted, it would make the mean 1/3.
    traj = episodes_traj([[1.0], [0.0], []], [0, 0, 0])
    h = 0.5 / (math.sqrt(0.5) + 1e-6)
    for hparams in ({}, {"stats_over": "steps"}, {"scale": "batch"}):
        adv = run_credit("grpo", traj, **hparams).advantages
        _close(_episode_values(traj, adv)[:2], [h, -h])
        np.testing.assert_array_equal(np.asarray(adv)[2], 0.0)
    # rloo: each real episode's baseline is its one real sibling; opo: a group of two.
    _close(_episode_values(traj, run_credit("rloo", traj).advantages)[:2], [1.0, -1.0])
    _close(_episode_values(traj, run_credit("opo", traj).advantages)[:2], [0.5, -0.5])


@pytest.mark.parametrize("score, size", [(0.9, 3), (-1.4871862, 3), (9.9, 8)])
@pytest.mark.parametrize("hparams", [{}, {"stats_over": "steps"}])
def test_grpo__tie_of_inexact_floats_gives_zero(score, size, hparams):
    # Three equal scores that are not exact binary fractions: in float32 sum(x) / 3 can differ
    # from x by an ulp, and then (x - mean) / (std + 1e-6) is ~1e-7 / ~1e-6, i.e. an O(.1)
    # advantage of one sign for the whole tied group. docs/methods.md, `grpo`: all-equal -> 0.
    # (9.9 = ALFWorld's 10 * won - 0.1 invalid-action penalty; a group of N = 8 all tied.)
    traj = episodes_traj([[score]] * size, [0] * size)
    out = run_credit("grpo", traj, **hparams)
    np.testing.assert_allclose(np.asarray(out.advantages), 0.0, atol=1e-5)
