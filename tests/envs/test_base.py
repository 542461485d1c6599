"""The environment base (rl4agents/envs/base.py): split ids and params, the settings helper,
the split predicate, the bits-to-uniform conversion generators rely on, and what `TextEnv`
asks of a subclass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import base


def test_split_id__names_and_unknown_split():
    assert [base.split_id(s) for s in base.SPLITS] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"unknown split 'val'; allowed splits: \['train'"):
        base.split_id("val")


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_uniform_from_bits__matches_jax_random_uniform_and_bernoulli(shape):
    key = jax.random.key(11)
    bits = jax.random.bits(key, shape, jnp.uint32)
    u = base.uniform_from_bits(bits)
    np.testing.assert_array_equal(u, jax.random.uniform(key, shape))
    np.testing.assert_array_equal(u < 0.3, jax.random.bernoulli(key, 0.3, shape))
    assert u.dtype == jnp.float32 and ((u >= 0) & (u < 1)).all()


def test_in_split_class__train_test_and_either():
    hashes = jnp.arange(1000, dtype=jnp.uint32)
    test = np.asarray(base.in_split_class(hashes, 200, jnp.int32(1)))
    train = np.asarray(base.in_split_class(hashes, 200, jnp.int32(0)))
    assert test.sum() == 200 and test[:200].all() and (train == ~test).all()
    assert np.asarray(base.in_split_class(hashes, 200, jnp.int32(2))).all()


@dataclasses.dataclass(frozen=True)
class _Config:
    size: int = 3
    test_fraction: float = 0.2


class _Partial(base.TextEnv):
    """Only the constructor: what the base asks for raises naming the missing method."""

    def __init__(self, size: int = 3, test_fraction: float = 0.2, tokenizer=None):
        super().__init__(base.settings(_Config, locals()), tokenizer)


def test_text_env__settings_params_and_missing_methods():
    env = _Partial(size=5)
    assert env.config == _Config(size=5) and env.test_threshold == 200
    params = env.default_params("test")
    assert isinstance(params, base.SplitParams) and int(params.split) == 1
    same, train = env.make_split("train")
    assert same is env and int(train.split) == 0
    with pytest.raises(NotImplementedError, match="_Partial does not implement ood_config"):
        env.make_split("ood")
    with pytest.raises(NotImplementedError, match="does not implement reset_env"):
        env.reset(jax.random.key(0), params)
    with pytest.raises(NotImplementedError, match="does not implement fragment_tables"):
        env.fragment_tables()
    with pytest.raises(ValueError, match="unknown split"):
        env.make_split("dev")
