"""Staleness as a config knob (`train.staleness` = k): the step samples with the parameters of
k updates ago, kept in `TrainState.stale_params`.

k = 0 is today's step bit for bit; k = 2 samples with the parameters of 2 steps ago (the whole
step equals one that rolls out with those parameters, held here by the test); the ring goes
through a checkpoint and is sharded like the parameters. Uses the shared tiny experiment of
tests/train/test_step_options.py.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from rl4agents import checkpoint as checkpoint_lib
from rl4agents import sharding
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import resolve as resolve_lib
from rl4agents.train import sampling as sampling_lib
from rl4agents.train import step as step_lib
from tests.train.test_step_options import build, one_device_mesh, tiny_config

# A learning rate large enough that one update moves the sampled log-probs visibly.
LR = 0.05


def _step_with(state, key_root, sampler, cfg: step_lib.StepConfig):
    """The train step with its episodes sampled by the explicit parameters `sampler`: the
    rollout, the reward shaping and the update of `step.train_step`, written out."""
    key = jax.random.fold_in(key_root, state.step)
    key_rollout, key_perm = jax.random.split(key)
    shard_fn = sharding.batch_constraint(cfg.mesh)
    traj, rows = rollout_lib.rollout_rows(
        key_rollout, cfg.graphdef, sampler, cfg.env, cfg.env_params, cfg.rollout, shard_fn=shard_fn
    )
    traj = sampling_lib.shape_rewards(traj, cfg)
    return step_lib.update(state, traj, key_perm, cfg, rows)


def _reference(cfg: step_lib.StepConfig):
    """jit `(state, key_root, sampler) -> (state, metrics)` of `_step_with`."""
    return jax.jit(functools.partial(_step_with, cfg=cfg))


def _copy(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _assert_same(a, b, what: str):
    paths = [sharding.path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(a)]
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for path, x, y in zip(paths, jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{what}: {path}")


def test_staleness_0__is_the_on_policy_step_bit_for_bit():
    """k = 0 adds nothing to the state and samples with the current parameters: three steps
    equal, bit for bit in every state leaf and metric, the step written out with
    `state.params` as the sampler."""
    exp = build(**{"optim.lr": LR})
    assert exp.step_cfg.staleness == 0
    root = exp.root_key()
    state = exp.init_state(jax.random.key(0))
    assert state.stale_params is None
    ref_state = _copy(state)
    ref = _reference(exp.step_cfg)
    for _ in range(3):
        ref_state, m_ref = ref(ref_state, root, ref_state.params)
        state, m = exp.train_step(state, root)
        m, m_ref = jax.device_get((m, m_ref))
        assert m.keys() == m_ref.keys()
        for key in m:
            np.testing.assert_array_equal(m[key], m_ref[key], err_msg=key)
        _assert_same(_copy(state), _copy(ref_state), "state")
    assert int(state.step) == 3


def test_staleness_2__samples_with_the_parameters_of_2_steps_ago():
    """With k = 2, step t samples with the parameters before update t - 2 (the initial ones
    for t < 2): every step equals the written-out step given those parameters, and the ring
    then holds the parameters before updates t - 1 and t. Sampling with the current
    parameters instead gives another step (the test can tell them apart)."""
    k = 2
    exp = build(**{"optim.lr": LR, "train.staleness": k})
    cfg = exp.step_cfg
    assert cfg.staleness == k
    root = exp.root_key()
    state = exp.init_state(jax.random.key(0))
    assert len(state.stale_params) == k
    history = [_copy(state.params)]  # history[t]: the parameters before update t
    ref = _reference(cfg)
    differs = []
    for t in range(4):
        sampler = history[max(t - k, 0)]
        expected, m_exp = jax.device_get(ref(_copy(state), root, sampler))
        if t >= k:
            _, m_now = jax.device_get(ref(_copy(state), root, history[t]))
            differs.append(not np.array_equal(m_now["loss"], m_exp["loss"]))
        state, m = jax.device_get(exp.train_step(state, root))
        for key in m:
            np.testing.assert_array_equal(m[key], m_exp[key], err_msg=f"step {t}: {key}")
        _assert_same(_copy(state), _copy(expected), f"step {t}")
        history.append(_copy(state.params))
        for i in range(k):  # entry i: the parameters before update t + 1 - k + i
            _assert_same(
                _copy(state.stale_params[i]), history[max(t + 1 - k + i, 0)], f"ring {t}.{i}"
            )
    assert all(differs) and len(differs) == 2


def test_staleness__ring_is_sharded_like_the_params_and_in_the_abstract_state():
    """On an FSDP x tensor mesh every copy takes the parameters' shardings (no compile)."""
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 2, 2), devices=jax.devices()[:4])
    exp = experiment.build(tiny_config(**{"train.staleness": 3}), mesh=mesh)
    sh = exp.state_shardings
    assert len(sh.stale_params) == 3
    specs = [x.spec for x in jax.tree.leaves(sh.params)]
    assert any(any(axis is not None for axis in spec) for spec in specs)  # not all replicated
    for copy in sh.stale_params:
        assert jax.tree.structure(copy) == jax.tree.structure(sh.params)
        for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(sh.params)):
            assert a == b
    abstract = exp.abstract_state()
    for copy in abstract.stale_params:
        for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(abstract.params)):
            assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding)


def test_staleness__a_checkpoint_of_another_staleness_is_refused(tmp_path):
    """Resuming with the ring is exact (test_step_options.py, test_resume__...[staleness]); a
    run with another staleness cannot take the checkpoint over."""
    exp = build(**{"optim.lr": LR, "train.staleness": 2})
    state1, _ = exp.train_step(exp.init_state(jax.random.key(0)), exp.root_key())
    with checkpoint_lib.Checkpointer(
        tmp_path,
        config_json=exp.config_json,
        compat_keys=experiment.COMPAT_KEYS,
        compat_defaults=experiment.COMPAT_DEFAULTS,
    ) as ckpt:
        ckpt.save(1, state1)
    other = build(**{"optim.lr": LR, "train.staleness": 1})
    with pytest.raises(ValueError, match="train.staleness"):
        checkpoint_lib.Checkpointer(
            tmp_path,
            config_json=other.config_json,
            compat_keys=experiment.COMPAT_KEYS,
            compat_defaults=experiment.COMPAT_DEFAULTS,
        )


def test_staleness__bad_values_and_host_rollouts_are_refused():
    with pytest.raises(ValueError, match=r"train.staleness=-1; allowed: a whole number >= 0"):
        experiment.build(tiny_config(**{"train.staleness": -1}), mesh=one_device_mesh())
    c = tiny_config(**{"train.staleness": 2})
    assert resolve_lib.staleness_setting(c, "jax") == 2
    with pytest.raises(ValueError, match=r"train.staleness=2 .*backend 'host'.*allowed: 0"):
        resolve_lib.staleness_setting(c, "host")


def test_staleness__a_state_without_the_ring_is_refused():
    exp = build(**{"train.staleness": 1})
    state = exp.init_state(jax.random.key(0)).replace(stale_params=None)
    with pytest.raises(ValueError, match="train.staleness=1 needs TrainState.stale_params"):
        step_lib.sampler_params(state, exp.step_cfg)


def test_staleness__a_warm_start_fills_the_ring_with_its_parameters():
    """`loop._start_from` (init.params, model.checkpoint): every stale copy is a separate
    copy of the warm-start parameters, so the first k steps sample with them."""
    from rl4agents.train import loop as loop_lib

    exp = build(**{"train.staleness": 2})
    state = exp.init_state(jax.random.key(0))
    warm = jax.tree.map(lambda x: x + 1.0, state.params)
    started = loop_lib._start_from(state, warm)
    assert len(started.stale_params) == 2
    for copy in started.stale_params:
        _assert_same(_copy(copy), _copy(warm), "warm copy")
        assert all(a is not b for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(warm)))
