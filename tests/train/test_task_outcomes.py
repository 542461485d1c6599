"""Per-task evaluation outcomes: the rows behind `eval_fn`'s success rates, task by task."""

import jax
import numpy as np
import pytest

from rl4agents import sharding
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from tests.train.test_train import tiny_config


def test_task_outcomes_are_the_rows_of_the_evaluation():
    exp = experiment.build(tiny_config())
    params = exp.init_state(jax.random.key(0)).params
    n = 8
    rates = jax.device_get(exp.eval_fn("test", n)(params, 5))
    rows = jax.device_get(exp.task_outcomes_fn("test", n)(params, 5))
    for mode in experiment.EVAL_MODES:
        for name in ("success", "reward"):
            row = rows[f"{mode}_{name}"]
            assert row.shape == (n,) and row.dtype == np.float32
            np.testing.assert_allclose(row.mean(), rates[f"{mode}_{name}"], rtol=1e-6, atol=1e-7)
    assert set(np.unique(rows["greedy_success"])) <= {0.0, 1.0}
    # The same seed gives the same tasks and keys: the rows are reproducible.
    again = jax.device_get(exp.task_outcomes_fn("test", n)(params, 5))
    np.testing.assert_array_equal(again["sampled_reward"], rows["sampled_reward"])


def test_task_outcomes__in_batches_greedy_rows_equal_one_batch_and_sampled_rows_reproduce():
    exp = experiment.build(tiny_config())
    params = exp.init_state(jax.random.key(0)).params
    whole = jax.device_get(exp.task_outcomes_fn("test", 16)(params, 5))
    split = jax.device_get(exp.task_outcomes_fn("test", 16, batch=8)(params, 5))
    for name in ("success", "reward"):
        np.testing.assert_allclose(split[f"greedy_{name}"], whole[f"greedy_{name}"], atol=1e-6)
        assert split[f"sampled_{name}"].shape == (16,)
    # Sampled rows draw per batch (the rollout key folded with the batch's index): the same
    # batches and seed give the same rows; one batch of all tasks is the plain evaluation.
    again = jax.device_get(exp.task_outcomes_fn("test", 16, batch=8)(params, 5))
    np.testing.assert_array_equal(again["sampled_reward"], split["sampled_reward"])
    # Batch 1 by hand: tasks 8..15 of the evaluation's task keys, rollout key folded with 1.
    env, env_params = exp.env.make_split("test")
    task_stream, rollout_key = experiment.eval_keys(5)
    traj = rollout_lib.rollout(
        jax.random.fold_in(rollout_key, 1),
        exp.step_cfg.graphdef,
        params,
        env,
        env_params,
        exp.eval_rollout_config("test", False, 8),
        task_keys=jax.random.split(task_stream, 16)[8:],
        shard_fn=sharding.batch_constraint(exp.mesh),
    )
    np.testing.assert_allclose(split["sampled_reward"][8:], traj.outcome_reward, atol=1e-6)
    assert len(set(split["sampled_reward"].tolist())) > 1  # rows that can tell tasks apart
    one = jax.device_get(exp.task_outcomes_fn("test", 16, batch=16)(params, 5))
    np.testing.assert_array_equal(one["sampled_reward"], whole["sampled_reward"])
    with pytest.raises(ValueError, match=r"batch=3 for 16 tasks; allowed: 0 \(all at once\)"):
        exp.task_outcomes_fn("test", 16, batch=3)
