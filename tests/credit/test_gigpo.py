"""GiGPO (docs/methods.md, `gigpo`): hand cases, loop reference, reduction to GRPO, edge cases."""

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
EPS = 1e-6


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL)


def _hand_traj():
    """Group 0: three episodes revisiting anchors 1 and 2; group 1: one episode on anchor 1.

    ep0: rewards [0, 1], anchors [1, 2], outcome 1
    ep1: rewards [0, 0, 0], anchors [1, 2, 3], turn 1 did not parse, outcome 0
    ep2: rewards [1], anchors [1], outcome 1
    ep3 (group 1): rewards [2], anchors [1], outcome 2
    """
    return episodes_traj(
        [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0], [2.0]],
        [0, 0, 0, 1],
        anchors=[[1, 2], [1, 2, 3], [1], [1]],
        action_valid=[[True, True], [True, False, True], [True], [True]],
    )


# Step returns (gamma .5, penalty .1 after discounting): ep0 [.5, 1], ep1 [0, -.1, 0], ep2 [1],
# ep3 [2]. Row scores (outcome - penalty): ep0 [1, 1], ep1 [0, -.1, 0], ep2 [1], ep3 [2].
# Step groups (group 0): anchor 1 -> {ep0k0 .5, ep1k0 0, ep2k0 1} (mean .5, std .5);
# anchor 2 -> {ep0k1 1, ep1k1 -.1} (mean .45, std 1.1 / sqrt 2); anchor 3 -> {ep1k2} singleton.
# ep3 is alone in group 1 (its anchor 1 must not join group 0's anchor-1 group).
NAN = float("nan")


def _rows(table):
    return np.array([[v if v is not None else NAN for v in row] for row in table])


def test_gigpo__hand_mean_norm_steps():
    # episode stats over the 6 rows of group 0: mean 2.9 / 6 = .483333
    m = 2.9 / 6
    a_e = [[1 - m, 1 - m, None], [-m, -0.1 - m, -m], [1 - m, None, None], [2.0, None, None]]
    a_s = [[0.0, 0.55, None], [-0.5, -0.55, 0.0], [0.5, None, None], [0.0, None, None]]
    want = _rows(a_e) + _rows(a_s)
    traj = _hand_traj()
    out = run_credit("gigpo", traj, gamma=0.5, mode="mean_norm")
    _close(per_turn(traj, out.advantages), want)
    # omega scales the step term only
    out = run_credit("gigpo", traj, gamma=0.5, mode="mean_norm", omega=0.5)
    _close(per_turn(traj, out.advantages), _rows(a_e) + 0.5 * _rows(a_s))


def test_gigpo__anchor_group_metrics_by_hand():
    # Valid steps and their anchor groups: group 0's anchor 1 (ep0k0, ep1k0, ep2k0: size 3),
    # anchor 2 (ep0k1, ep1k1: 2), anchor 3 (ep1k2: 1), and group 1's anchor 1 (ep3k0: 1).
    out = run_credit("gigpo", _hand_traj(), gamma=0.5, mode="mean_norm")
    m = {k: float(v) for k, v in out.metrics.items()}
    assert math.isclose(m["step_group_size"], (3 * 3 + 2 * 2 + 1 + 1) / 7, rel_tol=1e-6)
    assert math.isclose(m["frac_steps_grouped"], 5 / 7, rel_tol=1e-6)  # all but the singletons
    assert math.isclose(m["frac_groups_singleton"], 2 / 4, rel_tol=1e-6)  # 2 of the 4 groups


def test_gigpo__hand_mean_norm_trajectories():
    # one value per trajectory, the score of its first row: group 0 -> [1, 0, 1], mean 2/3;
    # each row is still normalised with its own (penalised) score; group 1 singleton -> raw 2.
    m = 2 / 3
    a_e = [[1 - m, 1 - m, None], [-m, -0.1 - m, -m], [1 - m, None, None], [2.0, None, None]]
    a_s = [[0.0, 0.55, None], [-0.5, -0.55, 0.0], [0.5, None, None], [0.0, None, None]]
    traj = _hand_traj()
    out = run_credit("gigpo", traj, gamma=0.5, stats_over="trajectories")
    _close(per_turn(traj, out.advantages), _rows(a_e) + _rows(a_s))


def test_gigpo__hand_mean_std_norm():
    # episode rows [1, 1, 0, -.1, 0, 1]: mean .483333, std(ddof=1) = sqrt(1.608333 / 5)
    m = 2.9 / 6
    sd = math.sqrt(sum((x - m) ** 2 for x in [1, 1, 0, -0.1, 0, 1]) / 5) + EPS
    a_e = [
        [(1 - m) / sd, (1 - m) / sd, None],
        [-m / sd, (-0.1 - m) / sd, -m / sd],
        [(1 - m) / sd, None, None],
        [2.0 / (1 + EPS), None, None],  # singleton episode group: mean 0, std 1
    ]
    s1 = 0.5 + EPS  # anchor 1: [.5, 0, 1] -> [0, -1, 1] (up to eps)
    s2 = 1.1 / math.sqrt(2) + EPS  # anchor 2: [1, -.1] -> +-.55 / s2
    a_s = [
        [0.0, 0.55 / s2, None],
        [-0.5 / s1, -0.55 / s2, 0.0],
        [0.5 / s1, None, None],
        [0.0, None, None],
    ]
    traj = _hand_traj()
    out = run_credit("gigpo", traj, gamma=0.5, mode="mean_std_norm")
    _close(per_turn(traj, out.advantages), _rows(a_e) + _rows(a_s))


def test_gigpo__no_repeated_state_reduces_to_grpo():
    # single-turn episodes, all actions valid, all anchors distinct: A^S = 0 and the episode
    # term with mean_std_norm is exactly GRPO's advantage.
    traj = regroup(build_full(2, turns=1, penalty=False, invalid_prob=0.0))
    traj = traj.replace(anchors=jnp.arange(traj.batch_size, dtype=jnp.uint32)[:, None])
    got = run_credit("gigpo", traj, mode="mean_std_norm").advantages
    _close(got, run_credit("grpo", traj).advantages)


def test_gigpo__all_equal_and_singletons_are_zero_or_raw():
    # tied group: every row score 1 and every step return 1 -> 0; the lone episode of group 1
    # keeps its raw score 3 and its singleton step group adds 0.
    traj = episodes_traj([[1.0], [1.0], [1.0], [3.0]], [0, 0, 0, 1], anchors=[[5], [5], [6], [5]])
    for mode in ("mean_norm", "mean_std_norm"):
        got = per_turn(traj, run_credit("gigpo", traj, mode=mode).advantages)[:, 0]
        _close(got, [0.0, 0.0, 0.0, 3.0 / (1 + EPS) if mode == "mean_std_norm" else 3.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "hparams",
    [
        {},
        {"mode": "mean_std_norm"},
        {"stats_over": "trajectories"},
        {"mode": "mean_std_norm", "stats_over": "trajectories", "omega": 0.8},
        {"gamma": 1.0, "invalid_penalty": 0.5, "eps": 1e-4, "mode": "mean_std_norm"},
    ],
)
def test_gigpo__matches_loop_reference(hparams, seed):
    traj = regroup(build_full(seed, penalty=False, empty=(5,)))
    out = run_credit("gigpo", traj, **hparams)
    _close(out.advantages, ref.gigpo(traj, **hparams))
    if out.returns is not None:  # critic-free: returns, when given, are the advantages
        _close(out.returns, np.asarray(out.advantages))


@pytest.mark.parametrize("score, size", [(0.9, 3), (-1.4871862, 3), (9.9, 8)])
def test_gigpo__tie_of_inexact_floats_gives_zero(score, size):
    # same as grpo's tie test: three equal row scores and three equal step returns on one
    # anchor must give exactly the all-equal result 0, not an ulp divided by the eps
    traj = episodes_traj([[score]] * size, [0] * size, anchors=[[1]] * size)
    out = run_credit("gigpo", traj, mode="mean_std_norm")
    np.testing.assert_allclose(np.asarray(out.advantages), 0.0, atol=1e-5)
