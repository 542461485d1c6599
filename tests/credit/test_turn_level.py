"""Turn-level estimators turn_return, mt_grpo, empg.

Formulas: docs/methods.md, "Step-level (per-turn) estimators".
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from tests.credit import reference as ref
from tests.credit.conftest import (
    build_full,
    episodes_traj,
    per_turn,
    regroup,
    run_credit,
)

RTOL, ATOL = 1e-5, 1e-5
NAN = float("nan")


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL)


def _z(x, xs, eps):
    """Hand z-score helper: (x - mean) / (unbiased std + eps)."""
    xs = np.asarray(xs, np.float64)
    return (x - xs.mean()) / (xs.std(ddof=1) + eps)


# ---------------------------------------------------------------------------- turn_return


def _turn_return_traj():
    """gamma .5 -> G: ep0 [0, 1] -> [.5, 1]; ep1 [1, 0] -> [1, 0]; ep2 [2] -> [2]; ep3 [3]."""
    return episodes_traj(
        [[0.0, 1.0], [1.0, 0.0], [2.0], [3.0]],
        [0, 0, 0, 1],
        anchors=[[1, 2], [1, 1], [2], [1]],
    )


def test_turn_return__hand_all_norms():
    traj = _turn_return_traj()
    eps = 1e-6

    def got(norm):
        return per_turn(traj, run_credit("turn_return", traj, gamma=0.5, norm=norm).advantages)

    _close(got("none"), [[0.5, 1.0], [1.0, 0.0], [2.0, NAN], [3.0, NAN]])
    # group = (group_id, turn k): k0 of group 0 -> [.5, 1, 2]; k1 -> [1, 0]; group 1 singleton
    k0 = [0.5, 1.0, 2.0]
    want = [
        [_z(0.5, k0, eps), _z(1.0, [1, 0], eps)],
        [_z(1.0, k0, eps), _z(0.0, [1, 0], eps)],
        [_z(2.0, k0, eps), NAN],
        [0.0, NAN],
    ]
    _close(got("group"), want)
    # batch: all six valid turns [.5, 1, 1, 0, 2, 3]
    every = [0.5, 1.0, 1.0, 0.0, 2.0, 3.0]
    want = [[_z(x, every, eps) for x in row] for row in [[0.5, 1.0], [1.0, 0.0], [2.0, NAN]]]
    _close(got("batch")[:3], want)
    _close(got("batch")[3, 0], _z(3.0, every, eps))
    # anchor = (group_id, anchor): (0, 1) -> {ep0k0 .5, ep1k0 1, ep1k1 0}: mean .5, std .5;
    # (0, 2) -> {ep0k1 1, ep2k0 2}; ep3 (group 1, anchor 1) is alone -> 0.
    a1, a2 = [0.5, 1.0, 0.0], [1.0, 2.0]
    want = [
        [_z(0.5, a1, eps), _z(1.0, a2, eps)],
        [_z(1.0, a1, eps), _z(0.0, a1, eps)],
        [_z(2.0, a2, eps), NAN],
        [0.0, NAN],
    ]
    _close(got("anchor"), want)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams",
    [
        {},
        {"norm": "none", "gamma": 0.9},
        {"norm": "batch", "gamma": 0.7},
        {"norm": "anchor", "gamma": 0.95, "eps": 1e-4},
    ],
)
def test_turn_return__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, penalty=False, empty=(5,)))
    out = run_credit("turn_return", traj, **hparams)
    _close(out.advantages, ref.turn_return(traj, **hparams))


# -------------------------------------------------------------------------------- mt_grpo


def _mt_traj():
    """Group 0: ep0 turns [1, 0]; ep1 [0, 2]; ep2 [1]. Group 1: ep3 [1, 1] alone (every z-score
    of a group of one is 0). The outcome reward is the sum of the turn rewards, as rollouts
    make it."""
    return episodes_traj([[1.0, 0.0], [0.0, 2.0], [1.0], [1.0, 1.0]], [0, 0, 0, 1])


def test_mt_grpo__hand():
    eps = 1e-4
    traj = _mt_traj()
    # R^O: each episode's last turn's reward, [0, 2, 1] in group 0
    a_o = [_z(o, [0, 2, 1], eps) for o in (0, 2, 1)]  # [-1, 1, 0] / (1 + eps)
    # turn terms at k=0 pool the turns that are not last: ep0 (1) and ep1 (0); ep2's only turn
    # is its last and gets A^O alone
    a_t0 = [_z(r, [1, 0], eps) for r in (1, 0)]
    want = [[a_o[0] + a_t0[0], a_o[0]], [a_o[1] + a_t0[1], a_o[1]], [a_o[2], NAN], [0.0, 0.0]]
    _close(per_turn(traj, run_credit("mt_grpo", traj).advantages), want)
    # every turn gets both terms (pools k=0: [1, 0, 1], k=1: [0, 2]); turn_coef scales the
    # turn term
    k0, k1 = [1, 0, 1], [0, 2]
    want = [
        [a_o[0] + 2 * _z(1, k0, eps), a_o[0] + 2 * _z(0, k1, eps)],
        [a_o[1] + 2 * _z(0, k0, eps), a_o[1] + 2 * _z(2, k1, eps)],
        [a_o[2] + 2 * _z(1, k0, eps), NAN],
        [0.0, 0.0],
    ]
    out = run_credit("mt_grpo", traj, turn_coef=2.0, last_turn_outcome_only=False)
    _close(per_turn(traj, out.advantages), want)
    # outcome="episode": R^O is the episode's summed reward, [1, 2, 1]
    a_e = [_z(o, [1, 2, 1], eps) for o in (1, 2, 1)]
    want = [[a_e[0] + a_t0[0], a_e[0]], [a_e[1] + a_t0[1], a_e[1]], [a_e[2], NAN], [0.0, 0.0]]
    _close(per_turn(traj, run_credit("mt_grpo", traj, outcome="episode").advantages), want)


def test_mt_grpo__two_turns_is_the_reference_split():
    """Every episode has a tool turn and an answer turn: the tool turn gets
    A^O + A^T with R^T its reward, the answer turn A^O with R^O its reward alone (the
    reference's `mt_grpo_env_trainer`, where the summed outcome would leak the tool reward into
    the answer turn)."""
    eps = 1e-4
    rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    traj = episodes_traj(rewards, [0, 0, 0, 0])
    r_t, r_o = [r[0] for r in rewards], [r[1] for r in rewards]
    want = [[_z(r_o[b], r_o, eps) + _z(r_t[b], r_t, eps), _z(r_o[b], r_o, eps)] for b in range(4)]
    _close(per_turn(traj, run_credit("mt_grpo", traj).advantages), want)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "hparams",
    [
        {},
        {"last_turn_outcome_only": False},
        {"turn_coef": 0.5, "eps": 1e-6},
        {"outcome": "episode"},
        {"outcome": "episode", "last_turn_outcome_only": False},
    ],
)
def test_mt_grpo__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, penalty=False))
    out = run_credit("mt_grpo", traj, **hparams)
    _close(out.advantages, ref.mt_grpo(traj, **hparams))


# ----------------------------------------------------------------------------------- empg


def test_empg__hand():
    # group 0: ep0 outcome 1 (2 turns, entropies .5, 1.5), ep1 outcome 0 (1 turn, entropy 1).
    # GRPO base: +-.5 / (sqrt(.5) + 1e-6) = +-a.  H = [.5, 1.5 | 1] -> H^ = [0, 1 | .5].
    # k = 1: e = exp(-H^) = [1, e^-1 | e^-.5], g = e / mean(e); f = e (k_future = 1).
    # A_mod: ep0k0 = g0 a + zeta f(ep0k1); ep0k1 = g1 a (no next turn); ep1k0 = -g2 a.
    # A_final = A_mod - mean(A_mod over the 3 steps).
    traj = episodes_traj(
        [[0.5, 0.5], [0.0]], [0, 0], entropy=[[0.5, 1.5], [1.0]], outcome=[1.0, 0.0]
    )
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    h = np.array([0.0, 1.0, 0.5]) / (1 + 1e-8)
    e = np.exp(-h)
    g = e / e.mean()
    mod = np.array([g[0] * a + 0.05 * e[1], g[1] * a, -g[2] * a])
    final = mod - mod.mean()
    out = per_turn(traj, run_credit("empg", traj).advantages)
    _close(out, [[final[0], final[1]], [final[2], NAN]])
    # k = 2, k_future = .5, zeta = .1
    e2, f = np.exp(-2 * h), np.exp(-0.5 * h)
    g = e2 / e2.mean()
    mod = np.array([g[0] * a + 0.1 * f[1], g[1] * a, -g[2] * a])
    final = mod - mod.mean()
    out = per_turn(traj, run_credit("empg", traj, k=2.0, k_future=0.5, zeta=0.1).advantages)
    _close(out, [[final[0], final[1]], [final[2], NAN]])


def test_empg__equal_entropies_reduce_to_centred_grpo_plus_bonus():
    # all H equal -> H^ = 0, g = 1, f = 1: A_mod = A_i + zeta [turn k+1 exists], then centred
    traj = episodes_traj(
        [[0.5, 0.5], [0.0]], [0, 0], entropy=[[1.0, 1.0], [1.0]], outcome=[1.0, 0.0]
    )
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    mod = np.array([a + 0.05, a, -a])
    final = mod - mod.mean()
    out = per_turn(traj, run_credit("empg", traj).advantages)
    _close(out, [[final[0], final[1]], [final[2], NAN]])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hparams", [{}, {"k": 2.0, "k_future": 0.5, "zeta": 0.1, "eps": 1e-4}])
def test_empg__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed))
    out = run_credit("empg", traj, **hparams)
    _close(out.advantages, ref.empg(traj, **hparams))


def test_empg__entropy_off_action_slots_is_ignored():
    traj = regroup(build_full(4))
    junk = jnp.where(traj.action_mask, traj.entropy_behavior, 50.0)
    want = run_credit("empg", traj).advantages
    _close(run_credit("empg", traj.replace(entropy_behavior=junk)).advantages, np.asarray(want))


@pytest.mark.parametrize("score", [0.9, -1.4871862])
@pytest.mark.parametrize(
    "name, hparams",
    [
        ("turn_return", {}),
        ("turn_return", {"norm": "anchor"}),
        ("turn_return", {"norm": "batch"}),
        ("mt_grpo", {"last_turn_outcome_only": False}),
    ],
)
def test_turn_level__tie_of_inexact_floats_gives_zero(name, hparams, score):
    # three equal turn rewards / outcomes that are not exact binary fractions: z-scores of a
    # tie are 0 (an ulp of float32 roundoff in the mean must not be divided by eps)
    traj = episodes_traj([[score], [score], [score]], [0, 0, 0], anchors=[[1], [1], [1]])
    out = run_credit(name, traj, **hparams)
    np.testing.assert_allclose(np.asarray(out.advantages), 0.0, atol=1e-5)
