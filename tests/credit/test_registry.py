"""Credit registry: errors, validation, and properties every registered variant must have."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit

EXTRA_PAD = 5


def _values(traj, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=traj.tokens.shape).astype(np.float32))


def _call(name, traj, values):
    fn = credit.get(name)
    return fn(traj, values if credit.requires_values(name) else None)


def test_register__duplicate_raises():
    with pytest.raises(ValueError, match="already registered"):
        credit.register("grpo")(lambda traj, values: None)


def test_get__unknown_lists_names():
    with pytest.raises(KeyError, match="grpo.*ppo_gae"):
        credit.get("not_a_variant")


def test_validate__unknown_field_lists_allowed():
    with pytest.raises(ValueError, match=r"\['lamda'\].*'ppo_gae'.*gamma.*lam.*whiten"):
        credit.validate("ppo_gae", {"gamma": 0.9, "lamda": 0.9})
    with pytest.raises(KeyError, match="known"):
        credit.validate("gae_typo", {})


def test_validate__merges_defaults():
    assert credit.validate("grpo", {"scale": "none"}) == {
        "eps": 1e-6,
        "scale": "none",
        "singleton_policy": "raw",
    }
    assert credit.defaults("ppo_gae") == {
        "gamma": 1.0,
        "lam": 1.0,
        "whiten": True,
        "reward_placement": "turn",
    }


def test_requires_values():
    assert credit.requires_values("ppo_gae") and credit.get("ppo_gae").needs_values
    assert not credit.requires_values("grpo")


@pytest.mark.parametrize("name", credit.names())
def test_variant__contract(name, make_traj):
    """Shape, zero off action_mask, finite, jit == eager, padding-invariant, no retrace."""
    traj = make_traj(seed=5)
    values = _values(traj)
    eager = _call(name, traj, values)
    batch, slots = traj.tokens.shape
    chex.assert_shape(eager.advantages, (batch, slots))
    adv, mask = np.asarray(eager.advantages), np.asarray(traj.action_mask)
    assert np.all(np.isfinite(adv)) and np.all(adv[~mask] == 0.0)
    if eager.returns is not None:
        chex.assert_shape(eager.returns, (batch, slots))
        assert np.all(np.isfinite(np.asarray(eager.returns)))
    for value in eager.metrics.values():
        chex.assert_shape(value, ())

    chex.clear_trace_counter()  # the counter is keyed by code, shared across parametrizations

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(traj, values):
        return _call(name, traj, values)

    jitted = run(traj, values)
    np.testing.assert_allclose(np.asarray(jitted.advantages), adv, rtol=1e-5, atol=1e-6)
    run(make_traj(seed=6), _values(traj, seed=1))  # same shapes: must not retrace
    chex.clear_trace_counter()  # a new shape legitimately retraces once

    padded = make_traj(seed=5, extra_pad=EXTRA_PAD)
    values_padded = jnp.pad(values, ((0, 0), (0, EXTRA_PAD)), constant_values=3.0)
    out_padded = run(padded, values_padded)
    np.testing.assert_allclose(
        np.asarray(out_padded.advantages[:, :slots]), adv, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(out_padded.advantages[:, slots:]), 0.0)


@pytest.mark.parametrize("name", credit.names())
def test_variant__vmap_over_leading_axis(name, make_traj):
    trajs = [make_traj(seed=s) for s in (7, 8)]
    values = [_values(t, seed=s) for s, t in enumerate(trajs)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *trajs)
    out = jax.jit(jax.vmap(lambda t, v: _call(name, t, v)))(stacked, jnp.stack(values))
    for i, (traj, v) in enumerate(zip(trajs, values, strict=True)):
        want = _call(name, traj, v).advantages
        np.testing.assert_allclose(
            np.asarray(out.advantages[i]), np.asarray(want), rtol=1e-5, atol=1e-6
        )
