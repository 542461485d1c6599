"""Tree estimators (docs/methods.md, `vineppo`, `tree_grpo`, `arpo`, `salt`): hand-derived values
and a slow loop reference over explicit root-to-leaf paths."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit
from rl4agents.credit.tree import TreeTrajectory, history_divergence
from tests.credit.conftest import episodes_traj, per_turn

ATOL = 1e-5
ACT, OBS = 2, 1


def tree_traj(turn_rewards, group_ids, parent, fork_turn, *, same_tokens=()):
    """Hand-written tree: episode b takes `len(turn_rewards[b])` turns; a branch (parent >= 0)
    copies its parent's turns before `fork_turn` (out of its action mask) and owns the rest.

    Every step gets its own token (the owner row and turn), so histories differ exactly where
    the tree says; `same_tokens` lists (row, turn, like_row) to give row's own step at turn the
    tokens of like_row's step (a coincidental repeat that only SALT merges).
    """
    base = episodes_traj(turn_rewards, group_ids, act=ACT, obs=OBS)
    b, k = base.turn_valid.shape
    parent = np.asarray(parent)
    fork_turn = np.asarray(fork_turn)
    steps = np.arange(b * k).reshape(b, k)
    root = np.arange(b)
    for r in range(b):  # parents come before their branches
        if parent[r] >= 0:
            steps[r, : fork_turn[r]] = steps[parent[r], : fork_turn[r]]
            root[r] = root[parent[r]]
    label = steps.copy()
    for r, t, like in same_tokens:
        label[r, t] = label[like, t]
    tokens = np.asarray(base.tokens).copy()
    turn_ids = np.asarray(base.turn_ids)
    for r in range(b):
        for t in range(k):
            tokens[r][turn_ids[r] == t] = 10 + label[r, t]
    tokens = np.where(np.asarray(base.valid_mask), tokens, 0)
    copied = (turn_ids >= 0) & (turn_ids < fork_turn[:, None])
    action = np.asarray(base.action_mask) & ~copied
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(tokens=jnp.asarray(tokens), action_mask=jnp.asarray(action))
    return TreeTrajectory(
        **fields,
        parent=jnp.asarray(parent, jnp.int32),
        fork_turn=jnp.asarray(fork_turn, jnp.int32),
        depth=jnp.asarray(parent >= 0, jnp.int32),
        branch_id=jnp.asarray(np.where(parent >= 0, 0, -1), jnp.int32),
        root=jnp.asarray(root, jnp.int32),
        step_ids=jnp.asarray(steps, jnp.int32),
    )


def _hand():
    """Group 0: root r0 rewards [0, 0, 1]; b1, b2 forked from r0 at turn 1 ([0*, 1] and
    [0*, 0, 0], * copied); root r1 [0]. Group 1: root r4 [1, 0], b5 forked at 0 from r4 [0]."""
    return tree_traj(
        [[0, 0, 1], [0, 1], [0, 0, 0], [0], [1, 0], [0]],
        [0, 0, 0, 0, 1, 1],
        parent=[-1, 0, 0, -1, -1, 4],
        fork_turn=[0, 1, 1, 0, 0, 0],
    )


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=ATOL)


N = float("nan")


def _rows(table):
    return np.array([[N if v is None else v for v in row] for row in table], np.float64)


def _turns(traj, adv):
    """Per-turn advantages of owned turns (NaN where the row has no trained token)."""
    return per_turn(traj, adv)


# ---- vineppo --------------------------------------------------------------------------------
# Returns G (gamma 1): r0 [1, 1, 1], b1 [1, 1], b2 [0, 0, 0], r1 [0], r4 [1, 0], b5 [0].
# Steps from the prompt of group 0: n(r0,0) through {r0, b1, b2}: Q = 2/3; n(r1,0): Q = 0.
# From s_1 of r0: n(r0,1) Q 1, n(b1,1) Q 1, n(b2,1) Q 0. Group 1's prompt: n(r4,0) Q 1, n(b5,0) 0.
VINE_ALL = [
    [2 / 3, 1 - 0.5, 0.0],
    [None, 1 - 0.5],
    [None, 0 - 1.0, 0.0],
    [-2 / 3],
    [1.0, 0.0],
    [-1.0],
]


def test_vineppo__hand_values():
    traj = _hand()
    out = credit.get("vineppo")(traj, None, train_on="all")
    _close(_turns(traj, out.advantages), _rows(_pad(VINE_ALL)))
    roots = credit.get("vineppo")(traj, None, train_on="roots")
    want = _rows(_pad(VINE_ALL))
    want[[1, 2, 5]] = np.where(np.isnan(want[[1, 2, 5]]), N, 0.0)
    _close(_turns(traj, roots.advantages), want)


def _pad(table, k=3):
    return [row + [None] * (k - len(row)) for row in table]


def test_vineppo__plain_trajectory_is_rloo_on_the_first_turn():
    traj = episodes_traj([[1.0, 0.0], [0.0], [2.0, 1.0]], [0, 0, 0], act=ACT, obs=OBS)
    out = credit.get("vineppo")(traj, None)
    g0 = np.array([1.0, 0.0, 3.0])
    rloo = g0 - (g0.sum() - g0) / 2
    _close(_turns(traj, out.advantages), _rows([[rloo[0], 0.0], [rloo[1], None], [rloo[2], 0.0]]))


# ---- tree_grpo / arpo / salt -----------------------------------------------------------------
# Scores: r0 1, b1 1, b2 0, r1 0 (group 0); r4 1, b5 0 (group 1). scale "none":
# intra (tree of r0: mean 2/3): r0 1/3, b1 1/3, b2 -2/3; r1 0 (alone); tree of r4: .5, -.5
# inter (group 0 mean .5): .5, .5, -.5, -.5; group 1: .5, -.5
# leaf: r0 5/6, b1 5/6, b2 -7/6, r1 -1/2, r4 1, b5 -1.


def test_tree_grpo__hand_sum_and_mean():
    traj = _hand()
    out = credit.get("tree_grpo")(traj, None, scale="none", prefix="sum")
    a = {"r0": 5 / 6, "b1": 5 / 6, "b2": -7 / 6, "r1": -0.5, "r4": 1.0, "b5": -1.0}
    shared = a["r0"] + a["b1"] + a["b2"]
    want = [
        [shared, a["r0"], a["r0"]],
        [None, a["b1"]],
        [None, a["b2"], a["b2"]],
        [a["r1"]],
        [a["r4"], a["r4"]],
        [a["b5"]],
    ]
    _close(_turns(traj, out.advantages), _rows(_pad(want)))
    out = credit.get("tree_grpo")(traj, None, scale="none", prefix="mean")
    want[0][0] = shared / 3
    _close(_turns(traj, out.advantages), _rows(_pad(want)))


ARPO_NONE = [
    [(0.5 + 0.5 - 0.5) / 3, 0.5, 0.5],
    [None, 0.5],
    [None, -0.5, -0.5],
    [-0.5],
    [0.5, 0.5],
    [-0.5],
]


def test_arpo__hand_mean_attribution():
    traj = _hand()
    out = credit.get("arpo")(traj, None, scale="none")
    _close(_turns(traj, out.advantages), _rows(_pad(ARPO_NONE)))


def test_salt__equals_arpo_on_a_tree_and_merges_repeated_steps():
    traj = _hand()
    for scale in ("none", "std"):
        a = credit.get("arpo")(traj, None, scale=scale).advantages
        s = credit.get("salt")(traj, None, scale=scale).advantages
        _close(s, np.asarray(a))
    # b2 resampled exactly r0's step at turn 1: SALT merges them (r0, b2 pass the node)
    rep = tree_traj(
        [[0, 0, 1], [0, 1], [0, 0, 0], [0], [1, 0], [0]],
        [0, 0, 0, 0, 1, 1],
        parent=[-1, 0, 0, -1, -1, 4],
        fork_turn=[0, 1, 1, 0, 0, 0],
        same_tokens=[(2, 1, 0)],
    )
    out = credit.get("salt")(rep, None, scale="none")
    want = _rows(_pad(ARPO_NONE))
    want[0, 1] = want[2, 1] = (0.5 - 0.5) / 2
    _close(_turns(rep, out.advantages), want)


def test_salt__is_not_gigpo_over_history_anchors():
    """GiGPO with each step's history as its anchor adds a step-group return term to the
    episode advantage; SALT replaces the episode advantage by its node mean. Two episodes
    that share their first step and split after it: GiGPO gives the shared step +-(1 + 0.5),
    SALT 0."""
    traj = tree_traj([[0, 1], [0, 0]], [0, 0], parent=[-1, 0], fork_turn=[0, 1])
    plain = dataclasses.replace(
        traj,
        action_mask=jnp.asarray(np.asarray(traj.action_mask) | (np.asarray(traj.turn_ids) >= 0)),
        anchors=jnp.asarray(np.asarray(traj.step_ids), jnp.uint32),
    )
    salt = _turns(plain, credit.get("salt")(plain, None, scale="none").advantages)
    gigpo = _turns(
        plain, credit.get("gigpo")(plain, None, gamma=1.0, invalid_penalty=0.0).advantages
    )
    _close(salt, [[0.0, 0.5], [0.0, -0.5]])
    _close(gigpo, [[0.5 + 0.5, 0.5], [-0.5 - 0.5, -0.5]])


# ---- loop reference ------------------------------------------------------------------------


def _random_tree(seed, roots=4, groups=2, n=2, k=4):
    """Roots (each of `groups` tasks) plus n branches per root at a random fork turn."""
    rng = np.random.default_rng(seed)
    rewards, gids, parent, fork = [], [], [], []
    for r in range(roots):
        length = int(rng.integers(1, k + 1))
        rewards.append([float(x) for x in rng.integers(0, 3, size=length)])
        gids.append(r % groups)
        parent.append(-1)
        fork.append(0)
    for r in range(roots):
        for _ in range(n):
            t = int(rng.integers(0, len(rewards[r])))
            length = int(rng.integers(t + 1, k + 1))
            own = [float(x) for x in rng.integers(0, 3, size=length - t)]
            rewards.append(rewards[r][:t] + own)
            gids.append(gids[r])
            parent.append(r)
            fork.append(t)
    return tree_traj(rewards, gids, parent, fork)


def _paths(traj):
    """Each row's steps as labels (owner row, turn), from the parent links alone."""
    parent, fork = np.asarray(traj.parent), np.asarray(traj.fork_turn)
    valid = np.asarray(traj.turn_valid)
    labels = {}
    for r in range(len(parent)):
        labels[r] = [labels[parent[r]][t] if t < fork[r] else (r, t) for t in range(valid[r].sum())]
    return labels


def _reference(traj, name, gamma=1.0, eps=1e-6, prefix="sum"):
    rewards = np.asarray(traj.turn_rewards, np.float64)
    valid = np.asarray(traj.turn_valid)
    gid = np.asarray(traj.group_ids)
    fork = np.asarray(traj.fork_turn)
    root = np.asarray(traj.root)
    b, k = valid.shape
    paths = _paths(traj)
    score = rewards.sum(1)
    out = np.full((b, k), np.nan)

    def z(rows, r):
        vals = score[rows]
        if len(rows) <= 1:
            return 0.0
        return (score[r] - vals.mean()) / (vals.std(ddof=1) + eps)

    if name == "vineppo":
        ret = np.zeros((b, k))
        for r in range(b):
            acc = 0.0
            for t in reversed(range(valid[r].sum())):
                acc = rewards[r, t] + gamma * acc
                ret[r, t] = acc
        for r in range(b):
            for t in range(fork[r], valid[r].sum()):
                state = (gid[r], tuple(paths[r][:t]))
                q = {}
                for c in range(b):
                    if gid[c] == gid[r] and len(paths[c]) > t and tuple(paths[c][:t]) == state[1]:
                        q.setdefault(paths[c][t], []).append(ret[c, t])
                mine = np.mean(q.pop(paths[r][t]))
                out[r, t] = mine - np.mean([np.mean(v) for v in q.values()]) if q else 0.0
        return out
    leaf = np.zeros(b)
    for r in range(b):
        group = [c for c in range(b) if gid[c] == gid[r]]
        tree = [c for c in group if root[c] == root[r]]
        leaf[r] = z(group, r) + (z(tree, r) if name == "tree_grpo" else 0.0)
    for r in range(b):
        for t in range(fork[r], valid[r].sum()):
            through = [c for c in range(b) if len(paths[c]) > t and paths[c][t] == paths[r][t]]
            vals = leaf[through]
            out[r, t] = vals.sum() if (name == "tree_grpo" and prefix == "sum") else vals.mean()
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["vineppo", "tree_grpo", "arpo", "salt"])
def test_tree_estimators__equal_loop_reference(name, seed):
    traj = _random_tree(seed)
    kwargs = {"train_on": "all"} if name == "vineppo" else {}
    got = _turns(traj, credit.get(name)(traj, None, **kwargs).advantages)
    want = _reference(traj, "arpo" if name == "salt" else name)
    _close(got, want)
    if name == "tree_grpo":
        got = _turns(traj, credit.get(name)(traj, None, prefix="mean").advantages)
        _close(got, _reference(traj, name, prefix="mean"))


def test_history_divergence__first_differing_turn():
    traj = _hand()
    div = np.asarray(history_divergence(traj))
    assert div[0, 1] == 1 and div[0, 2] == 1 and div[1, 2] == 1  # share turn 0, split at 1
    assert div[0, 3] == 0  # another root of the task: the same prompt, another first step
    assert div[0, 0] == traj.turn_valid.shape[1]
    tokens = np.asarray(traj.tokens).copy()
    tokens[4, 0] += 1  # another prompt: the histories differ from the start
    assert np.asarray(history_divergence(traj.replace(tokens=jnp.asarray(tokens))))[0, 4] == -1


@pytest.mark.parametrize("name", ["vineppo", "tree_grpo", "arpo", "salt"])
def test_tree_estimators__registered_with_checked_values(name):
    assert name in credit.names()
    credit.validate(name, {})
    key = {"vineppo": "train_on", "tree_grpo": "prefix", "arpo": "scale", "salt": "scale"}[name]
    with pytest.raises(ValueError, match=f"credit.{name}"):
        credit.validate(name, {key: "bogus"})
