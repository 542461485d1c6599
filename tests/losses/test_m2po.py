"""M2PO's second-moment trust region (`losses.mismatch.m2po`, arXiv 2510.01161): hand-derived
cases, a slow NumPy loop that drops one token at a time, the config check, and a train step
that samples with stale parameters and masks with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.losses import mismatch


def _run(d, mask=None, tau=0.04):
    """`m2po` on log ratios `d` (learner = d, sampler = 0)."""
    d = np.asarray(d, np.float32)
    d = d[None] if d.ndim == 1 else d
    mask = np.ones(d.shape, bool) if mask is None else np.asarray(mask, bool).reshape(d.shape)
    w, keep = mismatch.m2po(
        jnp.asarray(d), jnp.zeros_like(jnp.asarray(d)), jnp.asarray(mask), tau=tau
    )
    return np.asarray(w), np.asarray(keep)


def _loop_reference(d, mask, tau):
    """The algorithm as the paper states it: while the kept tokens' mean of d^2 exceeds tau,
    drop the kept token of largest d^2 (the first in row-major order on a tie)."""
    sq = np.square(d.astype(np.float64)).reshape(-1)
    keep = mask.reshape(-1).copy()
    while keep.any() and sq[keep].mean() > tau:
        candidates = np.where(keep, sq, -1.0)
        keep[int(np.argmax(candidates))] = False
    keep = keep.reshape(d.shape)
    return np.where(keep, np.exp(d), 0.0), keep


def test_m2po__drops_the_largest_squares_until_the_mean_is_within_tau():
    # d^2 = [0.01, 0.01, 1.0, 0.25]: M2 = 0.3175 > 0.04; without 1.0: 0.27 / 3 = 0.09 > 0.04;
    # without 0.25 too: 0.02 / 2 = 0.01 <= 0.04, so the two small tokens stay.
    w, keep = _run([0.1, -0.1, 1.0, 0.5])
    np.testing.assert_array_equal(keep, [[True, True, False, False]])
    np.testing.assert_allclose(w, [[np.exp(0.1), np.exp(-0.1), 0.0, 0.0]], rtol=1e-6)


def test_m2po__a_batch_within_tau_keeps_every_token_even_an_outlier():
    # One token with d^2 = 0.09 > tau among nine on-policy ones: M2 = 0.009 <= 0.04. The trust
    # region bounds the batch's second moment, not each token (token MIS would judge 0.3 alone).
    d = [0.3] + [0.0] * 9
    w, keep = _run(d)
    assert keep.all()
    np.testing.assert_allclose(w[0, 0], np.exp(0.3), rtol=1e-6)
    w, keep = _run([0.1, 0.2, -0.1])  # M2 = 0.06 / 3 = 0.02
    assert keep.all()


def test_m2po__ties_drop_the_first_in_row_major_order_and_the_mask_is_respected():
    # d^2 = [0.09, 0.09, 0], tau 0.05: M2 = 0.06 > 0.05, drop token 0; then 0.045 <= 0.05.
    _, keep = _run([[0.3, -0.3, 0.0]], tau=0.05)
    np.testing.assert_array_equal(keep, [[False, True, True]])
    # Off-mask tokens are in no statistic and never kept, whatever their ratio.
    d = np.array([[5.0, 0.1, -0.1], [0.0, 3.0, 0.0]], np.float32)
    mask = np.array([[False, True, True], [True, False, True]])
    w, keep = _run(d, mask)
    np.testing.assert_array_equal(keep, mask)  # M2 over the mask: 0.02 / 4
    np.testing.assert_array_equal(w[~mask], 0.0)
    # tau = 0 keeps only the exactly on-policy tokens.
    _, keep = _run([0.0, 0.01, 0.0, -0.2], tau=0.0)
    np.testing.assert_array_equal(keep, [[True, False, True, False]])


def test_m2po__an_empty_mask_keeps_nothing():
    w, keep = _run(np.ones((2, 3)), np.zeros((2, 3), bool))
    assert not keep.any() and not w.any()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tau", [0.0, 0.01, 0.04, 0.3])
def test_m2po__matches_the_one_token_at_a_time_loop(seed, tau):
    rng = np.random.default_rng(seed)
    shape = (4, 9)
    d = (rng.standard_normal(shape) * rng.choice([0.05, 0.2, 0.6])).astype(np.float32)
    d[rng.random(shape) < 0.2] = 0.0  # exactly on-policy tokens, ties at 0
    mask = rng.random(shape) < 0.8
    w, keep = _run(d, mask, tau)
    w_ref, keep_ref = _loop_reference(d, mask, tau)
    np.testing.assert_array_equal(keep, keep_ref)
    np.testing.assert_allclose(w, w_ref, rtol=1e-5)
    if keep.any():  # what is left is within the trust region
        assert np.square(d[keep].astype(np.float64)).mean() <= tau + 1e-7


def test_m2po__weights_and_mask_carry_no_gradient():
    def total(lp):
        w, keep = mismatch.m2po(lp, jnp.zeros_like(lp), jnp.ones(lp.shape, bool), tau=0.04)
        return jnp.sum(w) + jnp.sum(keep)

    g = jax.grad(total)(jnp.asarray([[0.1, 0.5, -0.1]], jnp.float32))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_m2po__is_registered_and_checks_tau():
    assert "m2po" in mismatch.names()
    assert mismatch.defaults("m2po") == {"tau": 0.04}
    with pytest.raises(ValueError, match=r"mismatch.m2po: tau=-0.1; allowed: >= 0"):
        mismatch.validate("m2po", {"tau": -0.1})


def test_m2po__stale_train_step_masks_and_stays_finite():
    """Three steps sampling with the parameters of one update ago, with M2PO: the steps run,
    the kept share is logged, and at step 0 (sampler = learner) every token is kept."""
    from tests.train.test_step_options import assert_finite, build

    exp = build(
        **{
            "optim.lr": 0.05,
            "train.staleness": 1,
            "mismatch.name": "m2po",
            "loss.policy": "ppo_clip",
        }
    )
    assert exp.step_cfg.loss.mismatch_fn.keywords == {"tau": 0.04}
    root = exp.root_key()
    state = exp.init_state(jax.random.key(0))
    kept = []
    for _ in range(3):
        state, m = exp.train_step(state, root)
        assert_finite(m)
        kept.append(float(m["mismatch/kept_frac"]))
    assert kept[0] == 1.0  # step 0: the sampler is the learner
    assert all(0.0 < k <= 1.0 for k in kept)
