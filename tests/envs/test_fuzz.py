"""Property-based fuzzing of every registered environment with hypothesis.

Hypothesis draws whole episodes of actions, each turn one of: a valid command, a valid command
mutated (a token replaced, cut short, or junk appended), any token string of any length up to
the action width, or arbitrary text through the env's tokenizer. Whatever it draws, the jitted
step must not raise, rewards stay finite, observations stay within their static length with
in-vocabulary tokens and PAD after, `done` is absorbing (state, reward and success frozen),
episodes are deterministic given their key, and `render` describes the final state. A failing
case is shrunk to a minimal episode and printed.
"""

import functools

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl4agents.envs import registry

K = 10  # turns per fuzzed episode
SETTINGS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,  # the same cases on every run (CI); `-p hypothesis` options can widen it
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@functools.cache
def _setup(name: str, split: str):
    """The split's env and params, its valid-action table, and a jitted K-turn episode."""
    env, params = registry.make(name).make_split(split)
    width = env.max_action_len + 2  # longer than any valid action: overlong strings too
    num = env.num_actions
    table = [list(np.asarray(env.action_tokens(i))) for i in range(num)]

    def episode(key, tokens, lengths):
        key_reset, key_steps = jax.random.split(key)
        state, first = env.reset(key_reset, params)

        def turn(state, inp):
            tok, length, k = inp
            new, ts = env.step(k, state, tok, length, params)
            return new, (state, new, ts)

        last, (before, after, steps) = jax.lax.scan(
            turn, state, (tokens, lengths, jax.random.split(key_steps, K))
        )
        return first, before, after, steps, last

    return env, jax.jit(episode), table, width


def _action(draw, env, table, width):
    vocab = env.tokenizer.vocab_size
    kinds = ["tokens", "text"] + (["valid", "mutated"] if table else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "valid":
        return draw(st.sampled_from(table))
    if kind == "mutated":
        ids = list(draw(st.sampled_from(table)))
        how = draw(st.sampled_from(["replace", "cut", "append"]))
        if how == "replace":
            ids[draw(st.integers(0, len(ids) - 1))] = draw(st.integers(0, vocab - 1))
        elif how == "cut":
            ids = ids[: draw(st.integers(0, len(ids) - 1))]
        else:
            ids = ids + draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2))
        return ids[:width]
    if kind == "tokens":
        return draw(st.lists(st.integers(0, vocab - 1), max_size=width))
    text = draw(st.text(alphabet=st.characters(codec="ascii"), max_size=3 * width))
    return list(env.tokenizer.encode(text))[:width]


@st.composite
def _episodes(draw, name, split):
    env, _, table, width = _setup(name, split)
    actions = [_action(draw, env, table, width) for _ in range(K)]
    tokens = np.full((K, width), env.tokenizer.pad_id, np.int32)
    for k, ids in enumerate(actions):
        tokens[k, : len(ids)] = ids
    lengths = np.array([len(a) for a in actions], np.int32)
    return draw(st.integers(0, 2**31 - 1)), tokens, lengths


@pytest.mark.parametrize("split", ["train", pytest.param("ood", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", registry.names())
def test_env_fuzz__any_actions_keep_the_contract(name, split):
    env, episode, _, width = _setup(name, split)
    vocab, pad = env.tokenizer.vocab_size, env.tokenizer.pad_id

    @SETTINGS
    @given(_episodes(name, split))
    def check(case):
        seed, tokens, lengths = case
        out = episode(jax.random.key(seed), tokens, lengths)
        first, before, after, steps, last = jax.device_get(out)
        again = jax.device_get(episode(jax.random.key(seed), tokens, lengths))
        for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(again), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # deterministic
        for ts, limit in ((first, env.max_prompt_len), (steps, env.max_obs_len)):
            obs, n = np.atleast_2d(ts.obs_tokens), np.atleast_1d(ts.obs_len)
            assert np.all(np.isfinite(ts.reward))
            assert np.all((n >= 0) & (n <= limit)) and obs.shape[-1] == limit
            inside = np.arange(obs.shape[-1]) < n[:, None]
            assert np.all((obs[inside] >= 0) & (obs[inside] < vocab))
            assert np.all(obs[~inside] == pad)
        done_before = np.concatenate([[bool(first.done)], steps.done[:-1]])
        assert np.all(steps.done[done_before])  # once done, done
        assert np.all(steps.reward[done_before] == 0)  # absorbing: no reward after the end
        for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
            np.testing.assert_array_equal(np.asarray(b)[done_before], np.asarray(a)[done_before])
        assert isinstance(env.render(last), str)

    check()
