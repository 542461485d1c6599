"""Nested branching rollouts (`BranchConfig.levels` > 1): the rows of a level fork again.

Levels=2 keeps the one-level tree as its first rows, the level-2 metadata is checked by hand,
a level-2 row continues its parent's copied state exactly (tokens, rewards, and log-probs
equal to a teacher-forced pass), every sampled token is in exactly one action mask, the tree
estimators equal the loop reference of tests/credit/test_tree.py on trees 2 and 3 levels deep,
and one train step with levels=2 runs.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents import credit
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import branch
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import resolve as resolve_lib
from tests.credit.test_tree import _reference, _turns, tree_traj
from tests.toy_env import RepeatDigit
from tests.train.test_step_options import build, tiny_config

ENV = RepeatDigit(num_turns=3)  # every episode takes all 3 turns
CFG = rollout_lib.RolloutConfig(num_tasks=2, group_size=2, max_turns=3, max_action_len=3)
# Fork at turns 0 and 1 (M = 2), 2 branches each: 4 roots, 16 level-1 rows, 64 level-2 rows.
TURNS = branch.BranchConfig(rule="turns", turns=(0, 1), num_branches=2)
NESTED = dataclasses.replace(TURNS, levels=2)
B, K = CFG.batch_size, CFG.max_turns


@functools.lru_cache
def _params():
    model_cfg = policy_lib.make_config("tiny", ENV.tokenizer.vocab_size)
    return nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))


@functools.lru_cache
def _run(bc, seed=0):
    graphdef, params = _params()
    fn = jax.jit(
        lambda key, p: branch.branch_rollout(key, graphdef, p, ENV, ENV.default_params(), CFG, bc)
    )
    return jax.device_get(fn(jax.random.key(seed), params))[0]


def _owned(tree) -> np.ndarray:
    """bool[R, K] the turns each row sampled itself."""
    return tree.turn_valid & (np.arange(K)[None, :] >= tree.fork_turn[:, None])


def _check_one_owner(tree):
    """Each step (an id in `step_ids`) is sampled by one row: the row that owns it (turns from
    its fork on) has its action tokens in its mask, every other row through it has none."""
    owned = _owned(tree)
    has_act = np.stack(
        [(tree.action_mask & (tree.turn_ids == k)).any(axis=1) for k in range(K)], axis=1
    )
    np.testing.assert_array_equal(has_act, owned)
    owners = tree.step_ids[owned]
    assert len(np.unique(owners)) == len(owners)  # no step is sampled twice
    np.testing.assert_array_equal(np.unique(owners), np.unique(tree.step_ids[tree.turn_valid]))


def _check_logp(tree):
    """The sampled log-probs equal a teacher-forced pass over each row's whole history."""
    graphdef, params = _params()
    score = jax.jit(lambda p, t, v: rollout_lib.score(nnx.merge(graphdef, p), t, v).logp)
    logp = np.asarray(score(params, jnp.asarray(tree.tokens), jnp.asarray(tree.valid_mask)))
    mask = tree.action_mask
    assert mask[tree.depth >= 2].sum() > 10  # rows of level 2 and deeper sampled
    np.testing.assert_allclose(logp[mask], tree.logp_behavior[mask], atol=2e-5)


def test_levels__sizes_and_checked_values():
    assert NESTED.level_rows(4, 3) == (4, 16, 64)
    assert NESTED.num_rows(4, 3) == 4 * (1 + 4 + 16) == 84
    assert TURNS.num_rows(4, 3) == 4 * (1 + 4)
    every3 = branch.BranchConfig(rule="every", num_branches=1, levels=3)
    assert every3.num_rows(2, 3) == 2 * (1 + 3 + 9 + 27)
    for levels, rule, kw in [
        (0, "every", {}),
        (1.0, "every", {}),
        (True, "every", {}),
        (4, "every", {}),  # K = 3 turns: at most 3 levels
        (3, "turns", {"turns": (0, 1, 1)}),  # two distinct turns: at most 2 levels
        (3, "arpo", {}),  # never at turn 0: at most K - 1 = 2 levels
    ]:
        bc = branch.BranchConfig(rule=rule, levels=levels, **kw)
        with pytest.raises(ValueError, match=r"^rollout\.branch\.levels=") as info:
            branch.check_config(bc, num_turns=3, action_len=3)
        assert "\n" not in str(info.value)
    branch.check_config(branch.BranchConfig(rule="arpo", levels=2), num_turns=3, action_len=3)
    branch.check_config(branch.BranchConfig(rule="arpo"), num_turns=1, action_len=3)


def test_fork_turns__after_the_rows_own_fork_by_hand():
    valid = jnp.array([[True, True, True, True], [True, True, True, False]])
    ent = jnp.array([[0.5, 2.0, 1.0, 9.0], [3.0, 0.1, 0.2, 0.0]])
    first = jnp.array([2, 1])  # rows forked at turns 1 and 0
    key = jax.random.key(0)

    def turns(reference=None, **kw):
        got = branch.fork_turns(branch.BranchConfig(**kw), valid, ent, key, first, reference)
        return np.asarray(got)

    np.testing.assert_array_equal(turns(rule="every"), [[-1, -1, 2, 3], [-1, 1, 2, -1]])
    # slot m keeps listed turn m; listed turns at or before the row's fork are unused
    np.testing.assert_array_equal(turns(rule="turns", turns=(0, 2, 3)), [[-1, 2, 3], [-1, 2, -1]])
    # the top-2 of the row's own turns only (row 0's turn 1 has 2.0 but was copied)
    np.testing.assert_array_equal(
        turns(rule="entropy", max_forks=2, entropy_threshold=-np.inf), [[3, 2], [2, 1]]
    )
    arpo = dict(rule="arpo", max_forks=2, arpo_weight=1e6, arpo_prob=0.5)
    # reference None: each row's own turn 0 (0.5 and 3.0); row 0 rose, row 1 fell
    np.testing.assert_array_equal(turns(**arpo), [[2, 3], [-1, -1]])
    # the root's reference entropy decides: 10 (everything fell), 0 (everything rose)
    np.testing.assert_array_equal(turns(jnp.array([10.0, 0.0]), **arpo), [[-1, -1], [1, 2]])


def test_levels_two__starts_with_the_one_level_tree():
    """The roots and level-1 rows of levels=2 are the levels=1 tree (same keys, same rows)."""
    one, two = _run(TURNS), _run(NESTED)
    rows = TURNS.num_rows(B, K)
    assert one.tokens.shape[0] == rows and two.tokens.shape[0] == NESTED.num_rows(B, K)
    for f in dataclasses.fields(one):
        a, b = getattr(one, f.name), getattr(two, f.name)
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            np.testing.assert_allclose(b[:rows], a, atol=1e-6, err_msg=f.name)
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(b[:rows], a, err_msg=f.name)


def test_levels_one__unused_slot_after_k_start_holds_the_prompt_only():
    """Rule "turns" (1, 2) on episodes that end after 2 of 3 turns: the branch loop starts at
    turn 1 (`k_start`) and every used branch copies turn 0, but the slot of turn 2, which no
    root took, gives rows without any turn (no copied turn 0, no outcome)."""
    env = RepeatDigit(num_turns=2)
    graphdef, params = _params()
    bc = branch.BranchConfig(rule="turns", turns=(1, 2))
    fn = jax.jit(
        lambda key, p: branch.branch_rollout(key, graphdef, p, env, env.default_params(), CFG, bc)
    )
    tree = jax.device_get(fn(jax.random.key(0), params))[0]
    np.testing.assert_array_equal(tree.fork_turn[B:], np.tile([1, 1, 3, 3], B))
    unused = tree.fork_turn == K
    np.testing.assert_array_equal(tree.num_turns, np.where(unused, 0, 2))
    np.testing.assert_array_equal(tree.outcome_reward[unused], 0.0)
    assert not (tree.valid_mask[unused] & (tree.turn_ids[unused] >= 0)).any()
    used = np.flatnonzero(~unused[B:]) + B
    np.testing.assert_array_equal(
        tree.turn_rewards[used, 0], tree.turn_rewards[tree.parent[used], 0]
    )


def test_levels_two__metadata_by_hand():
    tree = _run(NESTED)
    # level 1: row 4 + 4 r + 2 m + i of root r, slot m (turn m), branch i
    l1 = slice(4, 20)
    np.testing.assert_array_equal(tree.parent[l1], np.repeat([0, 1, 2, 3], 4))
    np.testing.assert_array_equal(tree.fork_turn[l1], np.tile([0, 0, 1, 1], 4))
    np.testing.assert_array_equal(tree.branch_id[l1], np.tile([0, 1], 8))
    # level 2: row 20 + 4 (p - 4) + 2 m + i of level-1 row p; slot 0 (turn 0) is never after
    # p's fork, slot 1 (turn 1) is only for the rows p forked at turn 0; K = 3: unused
    l2 = slice(20, 84)
    np.testing.assert_array_equal(tree.parent[l2], np.repeat(np.arange(4, 20), 4))
    per_root = [3, 3, 1, 1] * 2 + [3, 3, 3, 3] * 2  # under p of slots (0, 0, 1, 1)
    np.testing.assert_array_equal(tree.fork_turn[l2], np.tile(per_root, 4))
    np.testing.assert_array_equal(tree.branch_id[l2], np.tile([0, 1], 32))
    np.testing.assert_array_equal(tree.depth, np.repeat([0, 1, 2], [4, 16, 64]))
    roots = np.arange(4)
    np.testing.assert_array_equal(
        tree.root, np.concatenate([roots, np.repeat(roots, 4), np.repeat(roots, 16)])
    )
    steps = tree.step_ids
    np.testing.assert_array_equal(steps[0], [0, 1, 2])
    np.testing.assert_array_equal(steps[4], [12, 13, 14])  # root 0, turn 0: owns every step
    np.testing.assert_array_equal(steps[6], [0, 19, 20])  # root 0, turn 1: shares turn 0
    np.testing.assert_array_equal(steps[20], [60, 61, 62])  # unused: its own ids, no turn
    np.testing.assert_array_equal(steps[22], [12, 67, 68])  # row 4 at turn 1: shares its turn 0
    np.testing.assert_array_equal(steps[23], [12, 70, 71])
    used = tree.fork_turn < K
    np.testing.assert_array_equal(tree.num_turns, np.where(used, 3, 0))


def test_levels_two__rows_continue_their_parents_copied_state():
    """A row's turns before its fork equal its parent's (tokens, validity, rewards) and are
    out of its action mask; rows share a step id exactly where they share the history up to
    it; the sampled log-probs equal a teacher-forced pass over the whole history (the copied
    cache of a level-2 row is its parent's)."""
    tree = _run(NESTED)
    ids = tree.turn_ids
    rows = tree.tokens.shape[0]
    for r in range(B, rows):
        p, t = tree.parent[r], tree.fork_turn[r]
        if t == K:
            continue
        before = (ids[r] >= 0) & (ids[r] < t)
        np.testing.assert_array_equal(before, (ids[p] >= 0) & (ids[p] < t))
        np.testing.assert_array_equal(tree.tokens[r][before], tree.tokens[p][before])
        np.testing.assert_array_equal(tree.turn_rewards[r, :t], tree.turn_rewards[p, :t])
        assert not tree.action_mask[r][before].any()
        assert tree.action_mask[r][ids[r] == t].any()
    # a shared step id means the same history (prompt and turn blocks) up to that turn
    for k in range(K):
        upto = np.where(tree.valid_mask & (ids <= k), tree.tokens, -1)
        for s in np.unique(tree.step_ids[tree.turn_valid[:, k], k]):
            same = np.flatnonzero((tree.step_ids[:, k] == s) & tree.turn_valid[:, k])
            for r in same[1:]:
                np.testing.assert_array_equal(upto[r], upto[same[0]])
                np.testing.assert_array_equal(tree.step_ids[r, :k], tree.step_ids[same[0], :k])
    _check_logp(tree)


def test_levels_two__every_sampled_token_in_exactly_one_action_mask():
    _check_one_owner(_run(NESTED))


@pytest.mark.parametrize(
    "bc, used",
    [
        (branch.BranchConfig(rule="every", num_branches=1, levels=3), [4, 12, 12, 4]),
        (branch.BranchConfig(rule="turns", turns=(1, 2), levels=2), [4, 16, 16]),
        (
            branch.BranchConfig(rule="arpo", max_forks=2, arpo_weight=0.0, arpo_prob=0.7, levels=2),
            None,
        ),
    ],
)
def test_levels__deeper_rows_fork_after_their_own_fork(bc, used):
    """Rule "every" 3 levels deep over K = 3 turns, N = 1: 4 roots fork at turns 0, 1, 2 (12
    rows); a row forked at turn t forks at the turns after t (2 + 1 + 0 per root: 12 rows),
    and the level-2 rows forked at turn 1 once more at turn 2 (4 rows). Rule "turns" (1, 2),
    N = 2: the branch loops start at turn 1 and the level-1 rows forked at turn 1 fork at turn
    2 (16 rows). Rule "arpo" 2 levels deep. Every row forks after its parent's fork turn,
    owns its steps alone and samples after its copied history; an unused slot's rows hold the
    prompt only (with `k_start` > 0 too, where used rows copy the turns before it)."""
    tree = _run(bc)
    taken = tree.fork_turn < K
    if used is not None:
        got = [int((taken & (tree.depth == level)).sum()) for level in range(bc.levels + 1)]
        assert got == used
    unused = ~taken & (tree.depth > 0)  # the prompt only: no turn, not even a copied one
    assert np.all(tree.num_turns[unused] == 0) and not tree.turn_valid[unused].any()
    assert not (tree.valid_mask[unused] & (tree.turn_ids[unused] >= 0)).any()
    child = taken & (tree.depth >= 2)
    assert child.any()
    assert np.all(tree.fork_turn[child] > tree.fork_turn[tree.parent[child]])
    assert np.all(tree.root[child] == tree.root[tree.parent[child]])
    _check_one_owner(tree)
    _check_logp(tree)


def test_levels_two__window_layout():
    """context="window", rule "every", 2 levels: the step rows of every level hold what the row
    saw (their log-probs equal a pass over each step row) and train only on its own turns."""
    cfg = dataclasses.replace(CFG, context="window", window_turns=1)
    bc = branch.BranchConfig(rule="every", num_branches=1, levels=2)
    graphdef, params = _params()
    fn = jax.jit(
        lambda key, p: branch.branch_rollout(key, graphdef, p, ENV, ENV.default_params(), cfg, bc)
    )
    tree, rows = jax.device_get(fn(jax.random.key(1), params))
    n, k, length = rows.tokens.shape
    assert n == tree.tokens.shape[0] == B * (1 + 3 + 9)
    assert np.asarray(tree.depth)[tree.num_turns > 0].max() == 2
    score = jax.jit(lambda p, t, v: rollout_lib.score(nnx.merge(graphdef, p), t, v).logp)
    logp = np.asarray(
        score(params, jnp.asarray(rows.tokens.reshape(-1, length)), rows.valid.reshape(-1, length))
    )
    mask = rows.action_mask.reshape(-1, length)
    np.testing.assert_allclose(logp[mask], rows.logp.reshape(-1, length)[mask], atol=2e-5)
    np.testing.assert_array_equal(rows.action_mask.any(-1), _owned(tree))
    ctx = length - CFG.max_action_len  # the slots before a step row's action slots
    for r in np.flatnonzero((tree.depth > 0) & (tree.fork_turn < K)):
        p, t = tree.parent[r], tree.fork_turn[r]  # copied step rows, then the same context
        np.testing.assert_array_equal(rows.tokens[r, :t], rows.tokens[p, :t])
        np.testing.assert_array_equal(rows.tokens[r, t, :ctx], rows.tokens[p, t, :ctx])
        np.testing.assert_array_equal(rows.valid[r, t, :ctx], rows.valid[p, t, :ctx])


def _without_empty_rows(tree):
    """The tree's rows that took a turn, parents re-indexed (as `_reference` reads them)."""
    keep = np.flatnonzero(tree.num_turns > 0)
    new = -np.ones(tree.parent.shape[0], int)
    new[keep] = np.arange(len(keep))
    parent = np.where(tree.parent[keep] >= 0, new[tree.parent[keep]], -1)
    assert np.all(parent[tree.parent[keep] >= 0] >= 0)  # a used row's parent took turns
    fields = ("turn_rewards", "turn_valid", "group_ids", "fork_turn", "root")
    return keep, types.SimpleNamespace(**{f: getattr(tree, f)[keep] for f in fields}, parent=parent)


def _nested_tree(seed, roots=4, groups=2, n=2, levels=3, k=4):
    """Roots plus `levels` levels of n branches per row at a random turn after the row's own
    fork turn (any turn for a root), for rows that have such a turn."""
    rng = np.random.default_rng(seed)
    rewards, gids, parent, fork = [], [], [], []
    for r in range(roots):
        rewards.append([float(x) for x in rng.integers(0, 3, size=int(rng.integers(2, k + 1)))])
        gids.append(r % groups)
        parent.append(-1)
        fork.append(0)
    level = list(range(roots))
    for _ in range(levels):
        nxt = []
        for p in level:
            lo = fork[p] + (parent[p] >= 0)
            if lo >= len(rewards[p]):
                continue
            for _ in range(n):
                t = int(rng.integers(lo, len(rewards[p])))
                length = int(rng.integers(t + 1, k + 1))
                own = [float(x) for x in rng.integers(0, 3, size=length - t)]
                rewards.append(rewards[p][:t] + own)
                gids.append(gids[p])
                parent.append(p)
                fork.append(t)
                nxt.append(len(rewards) - 1)
        level = nxt
    return tree_traj(rewards, gids, parent, fork)


def _check_estimators(traj, keep, ref_traj):
    for name in ("vineppo", "tree_grpo", "arpo", "salt"):
        kwargs = {"train_on": "all"} if name == "vineppo" else {}
        got = _turns(traj, credit.get(name)(traj, None, **kwargs).advantages)[keep]
        want = _reference(ref_traj, "arpo" if name == "salt" else name)
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=name)
    got = _turns(traj, credit.get("tree_grpo")(traj, None, prefix="mean").advantages)[keep]
    np.testing.assert_allclose(got, _reference(ref_traj, "tree_grpo", prefix="mean"), atol=1e-5)


def test_tree_estimators__two_level_rollout_equals_loop_reference():
    tree = jax.tree.map(jnp.asarray, _run(NESTED))
    # The untrained policy earns the same reward on every turn, which would make every
    # advantage 0 on both sides. Each step gets a reward of its own instead, a function of its
    # step id (rows through a shared step share it), so that branches differ in return.
    steps = np.asarray(tree.step_ids)
    rewards = np.where(np.asarray(tree.turn_valid), (steps * 7 % 5) / 4.0, 0.0)
    tree = tree.replace(
        turn_rewards=jnp.asarray(rewards, jnp.float32),
        outcome_reward=jnp.asarray(rewards.sum(1), jnp.float32),
    )
    keep, ref = _without_empty_rows(jax.device_get(tree))
    assert np.max(np.asarray(tree.depth)[keep]) == 2
    _check_estimators(tree, keep, ref)
    adv = np.asarray(credit.get("tree_grpo")(tree, None).advantages)
    assert np.abs(adv).max() > 0.1


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_estimators__three_level_tree_equals_loop_reference(seed):
    traj = _nested_tree(seed)
    parent = np.asarray(traj.parent)
    depth = np.zeros(len(parent), int)
    for r, p in enumerate(parent):
        depth[r] = depth[p] + 1 if p >= 0 else 0
    assert depth.max() == 3
    _check_estimators(traj, np.arange(len(parent)), traj)


# --------------------------------------------------------------------------------------------
# In training.

NESTED_CFG = {
    "credit.name": "tree_grpo",
    "rollout.branch.rule": "turns",
    "rollout.branch.turns": (0, 1),
    "rollout.branch.levels": 2,
}


def test_branch_config__levels_resolve_and_refuse_the_shared_fork_prefix():
    c = tiny_config(**NESTED_CFG)
    run = resolve_lib.resolve(c, check_only=True)
    bc = resolve_lib.branch_config(c, run.layout, run.backend)
    assert bc == branch.BranchConfig(rule="turns", turns=(0, 1), levels=2)
    for over, pattern in [
        ({"rollout.branch.levels": 0}, r"^rollout\.branch\.levels=0; allowed: 1\.\.2 "),
        (
            {"train.share_fork_prefix": True},
            r"^train\.share_fork_prefix=True with rollout\.branch\.levels=2",
        ),
    ]:
        with pytest.raises(ValueError, match=pattern) as info:
            experiment.build(tiny_config(**{**NESTED_CFG, **over}), check_only=True)
        assert "\n" not in str(info.value)


def test_train_step__levels_two_runs_with_finite_loss():
    exp = build(**NESTED_CFG, **{"optim.lr": 0.05})
    cfg = exp.step_cfg
    assert cfg.num_rows == 8 * (1 + 4 + 16)
    state = exp.init_state(jax.random.key(0))
    state, metrics = jax.device_get(exp.train_step(state, exp.root_key()))
    assert int(state.step) == 1 and metrics["nonfinite"] == 0
    assert np.isfinite(metrics["loss"]) and all(np.isfinite(v) for v in metrics.values())
    assert metrics["branch/forks"] > 0
