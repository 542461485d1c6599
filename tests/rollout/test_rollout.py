"""Rollout: recorded log-probs equal a teacher-forced pass; masks are exact."""

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
CFG = rollout_lib.RolloutConfig(num_tasks=3, group_size=2, max_turns=4, max_action_len=3)


@functools.lru_cache
def _setup(value_head="none"):
    model_cfg = policy_lib.make_config("tiny", ENV.tokenizer.vocab_size, value_head=value_head)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    run = jax.jit(
        lambda key, p: rollout_lib.rollout(key, graphdef, p, ENV, ENV.default_params(), CFG)
    )
    return graphdef, params, run


@functools.partial(jax.jit, static_argnums=0)
def _score(graphdef, params, tokens, valid_mask):
    """The teacher-forced pass over whole trajectories, jitted (one compile, not one per op)."""
    return rollout_lib.score(nnx.merge(graphdef, params), tokens, valid_mask)


def _traj(seed=0):
    graphdef, params, run = _setup()
    return graphdef, params, run(jax.random.key(seed), params)


def test_rollout__logp_equals_teacher_forced_pass():
    graphdef, params, traj = _traj()
    scores = _score(graphdef, params, traj.tokens, traj.valid_mask)
    mask = np.asarray(traj.action_mask)
    assert mask.sum() > 10
    np.testing.assert_allclose(
        np.asarray(scores.logp)[mask], np.asarray(traj.logp_behavior)[mask], atol=2e-5
    )
    # Off the action mask the behaviour log-prob is exactly zero.
    assert np.all(np.asarray(traj.logp_behavior)[~mask] == 0)


def test_rollout__logp_equals_teacher_forced_pass_in_query_blocks():
    """The update's blocked attention (attn_chunk) reproduces the recorded log-probs too."""
    graphdef, params, traj = _traj()
    assert traj.tokens.shape[1] > 8
    cfg = dataclasses.replace(nnx.merge(graphdef, params).cfg, attn_chunk=4)
    blocked, _ = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
    scores = _score(blocked, params, traj.tokens, traj.valid_mask)
    mask = np.asarray(traj.action_mask)
    np.testing.assert_allclose(
        np.asarray(scores.logp)[mask], np.asarray(traj.logp_behavior)[mask], atol=2e-5
    )


@pytest.mark.parametrize("groups", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_rollout__turn_groups_give_the_same_episodes(groups):
    """A growing cache (turn groups) changes what is computed, not what is sampled."""
    graphdef, params, traj = _traj()
    cfg = dataclasses.replace(CFG, turn_groups=groups)
    grouped = jax.jit(
        lambda key, p: rollout_lib.rollout(key, graphdef, p, ENV, ENV.default_params(), cfg)
    )(jax.random.key(0), params)
    for name in ("tokens", "valid_mask", "action_mask", "turn_rewards", "done", "anchors"):
        np.testing.assert_array_equal(getattr(grouped, name), getattr(traj, name), err_msg=name)
    np.testing.assert_allclose(grouped.logp_behavior, traj.logp_behavior, atol=1e-5)


def test_rollout__traced_greedy_flag_equals_the_static_modes():
    """One program for greedy and sampled decoding (evaluation): a traced flag reproduces
    cfg.greedy=True and cfg.greedy=False exactly, and picks per row."""
    graphdef, params, sampled = _traj()
    greedy_cfg = dataclasses.replace(CFG, greedy=True)
    greedy = jax.jit(
        lambda key, p: rollout_lib.rollout(key, graphdef, p, ENV, ENV.default_params(), greedy_cfg)
    )(jax.random.key(0), params)
    traced = jax.jit(
        lambda key, p, g: rollout_lib.rollout(
            key, graphdef, p, ENV, ENV.default_params(), CFG, greedy=g
        )
    )
    rows = jnp.arange(CFG.batch_size) % 2 == 0  # per row: even rows greedy
    for flag, want in ((True, greedy), (False, sampled), (rows, None)):
        got = traced(jax.random.key(0), params, jnp.asarray(flag))
        for name in ("tokens", "action_mask", "turn_rewards", "logp_behavior"):
            a, b = np.asarray(getattr(got, name)), None
            if want is not None:
                b = np.asarray(getattr(want, name))
            else:  # even rows as the greedy run, odd rows as the sampled one
                b = np.where(
                    np.asarray(rows).reshape((-1,) + (1,) * (a.ndim - 1)),
                    np.asarray(getattr(greedy, name)),
                    np.asarray(getattr(sampled, name)),
                )
            np.testing.assert_array_equal(a, b, err_msg=f"{name} greedy={flag}")
    assert not np.array_equal(greedy.tokens, sampled.tokens)


def test_turn_group_bounds__cover_all_turns_with_growing_caches():
    lay = rollout_lib.Layout(prompt=5, action=3, obs=4, turns=8, length=5 + 8 * 7)
    assert rollout_lib.turn_group_bounds(lay, 1) == [(0, 8, 61)]
    assert rollout_lib.turn_group_bounds(lay, 3) == [(0, 3, 26), (3, 5, 40), (5, 8, 61)]
    assert rollout_lib.turn_group_bounds(lay, 20) == [(k, k + 1, 5 + (k + 1) * 7) for k in range(8)]
    with pytest.raises(ValueError, match=r"rollout.turn_groups=0; allowed: >= 1"):
        rollout_lib.rollout_rows(
            jax.random.key(0),
            *_setup()[:2],
            ENV,
            ENV.default_params(),
            dataclasses.replace(CFG, turn_groups=0),
        )


def test_rollout__teacher_forced_pass_ignores_padding_content():
    graphdef, params, traj = _traj(1)
    junk = jnp.where(traj.valid_mask, traj.tokens, 7)  # garbage in padding slots
    a = _score(graphdef, params, traj.tokens, traj.valid_mask).logp
    b = _score(graphdef, params, junk, traj.valid_mask).logp
    valid = np.asarray(traj.valid_mask)
    np.testing.assert_allclose(np.asarray(a)[valid], np.asarray(b)[valid], atol=1e-5)


def test_rollout__masks_partition_valid_tokens():
    _, _, traj = _traj(2)
    valid, act, obs = (np.asarray(x) for x in (traj.valid_mask, traj.action_mask, traj.obs_mask))
    assert not np.any(act & obs)
    # BOS is the only valid token that is neither action nor observation.
    np.testing.assert_array_equal(valid, act | obs | (np.arange(valid.shape[1]) == 0))
    assert np.all(np.asarray(traj.tokens)[~valid] == ENV.tokenizer.pad_id)


def test_rollout__action_mask_covers_exactly_the_sampled_tokens():
    _, _, traj = _traj(3)
    lay = rollout_lib.make_layout(ENV, CFG)
    tok, act = np.asarray(traj.tokens), np.asarray(traj.action_mask)
    eoa = ENV.tokenizer.eoa_id
    for b in range(tok.shape[0]):
        for k in range(lay.turns):
            start = lay.prompt + k * (lay.action + lay.obs)
            sampled = act[b, start : start + lay.action]
            # Sampled tokens are a prefix of the action block that stops at EOA or the budget.
            n = int(sampled.sum())
            assert np.all(sampled[:n]) and not np.any(sampled[n:])
            assert not np.any(act[b, start + lay.action : start + lay.action + lay.obs])
            if n and n < lay.action:
                assert tok[b, start + n - 1] == eoa
            if bool(traj.turn_valid[b, k]):
                assert n >= 1 and int(traj.turn_end[b, k]) == start + n - 1
            else:
                assert n == 0 and int(traj.turn_end[b, k]) == -1


def test_rollout__groups_share_initial_state_and_done_is_absorbing():
    _, _, traj = _traj(4)
    lay = rollout_lib.make_layout(ENV, CFG)
    tok = np.asarray(traj.tokens)
    np.testing.assert_array_equal(tok[0::2, : lay.prompt], tok[1::2, : lay.prompt])
    np.testing.assert_array_equal(np.asarray(traj.group_ids), [0, 0, 1, 1, 2, 2])
    # The env ends after 3 turns: the 4th turn never happens and gets no tokens or reward.
    assert np.all(np.asarray(traj.num_turns) == 3)
    assert not np.any(np.asarray(traj.turn_valid)[:, 3])
    assert np.all(np.asarray(traj.turn_rewards)[:, 3] == 0)
    assert np.all(np.asarray(traj.done)) and not np.any(np.asarray(traj.truncated))


def test_rollout__same_seed_is_bit_identical():
    _, _, a = _traj(5)
    _, _, b = _traj(5)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_rollout__truncation_is_flagged():
    graphdef, params, _ = _setup()
    cfg = rollout_lib.RolloutConfig(num_tasks=2, group_size=2, max_turns=2, max_action_len=3)
    run = jax.jit(lambda k, p: rollout_lib.rollout(k, graphdef, p, ENV, ENV.default_params(), cfg))
    traj = run(jax.random.key(0), params)
    assert np.all(np.asarray(traj.truncated)) and not np.any(np.asarray(traj.done))


def test_layout__context_too_short_for_one_turn_fails():
    cfg = rollout_lib.RolloutConfig(
        num_tasks=1, group_size=1, max_turns=4, max_action_len=3, max_context_len=5
    )
    with pytest.raises(ValueError, match=r"max_context_len=5 is too short for one turn"):
        rollout_lib.make_layout(ENV, cfg)


def test_layout__context_limit_cuts_turns():
    cfg = rollout_lib.RolloutConfig(
        num_tasks=1, group_size=1, max_turns=4, max_action_len=3, max_context_len=3 + 2 * 8 + 1
    )
    assert rollout_lib.make_layout(ENV, cfg).turns == 2


def test_sampling__top_k_and_top_p_restrict_support():
    from rl4agents.models import sampling

    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 200)
    draw = jax.vmap(lambda k, **kw: sampling.sample(k, logits, **kw)[0])
    assert set(np.asarray(jax.vmap(lambda k: sampling.sample(k, logits, top_k=2)[0])(keys))) <= {
        0,
        1,
    }
    got = np.asarray(jax.vmap(lambda k: sampling.sample(k, logits, top_p=0.7)[0])(keys))
    assert set(got) <= {0, 1} and len(set(got)) == 2
    assert int(sampling.sample(keys[0], logits, greedy=True)[0]) == 0
    # A traced flag per row: argmax where set, the static-False sample elsewhere.
    two = jnp.concatenate([logits, logits[:, ::-1]])
    flag = jnp.array([True, False])
    got = np.asarray(jax.vmap(lambda k: sampling.sample(k, two, greedy=flag))(keys))
    sampled = np.asarray(jax.vmap(lambda k: sampling.sample(k, two))(keys))
    np.testing.assert_array_equal(got[:, 0], 0)
    np.testing.assert_array_equal(got[:, 1], sampled[:, 1])
    assert len(set(sampled[:, 1])) > 1
    with pytest.raises(AssertionError):
        sampling.sample(keys[0], two, greedy=jnp.ones((2, 1), bool))
    del draw
