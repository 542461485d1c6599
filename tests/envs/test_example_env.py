"""The worked example of docs/extending.md ("Add an environment"): the `guess_number`
environment, whose module `rl4agents/envs/guess_number.py` is the document's code block
letter for letter.

It must stay within 250 lines, satisfy the environment protocol, keep its constructor defaults
equal to its settings dataclass, and pass the contract (jitted and vmapped episodes at static
shapes, absorbing after `done`), the split (disjoint train and test secrets, a wider OOD range)
and its oracle over every generated task. As a registered environment it also goes through
the registry-wide tests (tests/envs/test_contract.py, test_fuzz.py, ...).
"""

import dataclasses
import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import base, guess_number, registry

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "extending.md"
B, K = 64, 10  # episodes per batch, turns per episode


def _example_source() -> str:
    """The python block of the document that defines `GuessNumber`."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (source,) = [b for b in blocks if "class GuessNumber(base.TextEnv)" in b]
    return source


@pytest.fixture(scope="module")
def module():
    return guess_number


@pytest.fixture(scope="module")
def env(module):
    return module.GuessNumber()


def _action(env, value: int, width: int):
    tokens = np.full((width,), env.tokenizer.pad_id, np.int32)
    ids = env.action_tokens(value)
    tokens[: len(ids)] = ids
    return jnp.asarray(tokens), jnp.asarray(len(ids), jnp.int32)


def test_example__fits_in_250_lines_and_is_the_shipped_module():
    assert len(_example_source().splitlines()) <= 250
    assert _example_source() == pathlib.Path(guess_number.__file__).read_text()
    assert registry.get("guess_number") is guess_number.GuessNumber


def test_example__implements_the_protocol_with_one_source_of_settings(module, env):
    assert isinstance(env, base.Environment)
    params = inspect.signature(module.GuessNumber).parameters
    defaults = {k: p.default for k, p in params.items() if k != "tokenizer"}
    assert defaults == dataclasses.asdict(module.GuessNumberConfig())
    assert env.config == module.GuessNumberConfig()
    assert env.num_actions == 64 and env.max_action_len == 2  # "6" "3"
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        module.GuessNumber(max_turns=0)
    with pytest.raises(ValueError, match="unknown split 'val'"):
        env.make_split("val")


def test_example__hand_played_episode(env):
    width = env.max_action_len + 1
    params = env.default_params("train")
    state, first = jax.jit(env.reset)(jax.random.key(0), params)
    assert first.obs_tokens.shape == (env.max_prompt_len,) and not first.done
    secret = int(state.secret)
    step = jax.jit(env.step)
    wrong = (secret + 1) % (env.config.max_value + 1)
    state, ts = step(jax.random.key(1), state, *_action(env, wrong, width), params)
    reply = "lower" if wrong > secret else "higher"
    expected = env.tokenizer.encode(reply) + env.tokenizer.encode("\n")
    assert np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist() == expected
    assert ts.valid_action and not ts.done
    junk = jnp.full((width,), env.tokenizer.pad_id, jnp.int32)
    state, ts = step(jax.random.key(2), state, junk, jnp.asarray(1), params)
    assert not ts.valid_action and float(ts.reward) == pytest.approx(-0.1)
    state, ts = step(jax.random.key(3), state, *_action(env, secret, width), params)
    assert ts.done and ts.success and float(ts.reward) == 1.0
    # Absorbing: the state stays, nothing is observed, no reward.
    again, ts = step(jax.random.key(4), state, *_action(env, secret, width), params)
    assert int(ts.obs_len) == 0 and float(ts.reward) == 0.0 and ts.done
    assert int(again.turn) == int(state.turn) == 3
    assert (
        env.render(state) == f"secret {secret} in [{int(state.low)}, {int(state.high)}], turn 3/8\n"
    )


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_example__oracle_solves_every_task_of_disjoint_splits(env, split):
    split_env, params = env.make_split(split)
    width = split_env.max_action_len + 1
    keys = jax.random.split(jax.random.key(7), B)
    states, _ = jax.jit(jax.vmap(split_env.reset, in_axes=(0, None)))(keys, params)
    secrets = set(np.asarray(states.secret).tolist())
    if split != "ood":  # a secret is test-class when its hash % 1000 < 250
        is_test = [int(text.hash_u32(jnp.asarray(s, jnp.int32))) % 1000 < 250 for s in secrets]
        assert all(t == (split == "test") for t in is_test), (split, secrets)
    else:
        assert max(secrets) > env.config.max_value
    step = jax.jit(split_env.step)
    for i in range(B):
        state = jax.tree.map(lambda x, i=i: x[i], states)
        plan = split_env.oracle_actions(state)
        assert plan is not None and len(plan) <= 7
        for value in plan:
            state, ts = step(jax.random.key(0), state, *_action(split_env, value, width), params)
        assert bool(state.solved) and bool(ts.success) and float(ts.reward) == 1.0


def test_example__random_episodes_keep_static_shapes_and_finite_rewards(env):
    width = env.max_action_len + 1
    params = env.default_params("train")

    def episode(key):
        state, first = env.reset(key, params)

        def turn(state, k):
            pick, kind = jax.random.split(k)
            value = jax.random.randint(pick, (), 0, env.num_actions)
            table = jnp.asarray(env.action_table.tokens)
            tokens = jnp.full((width,), env.tokenizer.pad_id, jnp.int32)
            tokens = tokens.at[: table.shape[1]].set(table[value])
            length = jnp.asarray(env.action_table.lengths)[value]
            length = jnp.where(jax.random.bernoulli(kind, 0.8), length, 1)
            return env.step(k, state, tokens, length, params)

        return first, jax.lax.scan(turn, state, jax.random.split(key, K))[1]

    first, steps = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(3), B))
    assert first.obs_tokens.shape == (B, env.max_prompt_len)
    assert steps.obs_tokens.shape == (B, K, env.max_obs_len)
    assert np.isfinite(np.asarray(steps.reward)).all()
    done = np.asarray(steps.done)
    assert done[:, -1].all()  # 8 turns at most
    after = np.concatenate([np.zeros((B, 1), bool), done[:, :-1]], axis=1)
    assert (np.asarray(steps.obs_len)[after] == 0).all()
    assert (np.asarray(steps.reward)[after] == 0).all()
