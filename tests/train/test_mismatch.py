"""Mismatch corrections in the train step (docs/methods.md, "Mismatch corrections (MIS,
IcePop)"): dropped tokens leave every term's denominator (unlike TIS's zero-weight tokens),
the config selects and checks them, and a step runs with each.

Uses the shared tiny experiment of tests/train/test_step_options.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.losses import mismatch
from rl4agents.train import experiment
from tests.train.test_step_options import (
    assert_finite,
    base_state,
    build,
    loss_fn,
    one_device_mesh,
    prepare_fn,
    rollout_fn,
    tiny_config,
    variant,
)


def build_with(name: str, overrides=None, **fields):
    """The tiny experiment with `mismatch.name = name` and `mismatch.<name>.<field>` set."""
    c = tiny_config(**(overrides or {}))
    c.unlock()
    c.mismatch.name = name
    for field, value in fields.items():
        c.mismatch[name][field] = value
    c.lock()
    return experiment.build(c, mesh=one_device_mesh())


def _shifted_traj(state):
    """A rollout whose sampler log-probs are moved on action tokens by [+1.0, -0.1, 0, ...]
    cycling, so the learner/sampler ratio is e^-1, e^0.1 or 1 (the learner is the sampler)."""
    traj = rollout_fn()(jax.random.key(4), state.params)
    mask = np.asarray(traj.action_mask)
    shift = np.zeros(mask.shape, np.float32)
    cycle = np.array([1.0, -0.1, 0.0], np.float32)
    shift[mask] = cycle[np.arange(mask.sum()) % 3]
    return traj.replace(logp_behavior=traj.logp_behavior + jnp.asarray(shift)), mask, shift


def test_mis_token__dropped_tokens_leave_every_denominator():
    state = base_state()
    traj, full_mask, shift = _shifted_traj(state)
    fn = functools.partial(mismatch.mis_token, low=0.5, high=2.0)  # e^-1 = 0.37 leaves
    cfg = variant(mismatch_fn=fn)
    batch, metrics = jax.device_get(prepare_fn(cfg)(state, traj))
    t = batch.tokens.shape[1]
    full, dropped = full_mask[:, :t], (shift[:, :t] == 1.0) & full_mask[:, :t]
    assert dropped.any() and (full & ~dropped).any()
    np.testing.assert_array_equal(batch.action_mask, full & ~dropped)
    np.testing.assert_allclose(metrics["mismatch/kept_frac"], 1 - dropped.sum() / full.sum())
    # The kept tokens carry the ratio e^{-shift}; the learner's log-probs are the PPO anchor.
    keep = batch.action_mask
    np.testing.assert_allclose(batch.weights[keep], np.exp(-shift[:, :t][keep]), rtol=1e-4)
    np.testing.assert_array_equal(batch.weights[~keep], 0.0)
    learner = np.asarray(traj.logp_behavior)[:, :t] - shift[:, :t]
    np.testing.assert_allclose(batch.logp_old[keep], learner[keep], atol=1e-5)

    # Token-mean terms: the same tokens with weight 0 but still on the mask (what TIS with a
    # zero weight would do) sum to the same numerator over a larger denominator.
    _, m_mis = jax.device_get(loss_fn(cfg)(state.params, batch))
    as_tis = batch._replace(action_mask=jnp.asarray(full))
    _, m_tis = jax.device_get(loss_fn(cfg)(state.params, as_tis))
    n_keep, n_full = keep.sum(), full.sum()
    assert abs(float(m_mis["pg_loss"])) > 1e-6
    np.testing.assert_allclose(m_mis["pg_loss"] * n_keep, m_tis["pg_loss"] * n_full, rtol=1e-4)
    # The entropy term (no weights) is the mean over the kept tokens alone.
    assert not np.isclose(m_mis["entropy"], m_tis["entropy"], rtol=1e-6)


def test_train_step__each_correction_runs_and_keeps_every_token_without_a_mismatch():
    # The jitted rollout samples with the learner's own parameters: every ratio is 1 up to
    # float error, inside every band.
    for name in mismatch.names():
        exp = build_with(name)
        assert exp.step_cfg.loss.mismatch_fn.func is mismatch.get(name)
        state = exp.init_state(jax.random.key(0))
        _, metrics = exp.train_step(state, exp.root_key())
        assert_finite(metrics)
        assert float(metrics["mismatch/kept_frac"]) == 1.0, name


def test_build__mismatch_hyperparameters_reach_the_step():
    exp = build_with("mis_sequence", high=3.0)
    assert exp.step_cfg.loss.mismatch_fn.keywords == {"low": 0.0, "high": 3.0}
    assert build().step_cfg.loss.mismatch_fn is None  # the default: "none"


@pytest.mark.parametrize(
    "name, overrides, fields, pattern",
    [
        ("tis", {}, {}, r"mismatch\.name='tis' is not allowed; allowed: \['none', 'icepop'"),
        ("icepop", {"loss.tis_cap": 2.0}, {}, r"mismatch\.name='icepop' with loss\.tis_cap=2"),
        ("icepop", {}, {"low": 1.5}, r"mismatch\.icepop: low=1\.5; allowed: in \[0, 1\]"),
        ("mis_token", {}, {"high": 0.5}, r"mismatch\.mis_token: high=0\.5; allowed: >= 1"),
    ],
    ids=["unknown", "with_tis", "low", "high"],
)
def test_build__rejects_bad_mismatch_settings(name, overrides, fields, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_with(name, overrides, **fields)
