"""SAPO's soft gate (docs/methods.md, `sapo`): hand-derived values and gradients, and a NumPy
loop reference written from the formula. The properties every registered policy loss has
(finite, jit, masking, weights) run over `sapo` in tests/losses/test_policy_variants.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import losses

RTOL, ATOL = 1e-5, 1e-6


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo__hand_values_and_gradient():
    # One row, A = [1, 1, -1], ratios [1, 2, 0.5]; default temperatures 1.0 / 1.05.
    #   token 0: l = -(4/1) sig(0) = -2;              dl/dlogp = -A 4 s(1-s) r = -1
    #   token 1: l = -4 sig(1);                       dl/dlogp = -4 s1 (1-s1) 2
    #   token 2: l = +(4/1.05) sig(1.05 * -0.5);      dl/dlogp = +4 s2 (1-s2) 0.5
    # seq-mean-token-mean over one row of 3 tokens: mean of the three.
    ratios = np.array([[1.0, 2.0, 0.5]], np.float32)
    logp = jnp.log(jnp.asarray(ratios))
    old, mask = jnp.zeros_like(logp), jnp.ones((1, 3), bool)
    adv = jnp.asarray([[1.0, 1.0, -1.0]])
    s1, s2 = _sigmoid(1.0), _sigmoid(-0.525)
    loss, m = losses.sapo(logp, old, adv, mask)
    np.testing.assert_allclose(float(loss), (-2.0 - 4 * s1 + 4 / 1.05 * s2) / 3, rtol=RTOL)
    gates = [1.0, 4 * s1 * (1 - s1), 4 * s2 * (1 - s2)]
    np.testing.assert_allclose(float(m["sapo_gate"]), sum(gates) / 3, rtol=RTOL)
    np.testing.assert_allclose(float(m["ratio_mean"]), 3.5 / 3, rtol=RTOL)
    grad = jax.grad(lambda lp: losses.sapo(lp, old, adv, mask)[0])(logp)
    want = [-1.0 / 3, -gates[1] * 2.0 / 3, gates[2] * 0.5 / 3]
    np.testing.assert_allclose(np.asarray(grad[0]), want, rtol=RTOL, atol=ATOL)


def test_sapo__on_policy_gradient_is_the_policy_gradient():
    # rho = 1 everywhere: the gate is 1, so the gradient is -A / n per token (the REINFORCE
    # gradient of `reinforce` with token-mean), whatever the temperatures.
    rng = np.random.default_rng(0)
    logp = jnp.asarray(-np.abs(rng.normal(size=(2, 5))), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
    mask = jnp.ones((2, 5), bool)
    for tau_pos, tau_neg in [(1.0, 1.05), (0.1, 10.0)]:
        grad = jax.grad(
            lambda lp, tp=tau_pos, tn=tau_neg: losses.sapo(
                lp, logp, adv, mask, tau_pos=tp, tau_neg=tn, agg="token-mean"
            )[0]
        )(logp)
        np.testing.assert_allclose(np.asarray(grad), -np.asarray(adv) / 10, rtol=RTOL, atol=ATOL)


def test_sapo__larger_temperature_damps_off_policy_tokens_harder():
    # ratio 1.5: the gate 4 s (1 - s), s = sig(tau 0.5), falls as tau grows; it is never 0
    # (no hard cut-off), unlike ppo_clip's zero gradient past 1 + clip_high.
    logp = jnp.log(jnp.asarray([[1.5]], jnp.float32))
    old, adv, mask = jnp.zeros_like(logp), jnp.ones_like(logp), jnp.ones((1, 1), bool)
    gates = [
        float(losses.sapo(logp, old, adv, mask, tau_pos=tau)[1]["sapo_gate"])
        for tau in (0.5, 1.0, 4.0, 16.0)
    ]
    assert all(a > b > 0 for a, b in zip(gates, gates[1:]))
    np.testing.assert_allclose(gates[1], 4 * _sigmoid(0.5) * (1 - _sigmoid(0.5)), rtol=RTOL)


def _sapo_loop(logp, logp_old, adv, mask, w, tau_pos, tau_neg):
    """The formula token by token, then seq-mean-token-mean (rows with a masked token)."""
    per_row = []
    for i in range(logp.shape[0]):
        idx = np.nonzero(mask[i])[0]
        if len(idx) == 0:
            continue
        total = 0.0
        for t in idx:
            r = math.exp(min(max(float(logp[i, t] - logp_old[i, t]), -20.0), 20.0))
            a = float(adv[i, t])
            tau = tau_pos if a > 0 else tau_neg
            total += float(w[i, t]) * -a * (4.0 / tau) * _sigmoid(tau * (r - 1.0))
        per_row.append(total / len(idx))
    return sum(per_row) / max(len(per_row), 1)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.3, 2.0)])
def test_sapo__matches_loop_reference(taus):
    rng = np.random.default_rng(3)
    logp = -np.abs(rng.normal(size=(4, 9))).astype(np.float32)
    logp_old = (logp + rng.normal(scale=0.7, size=(4, 9))).astype(np.float32)
    adv = rng.normal(size=(4, 9)).astype(np.float32)
    mask = rng.random((4, 9)) < 0.6
    mask[0, :2] = True
    mask[3] = False  # an empty row is left out of the sequence mean
    w = rng.uniform(0.0, 2.0, size=(4, 9)).astype(np.float32)
    loss, _ = losses.sapo(logp, logp_old, adv, mask, w, tau_pos=taus[0], tau_neg=taus[1])
    want = _sapo_loop(logp, logp_old, adv, mask, w, *taus)
    np.testing.assert_allclose(float(loss), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "hparams, pattern",
    [({"tau_pos": 0.0}, r"tau_pos=0.0; allowed: > 0"), ({"tau_neg": -1.0}, r"tau_neg=-1.0")],
)
def test_sapo__bad_temperature_is_refused_at_validation(hparams, pattern):
    with pytest.raises(ValueError, match=r"loss\.sapo: " + pattern):
        losses.validate("sapo", hparams)
