"""The train step's guard against non-finite values: a step whose rewards, loss, gradient norm
or updated state are not finite returns its input state, bit for bit, and says why in its
metrics; the loop then stops without saving (tests/train/test_lifecycle.py).

The reviewer's repros, each on one update of the shared tiny experiment of
tests/train/test_step_options.py (one compiled update program per variant): a sampling
temperature of 1e-40, a learning rate of 1e38, an entropy coefficient of 1e38, and an
environment that returns inf / nan rewards.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rl4agents import envs
from rl4agents.envs import frozen_lake
from rl4agents.train import loop
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib
from tests import scripts
from tests.train.test_step_options import base_exp, base_state, rollout_fn, step_rollout_key
from tests.train.test_train import loop_config


@functools.cache
def _traj():
    """Episodes of the shared experiment's initial policy."""
    return rollout_fn()(step_rollout_key(base_exp()), base_state().params)


@functools.cache
def _update(name: str = "base"):
    """jit `(state, traj) -> (state, metrics)`: `step.update` under `_variant(name)`."""
    cfg = _variant(name)
    return jax.jit(lambda state, traj: step_lib.update(state, traj, jax.random.key(1), cfg))


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _assert_same(a, b):
    for x, y in zip(_host(a), _host(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _until_rejected(name, traj, max_updates=4):
    """Updates the shared initial state on `traj` until an update is rejected: returns the
    number of updates taken, that update's input state, output state and metrics."""
    state = base_state()
    for n in range(1, max_updates + 1):
        before = jax.device_get(state)
        state, metrics = _update(name)(state, traj)
        metrics = jax.device_get(metrics)
        if metrics["nonfinite"]:
            return n, before, state, metrics
    raise AssertionError(f"no update of {max_updates} was rejected: {metrics}")


def test_update__healthy_step_is_accepted():
    state = base_state()
    before = jax.device_get(state)
    new, metrics = _update()(state, _traj())
    metrics = jax.device_get(metrics)
    assert metrics["nonfinite"] == 0 and metrics["nonfinite_rewards"] == 0
    assert metrics["nonfinite_state"] == 0
    assert int(new.step) == 1
    assert any(np.any(x != y) for x, y in zip(_host(before.params), _host(new.params)))


def _variant(name: str) -> step_lib.StepConfig:
    cfg = base_exp().step_cfg
    if name == "base":
        return cfg
    if name == "temperature=1e-40":
        return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, temperature=1e-40))
    if name == "lr=1e38":
        return dataclasses.replace(cfg, optimizer=state_lib.make_optimizer(lr=1e38))
    if name == "entropy_coef=1e38":
        return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, entropy_coef=1e38))
    raise ValueError(name)


@pytest.mark.parametrize(
    "name, quantity",
    [("temperature=1e-40", "loss"), ("lr=1e38", None), ("entropy_coef=1e38", "grad_norm")],
)
def test_update__nonfinite_step_keeps_its_input_state(name, quantity):
    n, before, after, metrics = _until_rejected(name, _traj())
    _assert_same(after, before)  # params, optimizer state and step: the last good ones
    assert int(after.step) == n - 1
    assert metrics["nonfinite"] == 1 and metrics["nonfinite_rewards"] == 0
    if quantity is not None:  # the quantity named first by the loop's message
        assert not np.isfinite(metrics[quantity]), metrics


def test_update__nonfinite_rewards_are_refused_and_counted():
    traj = _traj()
    rewards = traj.turn_rewards.at[0, 0].set(jnp.inf).at[3, 1].set(jnp.nan)
    bad = traj.replace(turn_rewards=rewards, outcome_reward=rewards.sum(axis=1))
    state = base_state()
    before = jax.device_get(state)
    after, metrics = _update()(state, bad)
    metrics = jax.device_get(metrics)
    assert metrics["nonfinite"] == 1 and metrics["nonfinite_rewards"] == 2
    _assert_same(after, before)
    # Only the outcome (or only a turn) reward non-finite is refused too.
    one = traj.replace(outcome_reward=traj.outcome_reward.at[5].set(-jnp.inf))
    _, metrics = _update()(base_state(), one)
    assert float(metrics["nonfinite_rewards"]) == 1


def test_all_finite_and_keep_if():
    tree = {"a": jnp.ones(3), "n": jnp.arange(3), "b": jnp.array([1.0, jnp.nan])}
    assert not bool(step_lib.all_finite(tree))
    assert bool(step_lib.all_finite({"a": jnp.ones(3), "n": jnp.arange(3), "none": None}))
    old = state_lib.TrainState(jnp.int32(4), {"w": jnp.ones(2)}, (), None)
    new = state_lib.TrainState(jnp.int32(5), {"w": jnp.full(2, jnp.nan)}, (), None)
    assert int(step_lib.keep_if(jnp.bool_(True), old, new).step) == 4
    kept = step_lib.keep_if(jnp.bool_(False), old, new)
    assert int(kept.step) == 5 and np.isnan(kept.params["w"]).all()


def _train_cli(workdir, *flags):
    return subprocess.run(
        scripts.train_argv(
            workdir,
            "--config.rollout.group_size=2",
            "--config.train.num_steps=12",
            "--config.train.eval_every=100",
            "--config.checkpoint.every=1",
            "--config.checkpoint.max_to_keep=2",
            *flags,
        ),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _finite_checkpoint(path) -> bool:
    import orbax.checkpoint as ocp

    restored = ocp.StandardCheckpointer().restore(os.path.abspath(path / "default"))
    leaves = [np.asarray(x) for x in jax.tree.leaves(restored)]
    return all(np.isfinite(x).all() for x in leaves if np.issubdtype(x.dtype, np.floating))


# End to end through scripts/train.py, a checkpoint every step: ~1-2 minutes of compiling each.
@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--config.optim.lr=1e38", "--config.rollout.temperature=1e-40"])
def test_train_cli__nonfinite_run_stops_with_one_line_and_good_checkpoints(tmp_path, flag):
    out = _train_cli(tmp_path, flag)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 1, out.stdout + out.stderr
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "non-finite" in errors[0] and "parameters kept from step" in errors[0], errors
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] is False and summary["stopped"] == errors[0][len("error: ") :]
    steps = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit())
    # The rejected step is not saved; the last good step is (and max_to_keep=2 kept it).
    last = f"last good checkpoint: step {steps[-1]}" if steps else "last good checkpoint: none"
    assert (steps or [0])[-1] == summary["steps"] and errors[0].endswith(last), (steps, errors)
    assert all(_finite_checkpoint(tmp_path / "checkpoints" / str(s)) for s in steps)


class _InfRewardLake(frozen_lake.FrozenLake):
    """FrozenLake paying -inf for an invalid action and +inf at the goal (what
    `env.frozen_lake.goal_reward=inf` did before the config checks refused it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        inf = float("inf")
        self.config = dataclasses.replace(self.config, goal_reward=inf, invalid_penalty=inf)


_InfRewardLake.__signature__ = inspect.signature(frozen_lake.FrozenLake)  # its config fields


@pytest.mark.slow  # a train step of its own to compile (~30 s)
def test_loop__nonfinite_reward_stops_naming_the_environment(tmp_path, monkeypatch):
    # Registered for this test only: tests that go over every registered environment
    # (tests/envs/test_constructor_bounds.py) run in the same worker process.
    monkeypatch.setitem(envs.registry._REGISTRY, "inf_reward_lake_test", _InfRewardLake)
    c = loop_config()
    with c.unlocked():
        c.env.name = "inf_reward_lake_test"
        c.env.inf_reward_lake_test = ml_collections.ConfigDict(c.env.frozen_lake.to_dict())
    summary = loop.run(c, str(tmp_path), quiet=True)
    # An untrained policy takes invalid actions in its first step's 8 episodes.
    assert summary["stopped"].startswith(
        "non-finite reward from environment 'inf_reward_lake_test' at step 1 ("
    ), summary
    assert summary["stopped"].endswith("parameters kept from step 0; last good checkpoint: none")
    assert not summary["finished"] and summary["steps"] == 0
    assert not [s for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()]
