"""Loss aggregation, PPO/value losses and regularizers.

Formulas: docs/methods.md, "Policy losses" (`ppo_clip`, "Aggregation modes", "Value loss") and
"Regularisers and shaping" ("KL estimators", "KL in the loss vs in the reward", "Entropy bonus").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import losses
from rl4agents.losses.aggregate import aggregate

RTOL, ATOL = 1e-5, 1e-6
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
_aggregate = jax.jit(aggregate, static_argnames=("mode", "scale"))

# ---- aggregation ----------------------------------------------------------------------------

HAND_LOSS = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)
HAND_MASK = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]], bool)


@pytest.mark.parametrize(
    "mode, scale, want",
    [
        ("token-mean", None, 10 / 3),  # (1 + 2 + 7) / 3 tokens
        ("seq-mean-token-sum", None, 5.0),  # rows 0, 2 only: (3 + 7) / 2
        ("seq-mean-token-mean", None, 4.25),  # (1.5 + 7) / 2
        ("seq-mean-token-sum-norm", None, 10 / 3),  # 10 / T, T = 3
        ("seq-mean-token-sum-norm", 5.0, 2.0),  # 10 / 5
    ],
)
def test_aggregate__hand(mode, scale, want):
    got = _aggregate(jnp.asarray(HAND_LOSS), jnp.asarray(HAND_MASK), mode, scale)
    np.testing.assert_allclose(float(got), want, rtol=RTOL)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate__empty_mask_is_zero(mode):
    got = _aggregate(jnp.asarray(HAND_LOSS), jnp.zeros((3, 3), bool), mode, None)
    assert float(got) == 0.0


def _aggregate_loop(loss, mask, mode, scale):
    num_rows, num_cols = loss.shape
    rows = []  # (token sum, token count) for rows with a masked token
    for i in range(num_rows):
        vals = [float(loss[i, t]) for t in range(num_cols) if mask[i, t]]
        if vals:
            rows.append((sum(vals), len(vals)))
    total = sum(s for s, _ in rows)
    if mode == "token-mean":
        return total / max(sum(n for _, n in rows), 1)
    if mode == "seq-mean-token-sum":
        return total / max(len(rows), 1)
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in rows) / max(len(rows), 1)
    return total / (num_cols if scale is None else scale)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate__matches_loop_reference(mode):
    rng = np.random.default_rng(0)
    loss = rng.normal(size=(6, 7)).astype(np.float32)
    mask = rng.random((6, 7)) < 0.5
    mask[2] = False  # one empty row
    got = _aggregate(jnp.asarray(loss), jnp.asarray(mask), mode, None)
    np.testing.assert_allclose(float(got), _aggregate_loop(loss, mask, mode, None), rtol=RTOL)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate__values_off_the_mask_never_enter(mode):
    """NaN and inf off the mask give the same result as zeros there, for every mode and for
    the value loss (which aggregates with the same modes)."""
    rng = np.random.default_rng(0)
    loss = rng.normal(size=(3, 5)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 1, 1, 1, 0]], bool)
    dirty = np.where(mask, loss, np.array([np.nan, np.inf, -np.inf, np.nan, 1e30])[None, :])
    clean = np.where(mask, loss, 0.0)
    got = aggregate(jnp.asarray(dirty, jnp.float32), jnp.asarray(mask), mode)
    want = aggregate(jnp.asarray(clean, jnp.float32), jnp.asarray(mask), mode)
    assert np.isfinite(float(got))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    v, _ = losses.value_loss(
        jnp.asarray(dirty), jnp.zeros((3, 5)), jnp.zeros((3, 5)), jnp.asarray(mask), agg=mode
    )
    v_clean, _ = losses.value_loss(
        jnp.asarray(clean), jnp.zeros((3, 5)), jnp.zeros((3, 5)), jnp.asarray(mask), agg=mode
    )
    np.testing.assert_allclose(float(v), float(v_clean), rtol=1e-6)


def test_aggregate__registry():
    assert losses.AGGREGATIONS.names() == sorted(MODES)
    with pytest.raises(KeyError, match="token-mean"):
        aggregate(jnp.zeros((1, 1)), jnp.ones((1, 1), bool), "tokenmean")


# ---- PPO clip ---------------------------------------------------------------------------------

# Five valid tokens (logp_old = 0, logp = log ratio) plus one masked token with huge values.
#   ratio 1.5, A = 1:  l1 = -1.5, l2 = -1.2 -> -1.2 (clipped)
#   ratio 0.5, A = 1:  l1 = -0.5, l2 = -0.8 -> -0.5
#   ratio 0.5, A = -1: l1 = 0.5,  l2 = 0.8  -> 0.8 (clipped)
#   ratio 5,   A = -1: l1 = 5,    l2 = 1.2  -> 5, dual clip min(5, 3) = 3
#   ratio 1.1, A = -2: l1 = 2.2,  l2 = 2.2  -> 2.2
RATIOS = [1.5, 0.5, 0.5, 5.0, 1.1, 100.0]
ADVS = [1.0, 1.0, -1.0, -1.0, -2.0, -50.0]
PPO_MASK = [True] * 5 + [False]


def _ppo_inputs():
    logp = jnp.log(jnp.asarray([RATIOS], jnp.float32))
    return logp, jnp.zeros_like(logp), jnp.asarray([ADVS]), jnp.asarray([PPO_MASK])


def test_ppo_clip__hand_with_dual_clip():
    logp, logp_old, adv, mask = _ppo_inputs()
    loss, metrics = losses.ppo_clip(logp, logp_old, adv, mask)
    np.testing.assert_allclose(float(loss), (-1.2 - 0.5 + 0.8 + 3.0 + 2.2) / 5, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["pg_clipfrac"]), 2 / 5, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["pg_clipfrac_lower"]), 1 / 5, rtol=RTOL)
    want_kl = -sum(math.log(r) for r in RATIOS[:5]) / 5
    np.testing.assert_allclose(float(metrics["ppo_kl"]), want_kl, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), sum(RATIOS[:5]) / 5, rtol=RTOL)
    # d loss / d logp = -A * ratio / 5 on unclipped tokens, 0 on clipped ones and off-mask.
    grad = jax.grad(lambda lp: losses.ppo_clip(lp, logp_old, adv, mask)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad[0]), [0, -0.1, 0, 0, 0.44, 0], rtol=RTOL, atol=ATOL)


def test_ppo_clip__no_dual_clip_and_clip_higher():
    logp, logp_old, adv, mask = _ppo_inputs()
    loss, _ = losses.ppo_clip(logp, logp_old, adv, mask, dual_clip_c=None)
    np.testing.assert_allclose(float(loss), (-1.2 - 0.5 + 0.8 + 5.0 + 2.2) / 5, rtol=RTOL)
    # clip_high = 0.6: ratio 1.5 is no longer clipped -> -1.5
    loss, _ = losses.ppo_clip(logp, logp_old, adv, mask, clip_high=0.6)
    np.testing.assert_allclose(float(loss), (-1.5 - 0.5 + 0.8 + 3.0 + 2.2) / 5, rtol=RTOL)
    with pytest.raises(ValueError, match="dual_clip_c"):
        losses.ppo_clip(logp, logp_old, adv, mask, dual_clip_c=0.5)


def test_ppo_clip__log_ratio_clamp():
    logp = jnp.asarray([[30.0]])
    loss, metrics = losses.ppo_clip(
        logp, jnp.zeros_like(logp), jnp.asarray([[1.0]]), jnp.asarray([[True]])
    )
    np.testing.assert_allclose(float(metrics["ratio_mean"]), math.exp(20.0), rtol=1e-4)
    np.testing.assert_allclose(float(metrics["ppo_kl"]), -20.0, rtol=RTOL)
    np.testing.assert_allclose(float(loss), -1.2, rtol=RTOL)


def _ppo_loop(logp, logp_old, adv, mask, clip_low, clip_high, c):
    """verl compute_policy_loss_vanilla token by token, token-mean aggregation."""
    total, count = 0.0, 0
    for i, j in zip(*np.nonzero(mask), strict=True):
        ratio = math.exp(min(max(float(logp[i, j] - logp_old[i, j]), -20.0), 20.0))
        a = float(adv[i, j])
        loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
        if a < 0 and c is not None:
            loss = min(loss, -a * c)
        total, count = total + loss, count + 1
    return total / max(count, 1)


@pytest.mark.parametrize("dual_clip_c", [3.0, None])
def test_ppo_clip__matches_loop_reference(dual_clip_c):
    rng = np.random.default_rng(1)
    logp = rng.normal(size=(4, 9)).astype(np.float32)
    logp_old = (logp + rng.normal(scale=0.7, size=(4, 9))).astype(np.float32)
    adv = rng.normal(size=(4, 9)).astype(np.float32)
    mask = rng.random((4, 9)) < 0.6
    fn = jax.jit(losses.ppo_clip, static_argnames=("clip_low", "clip_high", "dual_clip_c"))
    loss, _ = fn(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip_c=dual_clip_c)
    want = _ppo_loop(logp, logp_old, adv, mask, 0.2, 0.28, dual_clip_c)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)


def test_policy_registry():
    assert "ppo_clip" in losses.names()
    assert losses.get("ppo_clip") is losses.ppo_clip
    assert losses.defaults("ppo_clip")["dual_clip_c"] == 3.0
    assert losses.validate("ppo_clip", {"clip_high": 0.28})["clip_high"] == 0.28
    with pytest.raises(ValueError, match=r"\['clip_ratio'\].*'ppo_clip'.*clip_low"):
        losses.validate("ppo_clip", {"clip_ratio": 0.2})
    with pytest.raises(ValueError, match=r"ppo_clip.agg='sum' is not .*allowed: \[.*'token-mean'"):
        losses.validate("ppo_clip", {"agg": "sum"})
    with pytest.raises(KeyError, match="ppo_clip"):
        losses.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        losses.registry.register("ppo_clip")(lambda *a: None)


# ---- value loss -------------------------------------------------------------------------------


def test_value_loss__hand():
    # V_old = 0, clip .5: V = [1, .2, -1] -> V_clip = [.5, .2, -.5]; R = [0, 1, -2]
    # (V-R)^2 = [1, .64, 1], (V_clip-R)^2 = [.25, .64, 2.25]; max = [1, .64, 2.25]
    # loss = .5 * 3.89 / 3; clipfrac = 1/3 (last token). Fourth token is masked.
    values = jnp.asarray([[1.0, 0.2, -1.0, 50.0]])
    returns = jnp.asarray([[0.0, 1.0, -2.0, 0.0]])
    mask = jnp.asarray([[True, True, True, False]])
    loss, metrics = losses.value_loss(values, jnp.zeros_like(values), returns, mask)
    np.testing.assert_allclose(float(loss), 0.5 * 3.89 / 3, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["vf_clipfrac"]), 1 / 3, rtol=RTOL)
    loss, metrics = losses.value_loss(values, jnp.zeros_like(values), returns, mask, clip=None)
    np.testing.assert_allclose(float(loss), 0.5 * 2.64 / 3, rtol=RTOL)
    assert float(metrics["vf_clipfrac"]) == 0.0


# ---- regularizers -----------------------------------------------------------------------------


def _kl_closed_form(kind, logp, logp_ref):
    d = logp_ref - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "abs":
        return np.abs(d)
    d = np.clip(d, -20, 20)
    return np.clip(np.exp(d) - d - 1, -10, 10)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_penalty__matches_closed_form(kind):
    rng = np.random.default_rng(2)
    logp = rng.normal(size=(3, 5)).astype(np.float32)
    logp_ref = logp + rng.normal(size=(3, 5)).astype(np.float32)
    logp_ref[0, 0] = logp[0, 0] + 30.0  # exercises the k3 clamps
    got = losses.kl_penalty(jnp.asarray(logp), jnp.asarray(logp_ref), kind)
    want = _kl_closed_form(kind, logp.astype(np.float64), logp_ref.astype(np.float64))
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=1e-5)
    if kind == "k3":
        assert float(got[0, 0]) == 10.0


def test_sequence_mean_kl__row_means_then_batch_mean_by_hand():
    from rl4agents.losses import regularizers

    kl = jnp.array([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0], [9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
    # rows: (1 + 2) / 2 = 1.5, 4 / 1 = 4; the empty row is left out of the mean and the count.
    value, n = regularizers.sequence_mean_kl(kl, mask)
    np.testing.assert_allclose(value, 5.5 / 2, rtol=1e-6)
    assert n == 2
    # No row with action tokens: KL 0 over 0 rows (the controller's error is then -0.2 x 0).
    value, n = regularizers.sequence_mean_kl(kl, jnp.zeros_like(mask))
    assert value == 0.0 and n == 0


@pytest.mark.parametrize(
    "current, expected",
    [
        # KL above target by 50%: error clipped to +0.2, beta * (1 + 0.2 * 64 / 10000)
        (0.15, 0.1 * 1.00128),
        (0.05, 0.1 * (1 - 0.00128)),  # below by 50%: clipped to -0.2
        (0.11, 0.1 * (1 + 0.1 * 64 / 10000)),  # within the clip: error 0.1
        (0.10, 0.1),  # on target: unchanged
    ],
)
def test_adaptive_kl_coef__ziegler_rule_by_hand(current, expected):
    from rl4agents.losses import regularizers

    out = regularizers.adaptive_kl_coef(jnp.float32(0.1), jnp.float32(current), 0.1, 64, 10000.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_kl_penalty__k1_k3_expectations_equal_true_kl():
    # E_{x~p}[k1] = E_{x~p}[k3] = KL(p || q) exactly for categorical p, q.
    rng = np.random.default_rng(3)
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=7), jnp.float32))
    logq = jax.nn.log_softmax(jnp.asarray(rng.normal(size=7), jnp.float32))
    p = np.exp(np.asarray(logp, np.float64))
    true_kl = float(np.sum(p * (np.asarray(logp, np.float64) - np.asarray(logq, np.float64))))
    for kind in ("k1", "k3"):
        est = float(np.sum(p * np.asarray(losses.kl_penalty(logp, logq, kind))))
        np.testing.assert_allclose(est, true_kl, rtol=1e-4)


@pytest.mark.parametrize("kind", ["k1+", "k3+", "abs+"])
def test_kl_penalty__straight_through_has_k2_gradient(kind):
    rng = np.random.default_rng(4)
    logp = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
    logp_ref = logp + jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
    value = losses.kl_penalty(logp, logp_ref, kind)
    np.testing.assert_allclose(
        np.asarray(value), np.asarray(losses.kl_penalty(logp, logp_ref, kind[:-1])), rtol=RTOL
    )
    grad = jax.grad(lambda lp: losses.kl_penalty(lp, logp_ref, kind).sum())(logp)
    grad_k2 = jax.grad(lambda lp: losses.kl_penalty(lp, logp_ref, "k2").sum())(logp)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_k2), rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="allowed"):
        losses.kl_penalty(logp, logp_ref, "k4")


def test_entropy__matches_numpy():
    rng = np.random.default_rng(5)
    logits = rng.normal(scale=3.0, size=(2, 3, 11)).astype(np.float32)
    logits[0, 0] += 1e4  # large offsets must not overflow
    logits[1, 2, :5] = -np.inf  # masked vocabulary entries
    x = logits.astype(np.float64)
    want = np.zeros((2, 3))
    for idx in np.ndindex(2, 3):
        row = x[idx] - np.max(x[idx])
        logz = math.log(sum(math.exp(v) for v in row))
        want[idx] = -sum(math.exp(v - logz) * (v - logz) for v in row if np.isfinite(v))
    got = losses.entropy_from_logits(jnp.asarray(logits))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    mask = jnp.asarray([[True, False, True], [True, True, False]])
    tok = losses.token_entropy(jnp.asarray(logits), mask)
    np.testing.assert_allclose(np.asarray(tok), want * np.asarray(mask), rtol=1e-4, atol=1e-5)
    grad = jax.grad(lambda lg: losses.entropy_from_logits(lg).sum())(jnp.asarray(logits))
    assert np.all(np.isfinite(np.asarray(grad)))
    # Uniform over V -> log V; temperature scales the logits.
    np.testing.assert_allclose(float(losses.entropy_from_logits(jnp.zeros(11))), math.log(11))
    hot = losses.entropy_from_logits(jnp.asarray(logits[0, 1]), temperature=1e3)
    np.testing.assert_allclose(float(hot), math.log(11), rtol=1e-3)


# ---- dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", losses.names())
def test_policy_losses__bf16_inputs_compute_in_f32(name):
    # The documented f32 loss and metrics, computed as from the same values in f32.
    rng = np.random.default_rng(0)
    lp = jnp.asarray(-rng.random((2, 8)), jnp.bfloat16)
    adv = jnp.asarray(rng.normal(size=(2, 8)), jnp.bfloat16)
    mask = jnp.asarray(rng.random((2, 8)) < 0.7)
    fn = losses.get(name)
    loss, metrics = fn(lp, lp - 0.1, adv, mask)
    want, want_metrics = fn(*(x.astype(jnp.float32) for x in (lp, lp - 0.1, adv)), mask)
    assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in metrics.values())
    np.testing.assert_allclose(loss, want, rtol=RTOL, atol=ATOL)
    for key, value in want_metrics.items():
        np.testing.assert_allclose(metrics[key], value, rtol=RTOL, atol=ATOL)


def test_value_loss_and_kl__bf16_inputs_compute_in_f32():
    rng = np.random.default_rng(1)
    v = jnp.asarray(rng.normal(size=(2, 8)), jnp.bfloat16)
    mask = jnp.asarray(rng.random((2, 8)) < 0.7)
    loss, metrics = losses.value_loss(v, v + 0.3, v + 1.0, mask)
    assert loss.dtype == jnp.float32 and all(m.dtype == jnp.float32 for m in metrics.values())
    kl = losses.kl_penalty(v, v + 0.1, "k3")
    want = losses.kl_penalty(v.astype(jnp.float32), (v + 0.1).astype(jnp.float32), "k3")
    assert kl.dtype == jnp.float32
    np.testing.assert_allclose(kl, want, rtol=RTOL, atol=ATOL)
