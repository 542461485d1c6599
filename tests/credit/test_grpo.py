"""GRPO advantage: hand-derived cases and a NumPy loop reference (docs/methods.md, `grpo`)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from rl4agents.credit import common
from rl4agents.credit.outcome import grpo

RTOL, ATOL = 1e-5, 1e-6
# jit once per (shape, flags); eager dispatch compiles every primitive and is slower in tests.
_grpo = jax.jit(grpo, static_argnames=("eps", "scale", "singleton_policy"))


def _per_episode(traj, out):
    """Recover the per-episode advantage from the broadcast f32[B, T] output."""
    adv, mask = np.asarray(out.advantages), np.asarray(traj.action_mask)
    np.testing.assert_array_equal(adv[~mask], 0.0)
    return np.array([adv[b][mask[b]][0] for b in range(adv.shape[0])])


def _grpo_loop(scores, gids, eps, scale, singleton_policy):
    """Plain-Python GRPO from docs/methods.md, `grpo` (ddof=1, verl/TRL singleton rules)."""
    n = len(scores)
    all_mean = sum(scores) / n
    batch_std = math.sqrt(sum((s - all_mean) ** 2 for s in scores) / (n - 1)) if n > 1 else 0.0
    out = []
    for i in range(n):
        members = [scores[j] for j in range(n) if gids[j] == gids[i]]
        k = len(members)
        k_is_singleton = k == 1
        if k == 1:
            if singleton_policy == "zero":
                out.append(0.0)
                continue
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / k
            std = math.sqrt(sum((s - mean) ** 2 for s in members) / (k - 1))
        denom = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        if k_is_singleton and scale == "batch":  # a singleton keeps its own std of 1
            denom = std + eps
        out.append((scores[i] - mean) / denom)
    return np.array(out)


def test_grpo__hand_group_of_four_and_two(make_traj, set_outcome):
    # group 0: [1, 0, 0, 1] -> mean .5, std(ddof=1) = sqrt(1/3) -> A = +-.5*sqrt(3)
    # group 1: [2, 4] -> mean 3, std = sqrt(2) -> A = +-1/sqrt(2)  (ddof=0 would give +-1)
    # group 2: [5] singleton -> raw score 5 (verl) or 0 (TRL)
    # group 3: [3, 3, 3] all equal -> 0
    traj = set_outcome(
        make_traj(num_groups=1, group_size=10),
        [1, 0, 0, 1, 2, 4, 5, 3, 3, 3],
        [0, 0, 0, 0, 1, 1, 2, 3, 3, 3],
    )
    h, r = 0.8660254, 0.7071068
    raw = _per_episode(traj, _grpo(traj, None))
    np.testing.assert_allclose(raw, [h, -h, -h, h, -r, r, 5, 0, 0, 0], rtol=RTOL, atol=ATOL)
    zero = _per_episode(traj, _grpo(traj, None, singleton_policy="zero"))
    np.testing.assert_allclose(zero, [h, -h, -h, h, -r, r, 0, 0, 0, 0], rtol=RTOL, atol=ATOL)


def test_grpo__scale_batch_and_none_hand(make_traj, set_outcome):
    # scores [1, 0 | 2, 4]; batch std(ddof=1) = sqrt(8.75 / 3) = 1.7078251
    traj = set_outcome(make_traj(num_groups=1, group_size=4), [1, 0, 2, 4], [0, 0, 1, 1])
    centered = np.array([0.5, -0.5, -1.0, 1.0])
    batch = _per_episode(traj, _grpo(traj, None, scale="batch"))
    np.testing.assert_allclose(batch, centered / 1.7078251, rtol=RTOL, atol=ATOL)
    none = _per_episode(traj, _grpo(traj, None, scale="none"))
    np.testing.assert_allclose(none, centered, rtol=RTOL, atol=ATOL)


def test_grpo__all_singletons_and_zero_std(make_traj, set_outcome):
    traj = set_outcome(make_traj(num_groups=1, group_size=3), [0.5, -1.0, 2.0], [7, 8, 9])
    # verl: mean 0, std 1 -> score / (1 + eps)
    np.testing.assert_allclose(
        _per_episode(traj, _grpo(traj, None)), [0.5, -1.0, 2.0], rtol=RTOL, atol=ATOL
    )
    out = _grpo(traj, None, singleton_policy="zero")
    np.testing.assert_array_equal(np.asarray(out.advantages), 0.0)
    tied = set_outcome(traj, [1.0, 1.0, 1.0], [4, 4, 4])
    out = _grpo(tied, None)
    np.testing.assert_array_equal(np.asarray(out.advantages), 0.0)
    assert float(out.metrics["frac_zero_std"]) == 1.0


def test_group_std__is_unbiased():
    x = np.array([0.0, 3.0, 1.0, 2.0, 6.0], np.float32)
    gid = np.array([5, 5, 9, 9, 9], np.int32)
    std = np.asarray(common.group_std(x, gid))
    np.testing.assert_allclose(std[:2], np.std([0.0, 3.0], ddof=1), rtol=RTOL)
    np.testing.assert_allclose(std[2:], np.std([1.0, 2.0, 6.0], ddof=1), rtol=RTOL)
    mean = np.asarray(common.group_mean(x, gid))
    np.testing.assert_allclose(mean, [1.5, 1.5, 3.0, 3.0, 3.0], rtol=RTOL)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("singleton_policy", ["raw", "zero"])
def test_grpo__matches_loop_reference(make_traj, set_outcome, scale, singleton_policy):
    rng = np.random.default_rng(1)
    traj = make_traj(seed=2, num_groups=3, group_size=4)
    # Random sparse ids (not dense), one singleton and one tied group.
    gids = np.array([40, 40, 40, 3, 3, 3, 3, 1000, 17, 17, 17, 17])
    scores = rng.normal(size=12).round(1)
    scores[8:12] = 1.0
    traj = set_outcome(traj, scores, gids)
    out = _grpo(traj, None, scale=scale, singleton_policy=singleton_policy)
    want = _grpo_loop(
        list(np.asarray(traj.outcome_reward, np.float64)), gids, 1e-6, scale, singleton_policy
    )
    mask = np.asarray(traj.action_mask)
    np.testing.assert_allclose(
        np.asarray(out.advantages), want[:, None] * mask, rtol=RTOL, atol=ATOL
    )
    assert out.returns is None


def test_grpo__batch_scale_keeps_a_singleton_finite_when_the_batch_std_is_zero(
    make_traj, set_outcome
):
    # Every score equal: the groups' advantages are 0 and the singleton keeps verl's raw
    # score s / (1 + eps), not s / (0 + eps).
    traj = set_outcome(make_traj(num_groups=1, group_size=4), [2, 2, 2, 2], [0, 0, 0, 1])
    adv = _per_episode(traj, _grpo(traj, None, scale="batch"))
    np.testing.assert_allclose(adv, [0, 0, 0, 2 / (1 + 1e-6)], rtol=RTOL, atol=ATOL)


def test_grpo__unknown_flag_raises(make_traj):
    with pytest.raises(ValueError, match="allowed"):
        grpo(make_traj(), None, scale="sequence")
    with pytest.raises(ValueError, match="allowed"):
        grpo(make_traj(), None, singleton_policy="nan")


def test_grpo__zero_std_gradient_is_finite(make_traj, set_outcome):
    traj = set_outcome(make_traj(num_groups=1, group_size=4), [1, 1, 2, 3], [0, 0, 1, 2])

    def f(scores):
        return grpo(traj.replace(outcome_reward=scores), None).advantages.sum()

    grad = jax.jit(jax.grad(f))(traj.outcome_reward)
    assert np.all(np.isfinite(np.asarray(grad)))
