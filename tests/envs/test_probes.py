"""Reward-gaming probes: degenerate scripted policies must not score well in any environment.

For every registered environment (default constructor, test split, 16 turns): junk actions
every turn never succeed and never earn a positive return; no single action repeated every
turn (answering at once, spamming a tool, one move forever) succeeds on more than a fifth of
the tasks; a uniformly random valid policy stays well below the oracle (which solves every
task: each environment's own tests check that).
"""

import jax
import numpy as np
import pytest

from rl4agents.envs import frozen_lake, probes, registry

TASKS = 64
TURNS = 16


@pytest.mark.parametrize("name", registry.names())
def test_probes__degenerate_policies_do_not_score(name):
    env = registry.make(name)
    env, params = env.make_split("test")
    rep = probes.probe_report(env, params, TASKS, TURNS, jax.random.key(0), max_constant=32)
    assert rep["invalid"]["success"] == 0.0, rep
    assert rep["invalid"]["reward"] <= 0.0, rep
    assert rep["invalid"]["invalid"] == 1.0, rep
    assert rep["constant"]["success"] <= 0.2, rep
    assert rep["random"]["success"] <= 0.35, rep


def test_play__hand_checked_on_frozen_lake():
    env = frozen_lake.FrozenLake(size=4, hole_prob=0.0, invalid_penalty=0.05)
    params = env.default_params("train")
    keys = jax.random.split(jax.random.key(0), 4)
    # Junk every turn: 5 invalid turns, each -0.05, never done.
    out = probes.play(env, params, keys, jax.random.key(1), 5, probes.always_invalid)
    np.testing.assert_allclose(out["reward"], -0.25, rtol=1e-6)
    np.testing.assert_array_equal(out["turns"], 5.0)
    np.testing.assert_array_equal(out["invalid"], 1.0)
    # "right" forever walks to the top-right corner and stays: never the goal.
    out = probes.play(env, params, keys, jax.random.key(1), 8, probes.constant(3))
    np.testing.assert_array_equal(out["success"], 0.0)
    # The oracle's plan on a hole-free 4x4 map: down x3, right x3 reaches the goal.
    plan = np.array([1, 1, 1, 3, 3, 3])

    def scripted(key, turn, n):
        del key, n
        return jax.numpy.asarray(plan)[jax.numpy.minimum(turn, 5)]

    out = probes.play(env, params, keys, jax.random.key(1), 8, scripted)
    np.testing.assert_array_equal(out["success"], 1.0)
    np.testing.assert_array_equal(out["turns"], 6.0)  # absorbing after the goal


def test_steps_per_second__positive_and_finite():
    env = frozen_lake.FrozenLake(size=4)
    sps = probes.steps_per_second(env, env.default_params("train"), batch=64, turns=4, repeats=1)
    assert np.isfinite(sps) and sps > 0
