"""The optimizer of `config.optim` (`rl4agents.train.state.make_optimizer`): Adam's moves on a
zero gradient, derived by hand, and `optim.skip_zero_grad`, which makes such a step no step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from configs import base
from rl4agents.train import resolve
from rl4agents.train import state as state_lib

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8
G1 = np.array([1.0, -2.0, 0.5], np.float32)
G4 = np.array([-0.5, 0.25, 1.0], np.float32)


def _run(grads, skip: bool):
    """(params, state) after the updates `grads` from params 0, no clipping."""
    opt = state_lib.make_optimizer(lr=LR, b1=B1, b2=B2, grad_clip=0.0, skip_zero_grad=skip)
    params = {"w": jnp.zeros(3)}
    state = opt.init(params)
    step = jax.jit(opt.update)
    for g in grads:
        updates, state = step({"w": jnp.asarray(g)}, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params, state


def _adam_by_hand(grads):
    """Adam's parameters after `grads` (bias-corrected moments, no weight decay)."""
    w, m, v = np.zeros(3), np.zeros(3), np.zeros(3)
    for t, g in enumerate(grads, start=1):
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        m_hat, v_hat = m / (1 - B1**t), v / (1 - B2**t)
        w = w - LR * m_hat / (np.sqrt(v_hat) + EPS)
    return w


def test_adam__keeps_moving_on_a_zero_gradient_by_hand():
    zero = np.zeros(3, np.float32)
    params, _ = _run([G1, zero, zero], skip=False)
    np.testing.assert_allclose(params["w"], _adam_by_hand([G1, zero, zero]), rtol=1e-5)
    # The second and third steps saw no gradient and still moved every parameter, by
    # 0.1 * (0.4737 / 0.7069 + 0.2989 / 0.5771) = 0.119 in all: more than the first step's
    # 0.1 (bias-corrected m_hat / sqrt(v_hat) after one gradient: 0.4737 g / 0.7069 |g| on
    # step 2, 0.2989 g / 0.5771 |g| on step 3).
    after_one, _ = _run([G1], skip=False)
    moved = np.abs(np.asarray(params["w"] - after_one["w"]))
    np.testing.assert_allclose(
        moved, np.full(3, 0.1 * (0.4737 / 0.7069 + 0.2989 / 0.5771)), rtol=1e-3
    )


def test_skip_zero_grad__a_zero_gradient_is_no_step():
    zero = np.zeros(3, np.float32)
    skipped, s_state = _run([G1, zero, zero, G4], skip=True)
    plain, p_state = _run([G1, G4], skip=False)  # the same run without the empty steps
    np.testing.assert_array_equal(skipped["w"], plain["w"])
    for a, b in zip(jax.tree.leaves(s_state), jax.tree.leaves(p_state)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(skipped["w"], _adam_by_hand([G1, G4]), rtol=1e-5)
    # Nonzero gradients (one component 0 is not an empty update) are applied as without it.
    partial = np.array([0.0, 1.0, 0.0], np.float32)
    a, _ = _run([G1, partial], skip=True)
    b, _ = _run([G1, partial], skip=False)
    np.testing.assert_array_equal(a["w"], b["w"])


def test_config__optim_skip_zero_grad_reaches_the_optimizer():
    c = base.get_config()
    c.optim.lr = LR
    c.optim.grad_clip = 0.0
    params = {"w": jnp.ones(3)}
    zero = {"w": jnp.zeros(3)}
    for skip, still in ((False, False), (True, True)):
        c.optim.skip_zero_grad = skip
        opt = resolve.optimizer(c)
        state = opt.init(params)
        _, state = opt.update({"w": jnp.asarray(G1)}, state, params)
        updates, _ = opt.update(zero, state, params)
        assert bool(np.all(np.asarray(updates["w"]) == 0)) is still
