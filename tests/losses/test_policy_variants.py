"""GSPO, CISPO, REINFORCE, clip-higher, dual clip, TIS weights, overlong shaping, ECHO.

Hand-derived values and NumPy loop references written from docs/methods.md ("Policy losses",
"TIS (truncated importance sampling)", "DAPO overlong shaping", "ECHO"), plus properties
every registered policy loss must have (finite, jit == no jit, padding invariance, masking,
weights, hyperparameter validation).
"""

from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import losses

RTOL, ATOL = 1e-5, 1e-6
LN = math.log


def _grad(fn, logp, *args, **kwargs):
    return jax.grad(lambda lp: fn(lp, *args, **kwargs)[0])(jnp.asarray(logp))


def _random_batch(seed, b=4, t=9, scale=0.7, p_mask=0.6):
    """logp, logp_old, adv, mask, weights, segment ids (turn-like, nondecreasing) as NumPy."""
    rng = np.random.default_rng(seed)
    logp = -np.abs(rng.normal(size=(b, t))).astype(np.float32)
    logp_old = (logp + rng.normal(scale=scale, size=(b, t))).astype(np.float32)
    adv = rng.normal(size=(b, t)).astype(np.float32)
    mask = rng.random((b, t)) < p_mask
    mask[0, :2] = True  # no row of the first one is empty
    weights = rng.uniform(0.0, 2.0, size=(b, t)).astype(np.float32)
    seg = np.sort(rng.integers(0, 3, size=(b, t)), axis=1).astype(np.int32)
    return logp, logp_old, adv, mask, weights, seg


def _agg_loop(loss, mask, mode):
    """docs/methods.md, "Aggregation modes", for the variants' default modes; no empty rows."""
    rows = [(loss[i][mask[i]].sum(), mask[i].sum()) for i in range(loss.shape[0]) if mask[i].any()]
    if mode == "token-mean":
        return sum(s for s, _ in rows) / max(sum(n for _, n in rows), 1)
    if mode == "seq-mean-token-sum":
        return sum(s for s, _ in rows) / max(len(rows), 1)
    assert mode == "seq-mean-token-mean"
    return sum(s / n for s, n in rows) / max(len(rows), 1)


# ---- clip-higher and dual clip (docs/methods.md, `ppo_clip`) ------------------------------------


def test_ppo_clip__clip_higher_lets_positive_tokens_grow_to_1_28():
    # A = 1 everywhere. ratio 1.25 sits between 1.2 and 1.28: clipped (-1.2, no gradient) with
    # eps_high = 0.2, unclipped (-1.25, gradient -A rho / n) with eps_high = 0.28. ratio 1.3 is
    # clipped at 1.28. ratio 0.7 with A > 0 is never clipped from below (l1 = -0.7 > l2 = -0.8).
    ratios = np.array([[1.25, 1.3, 0.7]], np.float32)
    logp = jnp.log(jnp.asarray(ratios))
    old, adv, mask = jnp.zeros_like(logp), jnp.ones_like(logp), jnp.ones((1, 3), bool)
    loss, m = losses.ppo_clip(logp, old, adv, mask, clip_high=0.28)
    np.testing.assert_allclose(float(loss), (-1.25 - 1.28 - 0.7) / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["pg_clipfrac"]), 1 / 3, rtol=RTOL)
    grad = _grad(losses.ppo_clip, logp, old, adv, mask, clip_high=0.28)
    np.testing.assert_allclose(np.asarray(grad[0]), [-1.25 / 3, 0, -0.7 / 3], rtol=RTOL)
    loss, m = losses.ppo_clip(logp, old, adv, mask)  # symmetric 0.2
    np.testing.assert_allclose(float(loss), (-1.2 - 1.2 - 0.7) / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["pg_clipfrac"]), 2 / 3, rtol=RTOL)
    grad = _grad(losses.ppo_clip, logp, old, adv, mask)
    np.testing.assert_allclose(np.asarray(grad[0]), [0, 0, -0.7 / 3], rtol=RTOL, atol=ATOL)


def test_ppo_clip__dual_clip_bounds_negative_advantage_tokens():
    # A = -1: ratio 5 -> l_clip = 5 > c = 3 -> 3 (constant, no gradient); ratio 2.5 -> 2.5 < 3
    # (gradient -A rho / n = 2.5 / 3); ratio 0.5 -> l2 = 0.8 (clipped below, no gradient).
    ratios = np.array([[5.0, 2.5, 0.5]], np.float32)
    logp = jnp.log(jnp.asarray(ratios))
    old, adv, mask = jnp.zeros_like(logp), -jnp.ones_like(logp), jnp.ones((1, 3), bool)
    loss, m = losses.ppo_clip(logp, old, adv, mask)
    np.testing.assert_allclose(float(loss), (3.0 + 2.5 + 0.8) / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["pg_clipfrac_lower"]), 1 / 3, rtol=RTOL)
    grad = _grad(losses.ppo_clip, logp, old, adv, mask)
    np.testing.assert_allclose(np.asarray(grad[0]), [0, 2.5 / 3, 0], rtol=RTOL, atol=ATOL)
    loss, m = losses.ppo_clip(logp, old, adv, mask, dual_clip_c=10.0)
    np.testing.assert_allclose(float(loss), (5.0 + 2.5 + 0.8) / 3, rtol=RTOL)
    assert float(m["pg_clipfrac_lower"]) == 0.0


def _ppo_loop(logp, logp_old, adv, mask, w, clip_low, clip_high, c):
    """verl compute_policy_loss_vanilla token by token, rollout-IS weights, token-mean."""
    total, count = 0.0, 0
    for i, j in zip(*np.nonzero(mask)):
        ratio = math.exp(min(max(float(logp[i, j] - logp_old[i, j]), -20.0), 20.0))
        a = float(adv[i, j])
        loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
        if a < 0 and c is not None:
            loss = min(loss, -a * c)
        total, count = total + float(w[i, j]) * loss, count + 1
    return total / max(count, 1)


@pytest.mark.parametrize("dual_clip_c", [3.0, None])
def test_ppo_clip__weights_match_loop_reference(dual_clip_c):
    logp, logp_old, adv, mask, w, _ = _random_batch(1)
    loss, _ = losses.ppo_clip(logp, logp_old, adv, mask, w, clip_high=0.28, dual_clip_c=dual_clip_c)
    want = _ppo_loop(logp, logp_old, adv, mask, w, 0.2, 0.28, dual_clip_c)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)


# ---- GSPO (docs/methods.md, `gspo`) -------------------------------------------------------------


def _gspo_inputs():
    # row 0: log ratios [.3, -.1, .1] -> mean .1, s = e^.1, A = [1, 2, .5]: unclipped (eps .2)
    # row 1: log ratios [.5, .7] -> s = e^.6 = 1.822, A = 1: clipped to 1.2 (no gradient)
    # row 2: log ratio [-.5] -> s = e^-.5, A = 2: l1 = -2 s > l2 = -1.6, unclipped
    # masked slots hold NaN / inf, which must not leak.
    nan, inf = float("nan"), float("inf")
    log_ratio = np.array([[0.3, -0.1, 0.1, nan], [0.5, 0.7, inf, 0], [-0.5, nan, 0, 0]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], bool)
    adv = np.array([[1, 2, 0.5, nan], [1, 1, -inf, 0], [2, 5, 0, 0]], np.float32)
    logp = np.where(mask, -1.0, log_ratio).astype(np.float32)
    logp_old = np.where(mask, -1.0 - log_ratio, 0.0).astype(np.float32)
    return logp, logp_old, adv, mask


def test_gspo__hand():
    logp, logp_old, adv, mask = _gspo_inputs()
    kw = dict(clip_low=0.2, clip_high=0.2)
    loss, m = losses.gspo(logp, logp_old, adv, mask, **kw)
    s0, s1, s2 = math.exp(0.1), math.exp(0.6), math.exp(-0.5)
    np.testing.assert_allclose(float(loss), (-3.5 * s0 / 3 - 1.2 - 2 * s2) / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["pg_clipfrac"]), 2 / 6, rtol=RTOL)
    np.testing.assert_allclose(float(m["ppo_kl"]), -1.0 / 6, rtol=RTOL)
    np.testing.assert_allclose(float(m["ratio_mean"]), (3 * s0 + 2 * s1 + s2) / 6, rtol=RTOL)
    # seq-mean-token-mean: d/d logp_t = -A_t s_i / (rows * |y_i|) (token t's own advantage, not
    # the row's mean: s_t = sg(s_i) pi_t / sg(pi_t)); 0 for the clipped row.
    grad = _grad(losses.gspo, logp, logp_old, adv, mask, **kw)
    want = [[-s0 / 9, -2 * s0 / 9, -0.5 * s0 / 9, 0], [0] * 4, [-2 * s2 / 3, 0, 0, 0]]
    np.testing.assert_allclose(np.asarray(grad), want, rtol=RTOL, atol=ATOL)
    # Reference defaults (3e-4 / 4e-4): rows 0 and 1 are clipped to 1.0004; row 2 is not.
    loss, m = losses.gspo(logp, logp_old, adv, mask)
    np.testing.assert_allclose(float(loss), (-3.5 * 1.0004 / 3 - 1.0004 - 2 * s2) / 3, rtol=RTOL)


def test_gspo__log_ratio_clamp_and_options():
    logp = jnp.asarray([[12.0, 12.0]])
    old, mask = jnp.zeros_like(logp), jnp.ones((1, 2), bool)
    loss, m = losses.gspo(logp, old, -jnp.ones_like(logp), mask)
    np.testing.assert_allclose(float(m["ratio_mean"]), math.exp(10.0), rtol=1e-4)
    np.testing.assert_allclose(float(loss), math.exp(10.0), rtol=1e-4)
    with pytest.raises(ValueError, match="segment_ids"):
        losses.gspo(logp, old, old, mask, sequence="turn")
    with pytest.raises(ValueError, match="trajectory"):
        losses.gspo(logp, old, old, mask, sequence="step")


def _gspo_loop(logp, logp_old, adv, mask, w, seg, clip_low, clip_high, agg):
    """GSPO-token value from docs/methods.md, `gspo`; `seg` None = one sequence per row."""
    loss = np.zeros(logp.shape)
    for i in range(logp.shape[0]):
        ids = [0] * logp.shape[1] if seg is None else list(seg[i])
        for k in set(ids):
            toks = [t for t in range(logp.shape[1]) if mask[i, t] and ids[t] == k]
            if not toks:
                continue
            log_s = sum(float(logp[i, t] - logp_old[i, t]) for t in toks) / len(toks)
            s = math.exp(min(log_s, 10.0))
            for t in toks:
                a = float(adv[i, t])
                loss[i, t] = w[i, t] * max(-a * s, -a * min(max(s, 1 - clip_low), 1 + clip_high))
    return _agg_loop(loss, mask, agg)


@pytest.mark.parametrize("sequence", ["trajectory", "turn"])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gspo__matches_loop_reference(sequence, agg):
    logp, logp_old, adv, mask, w, seg = _random_batch(2, scale=0.05)
    kw = dict(clip_low=0.02, clip_high=0.03, sequence=sequence, agg=agg)
    loss, _ = losses.gspo(logp, logp_old, adv, mask, w, seg, **kw)
    ref_seg = seg if sequence == "turn" else None
    want = _gspo_loop(logp, logp_old, adv, mask, w, ref_seg, 0.02, 0.03, agg)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)


def test_gspo__turn_mode_with_one_turn_per_row_equals_trajectory_mode():
    logp, logp_old, adv, mask, _, seg = _random_batch(3)
    one_turn = np.full_like(seg, 2)
    a = losses.gspo(logp, logp_old, adv, mask, None, one_turn, sequence="turn")
    b = losses.gspo(logp, logp_old, adv, mask, None, seg)  # ids ignored in trajectory mode
    np.testing.assert_allclose(float(a[0]), float(b[0]), rtol=RTOL)
    np.testing.assert_allclose(float(a[1]["ratio_mean"]), float(b[1]["ratio_mean"]), rtol=RTOL)


@pytest.mark.parametrize("clip", [(1.0, 10.0), (3e-4, 4e-4), (0.02, 0.03)])
def test_gspo__gradient_equals_sequence_ratio_form(clip):
    """With A constant per row, GSPO-token has the value and gradient of the GSPO sequence
    objective `mean_i max(-A_i s_i, -A_i clip(s_i))`, `s_i = exp(mean_t m (logp - logp_old))`."""
    logp, logp_old, _, mask, _, _ = _random_batch(4, scale=0.05)
    adv_row = np.array([1.0, -0.5, 2.0, -1.5], np.float32)
    adv = np.broadcast_to(adv_row[:, None], logp.shape).astype(np.float32)
    m = jnp.asarray(mask, jnp.float32)

    def sequence_objective(lp):
        log_s = jnp.sum(m * (lp - logp_old), axis=1) / jnp.sum(m, axis=1)
        s = jnp.exp(log_s)
        per_row = jnp.maximum(-adv_row * s, -adv_row * jnp.clip(s, 1 - clip[0], 1 + clip[1]))
        return jnp.mean(per_row)

    kw = dict(clip_low=clip[0], clip_high=clip[1])
    loss, _ = losses.gspo(logp, logp_old, adv, mask, **kw)
    np.testing.assert_allclose(float(loss), float(sequence_objective(logp)), rtol=RTOL)
    grad = _grad(losses.gspo, logp, logp_old, adv, mask, **kw)
    want = jax.grad(sequence_objective)(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-4, atol=1e-7)


# ---- CISPO (docs/methods.md, `cispo`) -----------------------------------------------------------


def _cispo_inputs():
    # ratios [2, 8, .5], A = [1, -1, 2], logp = [-1, -2, -.5]; fourth slot masked (NaN).
    nan = float("nan")
    logp = np.array([[-1.0, -2.0, -0.5, nan]], np.float32)
    ratios = np.array([[2.0, 8.0, 0.5, 1.0]])
    logp_old = (logp - np.log(ratios)).astype(np.float32)
    adv = np.array([[1.0, -1.0, 2.0, nan]], np.float32)
    return logp, logp_old, adv, np.array([[1, 1, 1, 0]], bool)


@pytest.mark.parametrize(
    "bounds, w",
    [
        ({}, [2.0, 5.0, 0.5]),  # defaults: no lower bound, cap 5 (TRL / MiniMax)
        ({"ratio_low": 1.0}, [2.0, 5.0, 1.0]),
        ({"ratio_low": 0.8, "ratio_high": 1.2}, [1.2, 1.2, 0.8]),  # verl's 1 -/+ eps
        ({"ratio_high": None}, [2.0, 8.0, 0.5]),
    ],
)
def test_cispo__hand(bounds, w):
    logp, logp_old, adv, mask = _cispo_inputs()
    loss, m = losses.cispo(logp, logp_old, adv, mask, **bounds)
    a, lp = adv[0, :3], logp[0, :3]
    want = sum(-w[k] * a[k] * lp[k] for k in range(3)) / 3
    np.testing.assert_allclose(float(loss), want, rtol=RTOL)
    clipped = sum(wk != r for wk, r in zip(w, [2.0, 8.0, 0.5]))
    np.testing.assert_allclose(float(m["pg_clipfrac"]), clipped / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["ratio_mean"]), 10.5 / 3, rtol=RTOL)
    # Gradient: -sg(w) A grad logp / n on every token, clipped ones included; 0 off the mask.
    grad = _grad(losses.cispo, logp, logp_old, adv, mask, **bounds)
    want_grad = [-w[k] * a[k] / 3 for k in range(3)] + [0.0]
    np.testing.assert_allclose(np.asarray(grad[0]), want_grad, rtol=RTOL, atol=ATOL)


def test_cispo__gradient_is_weighted_score_function():
    logp, logp_old, adv, mask, weights, _ = _random_batch(5, scale=1.0)
    grad = _grad(losses.cispo, logp, logp_old, adv, mask, weights, ratio_low=0.5)
    ratio = np.exp(np.clip(logp - logp_old, -20, 20))
    w = np.clip(ratio, 0.5, 5.0)
    want = np.where(mask, -w * adv * weights / mask.sum(), 0.0)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="ratio_low"):
        losses.cispo(logp, logp_old, adv, mask, ratio_low=2.0, ratio_high=1.0)


# ---- REINFORCE (docs/methods.md, `reinforce`) ---------------------------------------------------


def test_reinforce__hand():
    # row 0: -A logp = [1, 2] -> 3; row 1: -(-2)(-.5) = -1; seq-mean-token-sum = (3 - 1) / 2.
    nan = float("nan")
    logp = np.array([[-1.0, -2.0], [-0.5, nan]], np.float32)
    adv = np.array([[1.0, 1.0], [-2.0, nan]], np.float32)
    mask = np.array([[1, 1], [1, 0]], bool)
    old = np.full_like(logp, -1.0)
    loss, m = losses.reinforce(logp, old, adv, mask)
    np.testing.assert_allclose(float(loss), 1.0, rtol=RTOL)
    np.testing.assert_allclose(float(m["ppo_kl"]), (0 + 1 - 0.5) / 3, rtol=RTOL)
    w = np.array([[0.5, 2.0], [3.0, nan]], np.float32)
    loss, _ = losses.reinforce(logp, old, adv, mask, w)
    np.testing.assert_allclose(float(loss), (0.5 + 4.0 - 3.0) / 2, rtol=RTOL)
    grad = _grad(losses.reinforce, logp, old, adv, mask, w)
    np.testing.assert_allclose(np.asarray(grad), [[-0.25, -1.0], [3.0, 0.0]], rtol=RTOL)


def test_reinforce__matches_loop_reference():
    logp, logp_old, adv, mask, w, _ = _random_batch(6)
    loss, _ = losses.reinforce(logp, logp_old, adv, mask, w)
    want = _agg_loop(-adv * logp * w, mask, "seq-mean-token-sum")
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)


# ---- TIS weights ------------------------------------------------------------------------------


def test_tis_weights__hand():
    nan = float("nan")
    # learner - sampler = [ln 1.5, ln 3, -ln 2] in row 0 (4th slot masked, NaN), [-30] in row 1.
    sampler = np.zeros((2, 4), np.float32)
    learner = np.array([[LN(1.5), LN(3.0), -LN(2.0), nan], [-30.0, 0, 0, 0]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    w = losses.tis_weights(learner, sampler, mask)
    want = [[1.5, 2.0, 0.5, 0.0], [math.exp(-20.0), 0, 0, 0]]  # log ratio clamped at -20
    np.testing.assert_allclose(np.asarray(w), want, rtol=RTOL, atol=0)
    # sequence: product of the row's ratios 1.5 * 3 * .5 = 2.25, capped, on every masked token.
    w = losses.tis_weights(learner, sampler, mask, mode="sequence")
    np.testing.assert_allclose(np.asarray(w[0]), [2.0, 2.0, 2.0, 0.0], rtol=RTOL)
    w = losses.tis_weights(learner, sampler, mask, mode="sequence", cap=3.0)
    np.testing.assert_allclose(np.asarray(w[0]), [2.25, 2.25, 2.25, 0.0], rtol=RTOL)
    with pytest.raises(ValueError, match="sequence"):
        losses.tis_weights(learner, sampler, mask, mode="geometric")
    with pytest.raises(ValueError, match="cap"):
        losses.tis_weights(learner, sampler, mask, cap=0.0)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_tis_weights__loop_reference_and_no_gradient(mode):
    learner, sampler, _, mask, _, _ = _random_batch(7, scale=0.3)
    cap = 1.3
    want = np.zeros(learner.shape)
    for i in range(learner.shape[0]):
        row_sum = sum(float(learner[i, t] - sampler[i, t]) for t in np.nonzero(mask[i])[0])
        for t in np.nonzero(mask[i])[0]:
            d = float(learner[i, t] - sampler[i, t]) if mode == "token" else row_sum
            want[i, t] = min(math.exp(d), cap)
    got = losses.tis_weights(learner, sampler, mask, cap=cap, mode=mode)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
    grad = jax.grad(lambda lp: losses.tis_weights(lp, sampler, mask, mode=mode).sum())(learner)
    assert not np.any(np.asarray(grad))


# ---- overlong shaping (docs/methods.md, "DAPO overlong shaping") --------------------------------


def test_overlong_penalty():
    # L_max = 20, L_buf = 5 -> L_exp = 15: 0 up to 15, linear to -factor at 20, and beyond.
    lengths = np.array([[0, 15, 16], [18, 20, 25]], np.int32)
    got = losses.overlong_penalty(lengths, max_len=20, buffer=5, factor=1.0)
    assert got.shape == (2, 3) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), [[0, 0, -0.2], [-0.6, -1.0, -2.0]], atol=1e-6)
    got = losses.overlong_penalty(jnp.asarray(18), max_len=20, buffer=5, factor=0.5)
    np.testing.assert_allclose(float(got), -0.3, rtol=RTOL)
    # DAPO defaults; buffer == max_len is allowed (L_exp = 0).
    got = losses.overlong_penalty(np.array([16384, 18432, 20480]), 20480, 4096, 1.0)
    np.testing.assert_allclose(np.asarray(got), [0.0, -0.5, -1.0], atol=1e-6)
    np.testing.assert_allclose(float(losses.overlong_penalty(4, 8, 8, 1.0)), -0.5)
    for buffer in (0, -1, 21):
        with pytest.raises(ValueError, match="buffer"):
            losses.overlong_penalty(lengths, max_len=20, buffer=buffer, factor=1.0)


# ---- ECHO (docs/methods.md, "ECHO") -------------------------------------------------------------


def test_echo_loss():
    nan, inf = float("nan"), float("inf")
    logp = jnp.asarray([[-1.0, -2.0, nan], [-3.0, -inf, 0.0]])
    target = jnp.asarray([[1, 1, 0], [1, 0, 0]], bool)
    np.testing.assert_allclose(float(losses.echo_loss(logp, target)), 2.0, rtol=RTOL)
    grad = jax.grad(losses.echo_loss)(logp, target)
    np.testing.assert_allclose(np.asarray(grad), [[-1 / 3, -1 / 3, 0], [-1 / 3, 0, 0]])
    empty = jnp.zeros_like(target)
    assert float(losses.echo_loss(logp, empty)) == 0.0
    assert not np.any(np.asarray(jax.grad(losses.echo_loss)(logp, empty)))


# ---- properties of every registered policy loss -----------------------------------------------

CASES = [(name, {}) for name in losses.names()] + [
    ("ppo_clip", {"clip_high": 0.28, "dual_clip_c": None}),
    ("gspo", {"sequence": "turn", "clip_low": 0.02, "clip_high": 0.03}),
    ("cispo", {"ratio_low": 0.8, "ratio_high": 1.2}),
    ("reinforce", {"agg": "token-mean"}),
    ("sapo", {"tau_pos": 0.2, "tau_neg": 3.0, "agg": "token-mean"}),
]
CASE_IDS = [name + "".join(f"-{k}={v}" for k, v in hp.items()) for name, hp in CASES]


def _bind(name, hparams):
    fn = functools.partial(losses.get(name), **losses.validate(name, hparams))
    if losses.takes_segment_ids(name):
        return lambda lp, old, adv, mask, w=None, seg=None: fn(lp, old, adv, mask, w, seg)
    return lambda lp, old, adv, mask, w=None, seg=None: fn(lp, old, adv, mask, w)


def _value_and_grad(fn, logp, *args):
    return jax.value_and_grad(lambda lp: fn(lp, *args), has_aux=True)(jnp.asarray(logp))


def _assert_trees_close(a, b, rtol=RTOL, atol=ATOL):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_registry__names_defaults_and_segment_attribute():
    assert {"cispo", "gspo", "ppo_clip", "reinforce"} <= set(losses.names())
    assert losses.defaults("gspo") == {
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "sequence": "trajectory",
        "agg": "seq-mean-token-mean",
        "agg_scale": None,
        "log_ratio_max": 10.0,
    }
    assert losses.defaults("cispo")["ratio_low"] is None
    assert losses.defaults("cispo")["ratio_high"] == 5.0
    assert losses.defaults("cispo")["agg"] == "token-mean"
    assert losses.defaults("reinforce") == {"agg": "seq-mean-token-sum", "agg_scale": None}
    assert [n for n in losses.names() if losses.takes_segment_ids(n)] == ["gspo"]


@pytest.mark.parametrize("name", losses.names())
def test_registry__unknown_hparam_lists_allowed_fields(name):
    allowed = list(losses.defaults(name))
    assert "weights" not in allowed and "segment_ids" not in allowed  # data, not config
    pattern = rf"\['bogus'\].*'{name}'.*" + re.escape(str(allowed))
    with pytest.raises(ValueError, match=pattern):
        losses.validate(name, {"bogus": 1.0})


@pytest.mark.parametrize("name, hparams", CASES, ids=CASE_IDS)
def test_registry__finite_and_jit_equals_eager(name, hparams):
    fn = _bind(name, hparams)
    logp, logp_old, adv, mask, w, seg = _random_batch(8, scale=3.0)
    for weights in (None, w):
        (loss, metrics), grad = _value_and_grad(fn, logp, logp_old, adv, mask, weights, seg)
        assert np.isfinite(float(loss))
        assert all(np.isfinite(float(v)) for v in metrics.values())
        assert np.all(np.isfinite(np.asarray(grad)))
        jitted = jax.jit(lambda *a: _value_and_grad(fn, *a))
        got = jitted(logp, logp_old, adv, mask, weights, seg)
        _assert_trees_close(got, ((loss, metrics), grad))


@pytest.mark.parametrize("name, hparams", CASES, ids=CASE_IDS)
def test_registry__off_mask_values_and_padding_columns_do_not_matter(name, hparams):
    fn = _bind(name, hparams)
    logp, logp_old, adv, mask, w, seg = _random_batch(9)
    ref = _value_and_grad(fn, logp, logp_old, adv, mask, w, seg)
    # NaN / inf in every input off the mask: same loss, metrics and gradient; 0 gradient there.
    off = ~mask
    bad = [
        np.where(off, v, x).astype(x.dtype)
        for x, v in [(logp, np.nan), (logp_old, -np.inf), (adv, np.inf), (w, np.nan)]
    ]
    got = _value_and_grad(fn, bad[0], bad[1], bad[2], mask, bad[3], seg)
    _assert_trees_close(got, ref)
    assert not np.any(np.asarray(got[1])[off])

    # Extra padding columns with garbage values: same loss and metrics, same gradient on the
    # original columns, zero gradient on the new ones.
    def pad(x, value):
        return np.concatenate([x, np.full((x.shape[0], 5), value, x.dtype)], axis=1)

    got = _value_and_grad(
        fn,
        pad(logp, np.nan),
        pad(logp_old, 3.0),
        pad(adv, -7.0),
        pad(mask, False),
        pad(w, np.inf),
        pad(seg, 1),
    )
    _assert_trees_close(got[0], ref[0])
    np.testing.assert_allclose(np.asarray(got[1])[:, :9], np.asarray(ref[1]), rtol=RTOL, atol=ATOL)
    assert not np.any(np.asarray(got[1])[:, 9:])


@pytest.mark.parametrize("name, hparams", CASES, ids=CASE_IDS)
def test_registry__weights_scale_the_per_token_loss(name, hparams):
    fn = _bind(name, hparams)
    logp, logp_old, adv, mask, w, seg = _random_batch(10)
    (loss, metrics), grad = _value_and_grad(fn, logp, logp_old, adv, mask, None, seg)
    ones = np.ones_like(w)
    _assert_trees_close(
        _value_and_grad(fn, logp, logp_old, adv, mask, ones, seg), ((loss, metrics), grad)
    )
    (loss2, _), grad2 = _value_and_grad(fn, logp, logp_old, adv, mask, 2.5 * ones, seg)
    np.testing.assert_allclose(float(loss2), 2.5 * float(loss), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(grad2), 2.5 * np.asarray(grad), rtol=RTOL, atol=ATOL)
    # Linear in the weights (each weight multiplies its own token's loss); no gradient to them.
    w2 = np.random.default_rng(11).uniform(0.0, 3.0, size=w.shape).astype(np.float32)
    loss_w = fn(logp, logp_old, adv, mask, w, seg)[0]
    loss_w2 = fn(logp, logp_old, adv, mask, w2, seg)[0]
    loss_sum = fn(logp, logp_old, adv, mask, w + w2, seg)[0]
    np.testing.assert_allclose(float(loss_sum), float(loss_w + loss_w2), rtol=1e-4, atol=1e-6)
    dw = jax.grad(lambda ww: fn(logp, logp_old, adv, mask, ww, seg)[0])(jnp.asarray(w))
    assert not np.any(np.asarray(dw))
