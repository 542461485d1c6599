"""Branching rollouts: roots equal `rollout`, branches continue the copied state exactly (their
log-probs equal a teacher-forced pass over their whole history), fork rules, tree metadata."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents import credit, sharding
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import branch
from rl4agents.rollout import rollout as rollout_lib
from tests.credit.conftest import per_turn
from tests.credit.test_tree import _reference as tree_reference
from tests.toy_env import RepeatDigit

ENV = RepeatDigit(num_turns=3)
CFG = rollout_lib.RolloutConfig(num_tasks=2, group_size=2, max_turns=3, max_action_len=3)
EVERY = branch.BranchConfig(rule="every", num_branches=2)


@functools.lru_cache
def _params():
    model_cfg = policy_lib.make_config("tiny", ENV.tokenizer.vocab_size)
    return nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))


@functools.lru_cache
def _run(cfg=CFG, bc=EVERY, seed=0):
    graphdef, params = _params()
    fn = jax.jit(
        lambda key, p: branch.branch_rollout(key, graphdef, p, ENV, ENV.default_params(), cfg, bc)
    )
    return jax.device_get(fn(jax.random.key(seed), params))


@functools.lru_cache
def _plain(cfg=CFG, seed=0):
    graphdef, params = _params()
    fn = jax.jit(
        lambda key, p: rollout_lib.rollout_rows(key, graphdef, p, ENV, ENV.default_params(), cfg)
    )
    return jax.device_get(fn(jax.random.key(seed), params))


def _score(tokens, valid):
    graphdef, params = _params()
    fn = jax.jit(lambda p, t, v: rollout_lib.score(nnx.merge(graphdef, p), t, v))
    return np.asarray(fn(params, jnp.asarray(tokens), jnp.asarray(valid)).logp)


def test_branch__roots_equal_rollout_and_rows_are_ordered():
    tree, rows = _run()
    plain, _ = _plain()
    b, k = CFG.batch_size, CFG.max_turns
    assert rows is None
    assert tree.tokens.shape[0] == b * (1 + k * EVERY.num_branches)
    for name in ("tokens", "valid_mask", "action_mask", "turn_rewards", "anchors", "done"):
        np.testing.assert_array_equal(getattr(tree, name)[:b], getattr(plain, name), name)
    np.testing.assert_allclose(tree.logp_behavior[:b], plain.logp_behavior, atol=1e-6)
    np.testing.assert_array_equal(tree.parent[:b], -1)
    np.testing.assert_array_equal(tree.parent[b:], np.repeat(np.arange(b), k * 2))
    np.testing.assert_array_equal(tree.fork_turn[b:], np.tile(np.repeat(np.arange(k), 2), b))
    np.testing.assert_array_equal(tree.branch_id[b:], np.tile([0, 1], b * k))
    np.testing.assert_array_equal(tree.group_ids[b:], np.repeat(plain.group_ids, k * 2))


def test_branch__branches_copy_the_prefix_and_sample_the_rest():
    tree, _ = _run()
    b, k = CFG.batch_size, CFG.max_turns
    ids = tree.turn_ids
    for r in range(b, tree.tokens.shape[0]):
        p, t = tree.parent[r], tree.fork_turn[r]
        before = (ids[r] >= 0) & (ids[r] < t)
        np.testing.assert_array_equal(before, (ids[p] >= 0) & (ids[p] < t))
        np.testing.assert_array_equal(tree.tokens[r][before], tree.tokens[p][before])
        np.testing.assert_array_equal(tree.turn_rewards[r, :t], tree.turn_rewards[p, :t])
        assert not tree.action_mask[r][before].any()
        assert np.all(tree.logp_behavior[r][before] == 0)
        assert tree.action_mask[r][ids[r] == t].any()  # the fork turn is resampled
        np.testing.assert_array_equal(tree.step_ids[r, :t], tree.step_ids[p, :t])
        np.testing.assert_array_equal(tree.step_ids[r, t:], r * k + np.arange(t, k))
        assert tree.root[r] == p and tree.depth[r] == 1
    np.testing.assert_allclose(tree.outcome_reward, tree.turn_rewards.sum(1))
    # siblings sample their own continuations: most differ from each other
    first, second = tree.tokens[b::2], tree.tokens[b + 1 :: 2]
    assert np.mean(np.any(first != second, axis=1)) > 0.5


def test_branch__logp_equals_teacher_forced_pass_over_the_whole_history():
    """The branch's cache is its root's at the fork: its samples are scored after the copied
    prefix, as a fresh pass over the full tokens shows."""
    tree, _ = _run()
    logp = _score(tree.tokens, tree.valid_mask)
    mask = tree.action_mask
    assert mask[CFG.batch_size :].sum() > 20
    np.testing.assert_allclose(logp[mask], tree.logp_behavior[mask], atol=2e-5)


def test_branch__fixed_turns_and_unused_slots():
    bc = branch.BranchConfig(rule="turns", turns=(2,), num_branches=3)
    tree, _ = _run(bc=bc)
    plain, _ = _plain()
    b = CFG.batch_size
    np.testing.assert_array_equal(tree.tokens[:b], plain.tokens)
    alive = plain.turn_valid[:, 2]
    np.testing.assert_array_equal(tree.fork_turn[b:], np.repeat(np.where(alive, 2, 3), 3))
    used = np.repeat(alive, 3)
    assert np.all(tree.num_turns[b:][~used] == 0) and not tree.action_mask[b:][~used].any()
    logp = _score(tree.tokens, tree.valid_mask)
    np.testing.assert_allclose(
        logp[tree.action_mask], tree.logp_behavior[tree.action_mask], atol=2e-5
    )


def test_branch__window_layout():
    """context="window": a fork copies the last turn blocks; the branch's step rows hold what
    it saw (log-probs equal a pass over each row) and its copied rows train on nothing."""
    cfg = dataclasses.replace(CFG, context="window", window_turns=1)
    tree, rows = _run(cfg=cfg)
    plain, plain_rows = _plain(cfg=cfg)
    b = CFG.batch_size
    np.testing.assert_array_equal(tree.tokens[:b], plain.tokens)
    np.testing.assert_array_equal(rows.tokens[:b], plain_rows.tokens)
    n, k, length = rows.tokens.shape
    assert n == tree.tokens.shape[0]
    logp = _score(rows.tokens.reshape(-1, length), rows.valid.reshape(-1, length))
    mask = rows.action_mask.reshape(-1, length)
    np.testing.assert_allclose(logp[mask], rows.logp.reshape(-1, length)[mask], atol=2e-5)
    for r in range(b, n):  # copied turns: no action slots in the rows either
        assert not rows.action_mask[r, : tree.fork_turn[r]].any()
    np.testing.assert_array_equal(
        rows.action_mask.any(-1), tree.action_mask.reshape(n, -1)[:, 3:].reshape(n, k, -1).any(-1)
    )


def test_fork_turns__rules_by_hand():
    valid = jnp.array([[True, True, True, False], [True, False, False, False]])
    ent = jnp.array([[0.5, 2.0, 1.0, 9.0], [3.0, 0.0, 0.0, 0.0]])
    key = jax.random.key(0)

    def turns(**kw):
        return np.asarray(branch.fork_turns(branch.BranchConfig(**kw), valid, ent, key))

    np.testing.assert_array_equal(turns(rule="every"), [[0, 1, 2, -1], [0, -1, -1, -1]])
    np.testing.assert_array_equal(turns(rule="turns", turns=(0, 2)), [[0, 2], [0, -1]])
    # top-2 of the valid turns at or above 0.8 (the invalid turn 3's 9.0 never counts)
    np.testing.assert_array_equal(
        turns(rule="entropy", max_forks=2, entropy_threshold=0.8), [[1, 2], [0, -1]]
    )
    np.testing.assert_array_equal(
        turns(rule="entropy", max_forks=1, entropy_threshold=-np.inf), [[1], [0]]
    )
    # arpo: p = clip(u - w (H_k - H_0)); with w huge any entropy rise forks, any drop does not
    np.testing.assert_array_equal(
        turns(rule="arpo", max_forks=2, arpo_weight=1e6, arpo_prob=0.5), [[1, 2], [-1, -1]]
    )
    # w = 0: forks with probability arpo_prob, never at turn 0 (its entropy is the reference)
    big_valid = jnp.ones((400, 4), bool)
    got = np.asarray(
        branch.fork_turns(
            branch.BranchConfig(rule="arpo", max_forks=3, arpo_weight=0.0, arpo_prob=0.3),
            big_valid,
            jnp.zeros((400, 4)),
            key,
        )
    )
    assert np.all(got != 0)
    assert abs((got >= 0).mean() - 0.3) < 0.05


def test_turn_entropy__mean_of_first_sampled_tokens():
    ent = jnp.array([[[1.0, 3.0, 5.0], [2.0, 0.0, 0.0]]])
    act = jnp.array([[[True, True, True], [True, False, False]]])
    np.testing.assert_allclose(branch.turn_entropy(ent, act, 2), [[2.0, 2.0]])
    np.testing.assert_allclose(branch.turn_entropy(ent, act, 1), [[1.0, 2.0]])


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rule="bogus"), "branch.rule"),
        (dict(num_branches=0), "branch.num_branches"),
        (dict(rule="turns"), "branch.turns"),
        (dict(rule="turns", turns=(3,)), "branch.turns"),
        (dict(rule="entropy", max_forks=0), "branch.max_forks"),
        (dict(entropy_tokens=4), "branch.entropy_tokens"),
        (dict(rule="arpo", arpo_prob=1.5), "branch.arpo_prob"),
    ],
)
def test_check_config__names_the_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        branch.check_config(branch.BranchConfig(**kw), num_turns=3, action_len=3)


@pytest.mark.slow
def test_branch__sharded_mesh_equals_one_device():
    """On an 8-device host mesh (batch axis sharded) the tree equals the unsharded one."""
    cfg = dataclasses.replace(CFG, num_tasks=4)
    bc = branch.BranchConfig(rule="turns", turns=(1,), num_branches=2)
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (8, 1, 1), devices=jax.devices()[:8])
    graphdef, params = _params()
    shard_fn = sharding.batch_constraint(mesh)
    fn = jax.jit(
        lambda key, p: branch.branch_rollout(
            key, graphdef, p, ENV, ENV.default_params(), cfg, bc, shard_fn=shard_fn
        )
    )
    sharded, _ = jax.device_get(fn(jax.random.key(0), params))
    single, _ = _run(cfg=cfg, bc=bc)
    np.testing.assert_array_equal(sharded.tokens, single.tokens)
    np.testing.assert_allclose(sharded.logp_behavior, single.logp_behavior, atol=1e-5)


def _grpo_reference(tree, eps=1e-6):
    """f64[B, K] GRPO's advantage on the turns each row sampled (NaN elsewhere): the row's
    score z-scored over the rows of its task group (unbiased std)."""
    score = np.asarray(tree.outcome_reward, np.float64)
    gid = np.asarray(tree.group_ids)
    z = np.array(
        [
            (s - score[gid == g].mean()) / (score[gid == g].std(ddof=1) + eps)
            for s, g in zip(score, gid)
        ]
    )
    k = np.arange(tree.turn_valid.shape[1])
    owned = np.asarray(tree.turn_valid) & (k[None, :] >= np.asarray(tree.fork_turn)[:, None])
    return np.where(owned, z[:, None], np.nan)


@pytest.mark.parametrize("name", ["vineppo", "tree_grpo", "arpo", "salt", "grpo"])
def test_branch__estimators_read_the_tree(name):
    """On a branching rollout's tree every estimator gives the loop reference's per-turn
    advantages (tests/credit/test_tree.py), on the tokens each row sampled only."""
    tree, _ = _run()
    tree = jax.tree.map(jnp.asarray, tree)
    # The untrained policy never writes a digit, so every turn earns the same -0.1. Each step
    # gets a reward of its own instead, a function of its step id (rows through a step share
    # it), so that rows and branches differ in return.
    steps = np.asarray(tree.step_ids)
    rewards = np.where(np.asarray(tree.turn_valid), (steps * 7 % 5) / 4.0, 0.0)
    tree = tree.replace(
        turn_rewards=jnp.asarray(rewards, jnp.float32),
        outcome_reward=jnp.asarray(rewards.sum(1), jnp.float32),
    )
    kwargs = {"train_on": "all"} if name == "vineppo" else {}
    got = per_turn(tree, credit.get(name)(tree, None, **kwargs).advantages)
    if name == "grpo":
        want = _grpo_reference(tree)
    else:  # no two sampled steps repeat a history here, so SALT merges none: ARPO's values
        want = tree_reference(tree, "arpo" if name == "salt" else name)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.nanmax(np.abs(got)) > 0.1
