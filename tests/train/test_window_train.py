"""Every estimator trains on both layouts: with a window covering every turn, the step-row
update equals the full-history update (token-mean aggregation)."""

import dataclasses

import jax
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.credit import tree as credit_tree
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import objective as objective_lib
from rl4agents.train import sampling as sampling_lib
from tests.train.test_train import tiny_config

FAST = ["grpo", "ppo_gae"]
SLOW = [n for n in credit.names() if n not in FAST]


def _losses(name):
    over = {"credit.name": name, "model.num_layers": 1}  # one layer compiles faster
    if credit.requires_values(name):
        over["model.value_head"] = "shared"
    if credit_tree.requires_tree(name):  # the update below trains on a plain rollout
        over["rollout.branch.rule"] = "every"
    full = experiment.build(tiny_config(**over))
    win = experiment.build(
        tiny_config(**over, **{"rollout.context": "window", "rollout.window_turns": 3})
    )
    state = full.init_state(jax.random.key(0))
    # a non-zero value projection (it starts at 0), so that the critic's values enter the
    # advantages and the value loss
    state = state.replace(
        params=jax.tree.map(
            lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, state.params
        )
    )
    # the update of a plain rollout (a no-op but for the tree estimators' branching)
    wc, fc = (
        dataclasses.replace(e.step_cfg, branch=None, train_roots_only=False) for e in (win, full)
    )

    @jax.jit
    def run(state, key):
        traj, rows = rollout_lib.rollout_rows(
            key, wc.graphdef, state.params, wc.env, wc.env_params, wc.rollout
        )
        if credit.requires_greedy(name):
            traj = sampling_lib.greedy_baseline(key, state.params, traj, wc, None)
        b_full, _ = objective_lib.prepare_batch(state, traj, fc)
        b_win, _ = objective_lib.prepare_batch(state, traj, wc, rows)
        return (
            objective_lib.loss_fn(state.params, b_full, fc)[1],
            objective_lib.loss_fn(state.params, b_win, wc)[1],
            b_win,
        )

    return run(state, jax.random.key(1))


def _check(name):
    m_full, m_win, b_win = _losses(name)
    assert b_win.tokens.shape[0] == 4 * 2 * 3  # B * K step rows
    for key in ("loss", "pg_loss", "entropy", "kl_ref"):
        np.testing.assert_allclose(float(m_win[key]), float(m_full[key]), rtol=1e-4, atol=1e-6)
    if credit.requires_values(name):
        values = np.asarray(b_win.values_old)[np.asarray(b_win.action_mask)]
        assert np.abs(values).max() > 1e-3
        np.testing.assert_allclose(
            float(m_win["value_loss"]), float(m_full["value_loss"]), rtol=1e-4, atol=1e-6
        )


@pytest.mark.parametrize("name", FAST)
def test_window_update_equals_full_history(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_window_update_equals_full_history__all_estimators(name):
    _check(name)


def test_window_train_step_runs():
    over = {"rollout.context": "window", "rollout.window_turns": 1, "model.num_layers": 1}
    exp = experiment.build(tiny_config(**over))
    state = exp.init_state(jax.random.key(0))
    state, metrics = exp.train_step(state, exp.root_key())
    assert all(np.isfinite(float(v)) for v in jax.device_get(metrics).values())
