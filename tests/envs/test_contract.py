"""Contract every registered environment must satisfy (after jumanji's env_not_smoke).

For each name in `registry.names()`: static sizes, splits, jitted and vmapped reset/step that trace
once, PAD-padded observations within their static lengths, finite rewards, and absorbing `done`.
Every env declares the whole protocol (`envs.base.Environment`), with its settings in one
place: the constructor's defaults are its settings dataclass's. Episodes mix the env's valid
actions (`num_actions`, `action_tokens`) with random token strings, so they both terminate and
exercise the invalid-action path.
"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import envs, text
from rl4agents.envs import base, registry

B = 16  # episodes
K = 48  # turns


def _valid_action_table(env, width):
    """int32[N, width] tokens and int32[N] lengths of the env's valid actions."""
    num = env.num_actions
    tokens = np.full((max(num, 1), width), env.tokenizer.pad_id, np.int32)
    lengths = np.zeros((max(num, 1),), np.int32)
    for i in range(num):
        ids = np.asarray(env.action_tokens(i))
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return tokens, lengths, num


def _rollout_fn(env, width):
    """jit(vmap(rollout)) over B episodes of K turns; the turn's action is valid w.p. 3/4."""
    table, table_lens, num_valid = _valid_action_table(env, width)
    vocab = env.tokenizer.vocab_size

    def rollout(key, params):
        key_reset, key_turns = jax.random.split(key)
        state, first = env.reset(key_reset, params)

        def _turn(state, key):
            key_pick, key_tokens, key_len, key_kind, key_step = jax.random.split(key, 5)
            pick = jax.random.randint(key_pick, (), 0, max(num_valid, 1))
            random_tokens = jax.random.randint(key_tokens, (width,), 0, vocab)
            random_len = jax.random.randint(key_len, (), 0, width + 1)
            use_valid = jax.random.bernoulli(key_kind, 0.75 if num_valid else 0.0)
            tokens = jnp.where(use_valid, jnp.asarray(table)[pick], random_tokens)
            length = jnp.where(use_valid, jnp.asarray(table_lens)[pick], random_len)
            new, ts = env.step(key_step, state, tokens, length, params)
            return new, (state, new, ts)

        _, (before, after, steps) = jax.lax.scan(_turn, state, jax.random.split(key_turns, K))
        return first, before, after, steps

    return jax.jit(jax.vmap(rollout, in_axes=(0, None)))


def test_envs_package__reexports_registry():
    assert envs.make is registry.make and envs.names is registry.names
    assert envs.register is registry.register
    assert {"frozen_lake", "sokoban"} <= set(registry.names())
    with pytest.raises(KeyError, match="known environments"):
        registry.make("no_such_env")


@pytest.mark.parametrize("name", registry.names())
def test_env_contract__declares_the_protocol_and_one_set_of_settings(name):
    env = registry.make(name)
    assert isinstance(env, base.Environment) and isinstance(env, base.TextEnv)
    assert isinstance(env.num_actions, int) and env.num_actions > 0
    for action in (0, env.num_actions - 1):
        assert 1 <= len(env.action_tokens(action)) <= env.max_action_len
    tables = env.fragment_tables()
    assert tables and all(isinstance(t, text.FragmentTable) for t in tables)
    # The constructor's keyword arguments are the settings dataclass's fields, same defaults.
    params = inspect.signature(type(env)).parameters
    signature = {k: p.default for k, p in params.items() if k != "tokenizer"}
    fields = {f.name: f.default for f in dataclasses.fields(env.config)}
    assert signature == fields
    assert dataclasses.asdict(env.config) == fields  # built from the defaults
    ood_env, _ = env.make_split("ood")
    assert type(ood_env) is type(env) and ood_env.config == env.ood_config()


@pytest.mark.parametrize("name", registry.names())
def test_env_contract__static_attributes_and_splits(name):
    env = registry.make(name)
    for attr in ("max_prompt_len", "max_obs_len", "max_action_len"):
        value = getattr(env, attr)
        assert isinstance(value, int) and value > 0, (attr, value)
    assert env.tokenizer.pad_id is not None
    for split in ("train", "test", "ood"):
        split_env, params = env.make_split(split)
        # Shapes only (traced, not compiled): every split resets and steps at its static sizes.
        state, first = jax.eval_shape(split_env.reset, jax.random.key(0), params)
        assert first.obs_tokens.shape == (split_env.max_prompt_len,)
        action = jnp.zeros((split_env.max_action_len + 1,), jnp.int32)
        _, ts = jax.eval_shape(
            split_env.step, jax.random.key(0), state, action, jnp.asarray(1), params
        )
        assert ts.obs_tokens.shape == (split_env.max_obs_len,)
        assert all(x.shape == () for x in ts[1:]), ts
    with pytest.raises(ValueError, match="bogus"):
        env.make_split("bogus")
    with pytest.raises(ValueError, match="bogus"):
        env.default_params("bogus")


@pytest.mark.parametrize("name", registry.names())
def test_env_contract__random_episodes_are_wellformed_and_absorbing(name):
    env = registry.make(name)
    width = env.max_action_len + 2  # room for junk beyond the longest action
    rollout = _rollout_fn(env, width)
    params = env.default_params("train")
    pad = env.tokenizer.pad_id
    for seed in range(2):  # a second call must not retrace
        first, before, after, ts = rollout(jax.random.split(jax.random.key(seed), B), params)
    assert rollout._cache_size() == 1

    # reset
    assert first.obs_tokens.shape == (B, env.max_prompt_len) and first.obs_tokens.dtype == jnp.int32
    assert (np.asarray(first.obs_len) > 0).all()
    assert not np.asarray(first.done).any() and np.asarray(first.valid_action).all()
    assert (np.asarray(first.reward) == 0).all() and first.anchor.dtype == jnp.uint32
    # step: dtypes and shapes
    assert ts.obs_tokens.shape == (B, K, env.max_obs_len) and ts.obs_tokens.dtype == jnp.int32
    for field, dtype in (("obs_len", jnp.int32), ("reward", jnp.float32), ("done", bool)):
        assert getattr(ts, field).shape == (B, K) and getattr(ts, field).dtype == dtype
    assert ts.anchor.dtype == jnp.uint32
    assert ts.valid_action.dtype == bool and ts.success.dtype == bool
    # observations: padded exactly beyond obs_len, within bounds
    obs_len, obs = np.asarray(ts.obs_len), np.asarray(ts.obs_tokens)
    assert ((obs_len >= 0) & (obs_len <= env.max_obs_len)).all()
    beyond = np.arange(env.max_obs_len) >= obs_len[..., None]
    assert (obs[beyond] == pad).all() and (obs[~beyond] != pad).all()
    assert np.isfinite(np.asarray(ts.reward)).all()
    assert not np.asarray(ts.valid_action).all()  # random strings were rejected
    # absorbing: once done, state frozen, no reward, empty observation, done stays set
    done = np.asarray(ts.done)
    was_done = np.concatenate([np.zeros((B, 1), bool), done[:, :-1]], axis=1)
    assert done[was_done].all()
    assert (np.asarray(ts.reward)[was_done] == 0).all() and (obs_len[was_done] == 0).all()
    assert not np.asarray(ts.success)[was_done].any()
    for leaf_before, leaf_after in zip(
        jax.tree.leaves(before), jax.tree.leaves(after), strict=True
    ):
        b, a = np.asarray(leaf_before)[was_done], np.asarray(leaf_after)[was_done]
        np.testing.assert_array_equal(a, b)
    assert done.any(axis=1).sum() >= 2, done.any(axis=1)  # so absorption is exercised
    decoded = env.tokenizer.decode(np.asarray(first.obs_tokens[0]))
    assert isinstance(decoded, str) and decoded
    state0 = jax.tree.map(lambda x: np.asarray(x)[0, 0], before)
    assert isinstance(env.render(state0), str) and env.render(state0)
