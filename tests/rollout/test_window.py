"""Context management: the sliding-window (step-row) rollout and the episode token budget."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from tests.toy_env import RepeatDigit

ENV = RepeatDigit(num_turns=3)
FULL = rollout_lib.RolloutConfig(num_tasks=3, group_size=2, max_turns=4, max_action_len=3)


@functools.lru_cache
def _params():
    model_cfg = policy_lib.make_config("tiny", ENV.tokenizer.vocab_size)
    return nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))


@functools.lru_cache
def _run(cfg: rollout_lib.RolloutConfig, seed: int = 0):
    graphdef, params = _params()
    fn = jax.jit(
        lambda key, p: rollout_lib.rollout_rows(key, graphdef, p, ENV, ENV.default_params(), cfg)
    )
    return jax.device_get(fn(jax.random.key(seed), params))


def _window(k):
    return dataclasses.replace(FULL, context="window", window_turns=k)


def test_window__covering_all_turns_equals_full_history():
    full, rows = _run(FULL)
    assert rows is None
    win, rows = _run(_window(FULL.max_turns))
    # Same keys, same packed context: the same episodes and log-probs.
    np.testing.assert_array_equal(full.tokens, win.tokens)
    np.testing.assert_allclose(full.logp_behavior, win.logp_behavior, atol=1e-5)
    np.testing.assert_array_equal(full.turn_rewards, win.turn_rewards)


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_window__rows_logp_equal_teacher_forced_pass(k):
    traj, rows = _run(_window(k), seed=1)
    graphdef, params = _params()
    b, turns, length = rows.tokens.shape
    assert length == rollout_lib.window_row_length(ENV, _window(k))
    score = jax.jit(lambda p, t, v: rollout_lib.score(nnx.merge(graphdef, p), t, v))
    scores = score(
        params,
        jnp.asarray(rows.tokens.reshape(-1, length)),
        jnp.asarray(rows.valid.reshape(-1, length)),
    )
    mask = rows.action_mask.reshape(-1, length)
    assert mask.sum() > 10
    np.testing.assert_allclose(
        np.asarray(scores.logp)[mask], rows.logp.reshape(-1, length)[mask], atol=2e-5
    )
    # The rows' action tokens are the episodes' action tokens, turn by turn.
    lay = rollout_lib.make_layout(ENV, _window(k))
    moved = rollout_lib.rows_to_slots(jnp.asarray(rows.tokens), lay)
    act = traj.action_mask
    np.testing.assert_array_equal(np.asarray(moved)[act], traj.tokens[act])
    np.testing.assert_array_equal(
        np.asarray(rollout_lib.rows_to_slots(jnp.asarray(rows.action_mask), lay)), act
    )


def test_window__row_holds_prompt_and_last_k_turns_only():
    k = 1
    traj, rows = _run(_window(k), seed=2)
    lay = rollout_lib.make_layout(ENV, _window(k))
    blk = lay.action + lay.obs
    for b in range(traj.tokens.shape[0]):
        for turn in range(int(traj.num_turns[b])):
            row_valid = rows.valid[b, turn]
            context = rows.tokens[b, turn][row_valid][: -int(rows.action_mask[b, turn].sum())]
            prompt = traj.tokens[b, : lay.prompt][traj.valid_mask[b, : lay.prompt]]
            if turn == 0:
                want = prompt
            else:
                s = lay.prompt + (turn - 1) * blk
                prev = traj.tokens[b, s : s + blk][traj.valid_mask[b, s : s + blk]]
                want = np.concatenate([prompt, prev])
            np.testing.assert_array_equal(context, want)


def test_window__obs_targets_never_count_a_token_twice():
    traj, rows = _run(_window(2), seed=3)
    lay = rollout_lib.make_layout(ENV, _window(2))
    blk = lay.action + lay.obs
    for b in range(traj.tokens.shape[0]):
        n = int(traj.num_turns[b])
        # Observations after turns 0..n-2 are each the newest observation of one later row;
        # the one after the last turn is in no row.
        obs = traj.obs_mask[b, lay.prompt :].reshape(-1, blk)[:n]
        want = int(obs[: n - 1].sum()) if n > 1 else 0
        assert int(rows.obs_target[b].sum()) == want
        for turn in range(1, n):
            got = rows.tokens[b, turn][rows.obs_target[b, turn]]
            s = lay.prompt + (turn - 1) * blk
            want_tok = traj.tokens[b, s : s + blk][traj.obs_mask[b, s : s + blk]]
            np.testing.assert_array_equal(got, want_tok)


def test_slots_rows_round_trip_on_action_slots():
    traj, rows = _run(_window(2), seed=4)
    lay = rollout_lib.make_layout(ENV, _window(2))
    x = jnp.asarray(np.random.default_rng(0).normal(size=traj.tokens.shape), jnp.float32)
    length = rows.tokens.shape[2]
    back = rollout_lib.rows_to_slots(rollout_lib.slots_to_rows(x, lay, length), lay)
    act = np.asarray(traj.action_mask)
    np.testing.assert_allclose(np.asarray(back)[act], np.asarray(x)[act])
    # Off the action slots of the episodes nothing comes back.
    blocks = np.asarray(back)[:, lay.prompt :].reshape(x.shape[0], lay.turns, -1)
    assert np.all(blocks[:, :, lay.action :] == 0) and np.all(
        np.asarray(back)[:, : lay.prompt] == 0
    )


@pytest.mark.parametrize("context", ["full", "window"])
def test_episode_token_budget(context):
    budget = 4
    cfg = dataclasses.replace(FULL, context=context, window_turns=1, max_episode_tokens=budget)
    traj, _ = _run(cfg, seed=5)
    used = traj.action_mask.sum(axis=1)
    assert used.max() <= budget
    over = used >= budget
    # An episode that spent its budget stops; unless the env ended it, it is truncated.
    assert np.all(traj.truncated[over] | traj.done[over])
    unlimited, _ = _run(dataclasses.replace(cfg, max_episode_tokens=0), seed=5)
    assert unlimited.action_mask.sum(axis=1).max() > budget


def test_window__bad_settings_raise():
    with pytest.raises(ValueError, match="window_turns=0.*allowed: >= 1"):
        _run(dataclasses.replace(_window(1), window_turns=0))
    with pytest.raises(ValueError, match="context='sliding'.*allowed"):
        _run(dataclasses.replace(FULL, context="sliding"))
    with pytest.raises(ValueError, match="max_context_len=5 is too short for a step row"):
        rollout_lib.make_layout(ENV, dataclasses.replace(_window(2), max_context_len=5))
