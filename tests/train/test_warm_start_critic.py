"""A policy saved without a value head starts a run that has one (`sft.load_params` with
`fresh`): the policy's tensors come from the saved ones, the head's from the run's own
initialisation, or the separate critic's decoder from the saved policy (`critic_init`)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from rl4agents.models import policy as policy_lib
from rl4agents.train import sft

KEYS = ("model.value_head", "model.d_model")


def _params(value_head: str, seed: int):
    cfg = policy_lib.ModelConfig(
        vocab_size=24,
        d_model=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        d_ff=32,
        tie_embeddings=False,
        value_head=value_head,
    )
    return nnx.split(policy_lib.Policy(cfg, nnx.Rngs(seed)))[1]


def _config(value_head: str) -> str:
    return json.dumps({"model": {"value_head": value_head, "d_model": 16}})


def _assert_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


@pytest.fixture()
def saved(tmp_path):
    params = _params("none", seed=1)
    sft.save_params(str(tmp_path), params, 7, _config("none"), KEYS)
    return str(tmp_path), params


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_value_head_from_the_runs_initialisation(saved, value_head):
    directory, params = saved
    fresh = _params(value_head, seed=2)
    out = sft.load_params(directory, fresh, _config(value_head), KEYS, fresh=fresh)
    # The run's own tree, node types included (the jitted step's shardings are built on it).
    assert jax.tree.structure(out) == jax.tree.structure(fresh)
    for k in params.keys():
        _assert_equal(out[k], params[k])
    for k in sft.VALUE_HEAD_KEYS:
        if k in fresh:
            _assert_equal(out[k], fresh[k])
    # The saved and fresh policies differ, so the check above is not vacuous.
    with pytest.raises(AssertionError):
        _assert_equal(fresh["model"], params["model"])


def test_separate_critic_copies_the_saved_policy_decoder(saved):
    directory, params = saved
    fresh = _params("separate", seed=2)
    out = sft.load_params(
        directory, fresh, _config("separate"), KEYS, fresh=fresh, critic_init="policy"
    )
    _assert_equal(out["critic"], params["model"])
    _assert_equal(out["model"], params["model"])
    _assert_equal(out["value_proj"], fresh["value_proj"])


def test_without_fresh_a_value_head_mismatch_is_refused(saved):
    directory, _ = saved
    fresh = _params("separate", seed=2)
    with pytest.raises(ValueError, match="value_head"):
        sft.load_params(directory, fresh, _config("separate"), KEYS)


def test_unknown_critic_init_is_refused(saved):
    directory, _ = saved
    fresh = _params("separate", seed=2)
    with pytest.raises(ValueError, match="init.critic='copy'; allowed"):
        sft.load_params(
            directory, fresh, _config("separate"), KEYS, fresh=fresh, critic_init="copy"
        )


def test_saved_before_a_compat_key_existed__loads_with_its_default(tmp_path):
    # A base saved before `model.role_params` existed (no such field in its config) starts a
    # run whose config has the field at its default; any other value is refused.
    from rl4agents.train import experiment

    keys = (*KEYS, "model.role_params")
    params = _params("none", seed=1)
    sft.save_params(str(tmp_path), params, 7, _config("none"), KEYS)
    run = json.dumps({"model": {"value_head": "none", "d_model": 16, "role_params": 0}})
    defaults = experiment.COMPAT_DEFAULTS
    assert defaults["model.role_params"] == 0
    out = sft.load_params(str(tmp_path), params, run, keys, compat_defaults=defaults)
    _assert_equal(out, params)
    with pytest.raises(ValueError, match=r"model.role_params: stored <missing>, new 0"):
        sft.load_params(str(tmp_path), params, run, keys)
    two = json.dumps({"model": {"value_head": "none", "d_model": 16, "role_params": 2}})
    with pytest.raises(ValueError, match=r"model.role_params: stored 0, new 2"):
        sft.load_params(str(tmp_path), params, two, keys, compat_defaults=defaults)
