"""rl4agents.envs.instructions against the environments themselves, each built with the
settings of its own config (`configs/<env>.py`, what zero-shot evaluation runs):

  * every quoted string of an instruction is one of its examples or symbols;
  * every example action is valid (`TimeStep.valid_action`) when stepped from real reset
    states, and a junk reply on the same states is not;
  * every symbol shows in the text of real observations: resets, the oracle's episode from a
    reset, and the reply to one invalid action (some symbols, such as the maze's goal or
    Sokoban's box on a target, only show once the agent has moved).

Environments use an exact character-level tokenizer, so decoded observations are the
environment's text, and actions must equal a listed action string (the strict match; a chat
tokenizer's lenient match accepts all of these too).
"""

from __future__ import annotations

import functools
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base_policy
from rl4agents import config_utils, envs
from rl4agents.envs import instructions
from tests.envs.chars import CharTokenizer

ENVS = (*base_policy.ENVS, "guess_number")  # the base policy's ten and the example
B = 16  # reset states per check
WIDTH = 32  # action token budget: the longest example is 25 characters
JUNK = "jump"


TOK = CharTokenizer()


def _settings(name: str) -> dict:
    config = importlib.import_module(f"configs.{name}").get_config()
    return config_utils.to_dict(config.env[name])


@functools.cache
def _setup(name: str):
    """(env, instruction, jitted vmapped reset, jitted vmapped step) under the config."""
    settings = _settings(name)
    env = envs.make(name, tokenizer=TOK, **settings)
    params = env.default_params("test")
    reset = jax.jit(jax.vmap(lambda k: env.reset(k, params)))
    step = jax.jit(
        jax.vmap(lambda s, a, n: env.step(jax.random.key(0), s, a, n, params), (0, 0, 0))
    )
    return env, instructions.get(name, settings), reset, step


def _tokens(text: str) -> tuple[np.ndarray, int]:
    ids = TOK.encode(text)
    assert len(ids) <= WIDTH, text
    row = np.full((WIDTH,), TOK.pad_id, np.int32)
    row[: len(ids)] = ids
    return row, len(ids)


def _step_all(step, states, action: str):
    """Every state of the batch stepped with the same action text."""
    row, n = _tokens(action)
    batch = jax.tree.leaves(states)[0].shape[0]
    return step(states, jnp.asarray(np.tile(row, (batch, 1))), jnp.full((batch,), n, jnp.int32))


def _decode(obs_tokens, obs_len) -> list[str]:
    obs, lens = np.asarray(obs_tokens), np.asarray(obs_len)
    return [TOK.decode(row[:n]) for row, n in zip(obs, lens)]


def _take(states, i: int):
    return jax.tree.map(lambda x: x[i], states)


def _stack(states: list):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def _resets(name: str, seed: int = 0):
    env, _, reset, _ = _setup(name)
    return reset(jax.random.split(jax.random.key(seed), B))


def _states_for(name: str, example: str):
    """The reset states an example is checked on: every one of B, except where validity
    depends on the state (countdown's calc needs both numbers held; two_agent's moves are
    walker turns, which follow the guide's first turn)."""
    env, _, _, step = _setup(name)
    states, _ = _resets(name)
    if name == "countdown" and example.startswith("calc"):
        _, a, _, b = example.split()
        keep = [
            i
            for i, nums in enumerate(np.asarray(states.numbers).tolist())
            if int(a) in nums
            and int(b) in (nums[: nums.index(int(a))] + nums[nums.index(int(a)) + 1 :])
        ]
        assert keep, f"no reset state of {B} holds {a} and {b}"
        return _stack([_take(states, i) for i in keep])
    if name == "two_agent" and not example.startswith("say"):
        states, ts = _step_all(step, states, "say stay")
        assert np.all(np.asarray(ts.valid_action)) and not np.any(np.asarray(ts.done))
    return states


def test_names__every_jitted_environment_has_one():
    assert instructions.names() == envs.registry.names() == sorted(ENVS)


@pytest.mark.parametrize("name", ENVS)
def test_instruction__quotes_only_its_examples_and_symbols(name):
    inst = instructions.get(name, _settings(name))
    quoted = re.findall(r'"([^"]*)"', inst.text)
    assert set(quoted) == set(inst.examples) | set(inst.symbols)
    assert inst.examples and len(set(inst.examples)) == len(inst.examples)
    assert inst.text.rstrip().endswith("only.") and "Reply with the" in inst.text
    # 2 to 6 sentences: the ". " ends outside quotes and "e.g.", and the final period.
    sentences = re.sub(r'"[^"]*"|e\.g\.', "Q", inst.text).count(". ") + 1
    assert 2 <= sentences <= 6, (name, sentences)


@pytest.mark.parametrize("name", ENVS)
def test_examples__valid_actions_of_the_environment(name):
    env, inst, _, step = _setup(name)
    for example in inst.examples:
        states = _states_for(name, example)
        _, ts = _step_all(step, states, example)
        assert np.all(np.asarray(ts.valid_action)), (name, example)
        _, junk = _step_all(step, states, JUNK)
        assert not np.any(np.asarray(junk.valid_action)), (name, example)


def _observations(name: str) -> str:
    """The text of B reset observations, the replies to a junk action on them, and the
    observations of the oracle's episodes from every reset, and of a walk of the examples
    drawn at random from the resets (sokoban's player reaches a target only that way)."""
    env, inst, _, step = _setup(name)
    states, first = _resets(name)
    texts = _decode(first.obs_tokens, first.obs_len)
    _, junk = _step_all(step, states, JUNK)
    texts += _decode(junk.obs_tokens, junk.obs_len)
    for i in range(B):
        state = _take(states, i)
        plan = env.oracle_actions(jax.device_get(state)) or []
        for action in plan:
            ids = np.asarray(env.action_tokens(action))
            row, n = _tokens(TOK.decode(ids))
            batch_state = _stack([state])
            batch_state, ts = step(batch_state, jnp.asarray(row[None]), jnp.asarray([n]))
            state = _take(batch_state, 0)
            texts += _decode(ts.obs_tokens, ts.obs_len)
    rng = np.random.default_rng(0)
    walk = states
    for _ in range(12):
        walk, ts = _step_all(step, walk, inst.examples[rng.integers(len(inst.examples))])
        texts += _decode(ts.obs_tokens, ts.obs_len)
    return "\n".join(texts)


@pytest.mark.parametrize("name", ENVS)
def test_symbols__shown_in_the_observations(name):
    _, inst, _, _ = _setup(name)
    seen = _observations(name)
    missing = [s for s in inst.symbols if s not in seen]
    assert not missing, (name, missing, seen[:400])


def test_settings__grid_layout_follows_the_config():
    # frozen_lake: 4x4 compact (configs/frozen_lake.py) -> 16 cells without row breaks.
    compact = instructions.get("frozen_lake", {"compact": True}).text
    assert "its 16 cells written row by row with no line breaks" in compact
    assert "first 4 characters are the top row" in compact
    assert "one row of cells per line" in instructions.get("frozen_lake").text
    windowed = instructions.get("frozen_lake", {"view_radius": 2})
    assert "the 5x5 cells around you" in windowed.text and "#" in windowed.symbols
    # sokoban: size 6 compact -> the 4x4 interior, 16 cells; maze view_radius 2 -> 5x5.
    assert "its 16 cells" in instructions.get("sokoban", {"size": 6, "compact": True}).text
    assert "the 5x5 cells around you" in instructions.get("maze", {"view_radius": 2}).text
    assert "in 4 guesses" in instructions.get("wordle", {"max_guesses": 4}).text
    assert "from 0 to 60" in instructions.get("countdown", {"max_value": 60}).text


def test_get__refuses_unknown_names_and_settings():
    with pytest.raises(KeyError, match=r"no instruction for environment 'chess'; known: \["):
        instructions.get("chess")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['sizes'\]"):
        instructions.get("frozen_lake", {"sizes": 4})
