"""EPO entropy smoothing (docs/methods.md, "EPO entropy smoothing"): the penalty and the
running average by hand, the penalty in the loss as an exact gradient identity, the average
kept in the training state across steps, and the config checks.

Uses the shared tiny experiment of tests/train/test_step_options.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.losses import regularizers
from rl4agents.train import objective as objective_lib
from rl4agents.train import step as step_lib
from tests.train.test_step_options import (
    assert_finite,
    base_state,
    build,
    loss_fn,
    prepare_fn,
    rollout_fn,
    variant,
)


@pytest.mark.parametrize(
    "h, want, slope", [(0.5, 0.3, -1.0), (0.9, 0.0, 0.0), (1.1, 0.0, 0.0), (1.5, 0.3, 1.0)]
)
def test_entropy_smoothing_penalty__hand(h, want, slope):
    # Hbar = 1, band [0.8, 1.2]: 0 inside, the distance to the band outside.
    avg = jnp.float32(1.0)
    got = regularizers.entropy_smoothing_penalty(jnp.float32(h), avg)
    np.testing.assert_allclose(float(got), want, atol=1e-6)
    grad = jax.grad(lambda x: regularizers.entropy_smoothing_penalty(x, avg))(jnp.float32(h))
    assert float(grad) == slope
    # The average is a constant: no gradient flows to it.
    assert float(jax.grad(lambda a: regularizers.entropy_smoothing_penalty(h, a))(avg)) == 0.0


def test_running_entropy_avg__first_step_sets_then_ema():
    state = jnp.zeros(2)
    state = regularizers.running_entropy_avg(state, jnp.float32(2.0), 0.9)
    np.testing.assert_allclose(state, [2.0, 1.0])
    state = regularizers.running_entropy_avg(state, jnp.float32(1.0), 0.9)
    np.testing.assert_allclose(state, [0.9 * 2.0 + 0.1 * 1.0, 2.0], rtol=1e-6)


def _epo_state(cfg, avg, seen):
    return base_state().replace(entropy_avg=jnp.asarray([avg, seen], jnp.float32))


def test_loss__below_the_band_the_penalty_is_an_extra_entropy_bonus():
    # With H < low * Hbar, coef * P = coef * (low Hbar - H): the gradient is that of an entropy
    # bonus raised by coef, and the loss differs by coef * low * Hbar (a constant).
    coef, avg = 0.5, 100.0
    cfg = variant(epo_coef=coef)
    state = _epo_state(cfg, avg, 1.0)
    traj = rollout_fn()(jax.random.key(4), state.params)
    batch, _ = prepare_fn(cfg)(state, traj)
    np.testing.assert_array_equal(np.asarray(batch.entropy_avg), [[avg, 1.0]] * 8)
    plain = variant(entropy_coef=cfg.loss.entropy_coef + coef)

    def grad(c):
        return jax.jit(jax.grad(lambda p, b: objective_lib.loss_fn(p, b, c)[0]))

    g_epo = grad(cfg)(state.params, batch)
    g_plain = grad(plain)(state.params, batch._replace(entropy_avg=None))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g_epo, g_plain
    )
    loss, m = jax.device_get(loss_fn(cfg)(state.params, batch))
    loss_plain, _ = jax.device_get(loss_fn(plain)(state.params, batch._replace(entropy_avg=None)))
    np.testing.assert_allclose(loss - loss_plain, coef * 0.8 * avg, rtol=1e-5)
    np.testing.assert_allclose(m["epo_penalty"], 0.8 * avg - m["entropy"], rtol=1e-5)


def test_loss__no_penalty_before_the_average_has_seen_a_step():
    cfg = variant(epo_coef=0.5)
    state = _epo_state(cfg, 0.0, 0.0)  # initial_entropy_avg: zeros
    traj = rollout_fn()(jax.random.key(4), state.params)
    batch, _ = prepare_fn(cfg)(state, traj)
    loss, m = jax.device_get(loss_fn(cfg)(state.params, batch))
    loss_off, _ = jax.device_get(loss_fn(variant())(state.params, batch._replace(entropy_avg=None)))
    assert float(m["epo_penalty"]) == 0.0
    np.testing.assert_allclose(loss, loss_off, rtol=1e-6)


def test_update__keeps_the_running_average_in_the_state():
    exp = build(**{"loss.epo_coef": 0.1})
    cfg = exp.step_cfg
    assert (cfg.loss.epo_coef, cfg.loss.epo_decay) == (0.1, 0.9)
    np.testing.assert_array_equal(step_lib.initial_entropy_avg(cfg.loss), [0.0, 0.0])
    assert step_lib.initial_entropy_avg(build().step_cfg.loss) is None
    state = exp.init_state(jax.random.key(0))  # a fresh run's state carries the average
    np.testing.assert_array_equal(state.entropy_avg, [0.0, 0.0])
    update = jax.jit(lambda s, t, k: step_lib.update(s, t, k, cfg))
    entropies = []
    for i in range(3):
        traj = rollout_fn()(jax.random.key(10 + i), state.params)
        state, metrics = update(state, traj, jax.random.key(i))
        assert_finite(metrics)
        entropies.append(float(metrics["entropy"]))
    want = entropies[0]
    for h in entropies[1:]:
        want = 0.9 * want + 0.1 * h
    np.testing.assert_allclose(state.entropy_avg, [want, 3.0], rtol=1e-5)
    np.testing.assert_allclose(metrics["epo_entropy_avg"], want, rtol=1e-5)


def test_update__without_the_state_field_says_what_to_do():
    cfg = variant(epo_coef=0.1)
    state = base_state()  # entropy_avg None
    traj = rollout_fn()(jax.random.key(4), state.params)
    with pytest.raises(ValueError, match=r"epo_coef > 0 needs TrainState\.entropy_avg"):
        prepare_fn(cfg)(state, traj)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"loss.epo_coef": -0.1}, r"loss\.epo_coef=-0\.1; allowed: >= 0 \(0 = off\)"),
        ({"loss.epo_decay": 1.0}, r"loss\.epo_decay=1\.0; allowed: in \[0, 1\)"),
        ({"loss.epo_low": 1.5}, r"loss\.epo_low=1\.5; allowed: in \[0, 1\]"),
        ({"loss.epo_high": 0.9}, r"loss\.epo_high=0\.9; allowed: >= 1"),
    ],
    ids=["coef", "decay", "low", "high"],
)
def test_build__rejects_bad_epo_settings(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        build(**overrides)
