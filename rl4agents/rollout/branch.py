"""Branching rollouts: fork N continuations of an episode from chosen turns, inside one program.

An environment here is a pure function and the turn loop's carry (`rollout.Carry`: KV cache or
window history, environment state, flags) is a value, so a moment of an episode can be copied
like any array. `branch_rollout` runs the B episodes of `rollout` (the roots), keeps the carry at
the start of every turn, picks fork points by a rule, copies the carry of each fork point to N
new rows and runs the turn loop on from there with fresh sampling keys. The shared prefix of a
branch is never sampled or prefilled again: its tokens, rewards and cache come from the root.

Rows of the result: the B roots first (equal to `rollout(key, ...)` with the same key), then
`B x M x N` branch rows in (root, fork slot, branch) order, M fork slots per root (static: K for
rule "every", `len(turns)` for "turns", `max_forks` for "entropy" and "arpo"). A fork slot that
the rule leaves unused gives N empty rows (the prompt only, no turn), which every estimator
already treats as episodes without an action. With `levels` L > 1 the rows of level l are the
roots of level l + 1: each forks by the same rule at turns after its own fork turn, and level
l + 1's `R_l x M x N` rows follow level l's in (parent row, fork slot, branch) order, so the
result has `B (1 + MN + ... + (MN)^L)` rows (`BranchConfig.num_rows`; `fork_turns` says which
turns a row of each level may fork at). The turns a branch copied from its root are in
the branch's trajectory (tokens, rewards, `turn_valid`: its return is a whole episode's return)
but not in its `action_mask` (and its `logp_behavior` / `entropy_behavior` are 0 there): every
sampled token is trained once, on the row that sampled it. The tree metadata
(`credit.tree.TreeTrajectory`) says who forked from whom; docs/methods.md, "Branching rollouts".
The train step samples with it when the config sets `rollout.branch.rule` (`StepConfig.branch`).

Costs: the carry is kept for all K turns of the roots (under context="full" K copies of the
roots' KV cache), with L > 1 also for the rows of every level but the last (from turn
`k_start` on); each level's branches run one turn loop over turns `k_start..K-1`, where
`k_start` is the earliest turn any rule could fork at (the smallest fixed turn for "turns",
else 0), and a branch waits (computes a turn and keeps nothing) on turns before its own fork
turn. Under context="window" nothing is kept but the last `window_turns` turn blocks: a fork
copies them and the branch rebuilds its context from them like any turn does, so forking is
cheap there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl4agents.checks import check_range
from rl4agents.credit.tree import TreeTrajectory
from rl4agents.rollout import rollout as rollout_lib

RULES = ("every", "turns", "entropy", "arpo")


@dataclasses.dataclass(frozen=True)
class BranchConfig:
    """Where and how often to fork (docs/methods.md, "Branching rollouts").

    rule: "every" (every turn the root took), "turns" (the fixed turns `turns`), "entropy" (the
      `max_forks` turns of highest first-token entropy at or above `entropy_threshold`) or
      "arpo" (ARPO's rule, arXiv 2507.19849: at turn k >= 1 draw u ~ U(0, 1) and fork when
      clip(u - arpo_weight (H_k - H_0), 0, 1) <= arpo_prob; the first `max_forks` such turns).
    num_branches: N continuations per fork point.
    turns: fork turns of rule "turns" (each in [0, K)).
    max_forks: fork slots per root for rules "entropy" and "arpo".
    entropy_threshold: rule "entropy": turns below it never fork (-inf: the top `max_forks`).
    entropy_tokens: H_k is the mean sampling entropy over the first `entropy_tokens` action
      tokens of turn k: the policy's uncertainty right after the observation it answers.
    arpo_weight, arpo_prob: ARPO's entropy weight and branch probability (0.2 and 0.5 in its
      scripts).
    levels: L, forks from root to leaf: the branches of level l < L fork again by the same rule,
      at turns after their own fork turn (`fork_turns`); 1 is a one-level tree.
    """

    rule: str = "every"
    num_branches: int = 2
    turns: tuple[int, ...] = ()
    max_forks: int = 1
    entropy_threshold: float = 0.0
    entropy_tokens: int = 1
    arpo_weight: float = 0.2
    arpo_prob: float = 0.5
    levels: int = 1

    def fork_slots(self, num_turns: int) -> int:
        """M, fork slots per root, for a rollout of `num_turns` turns."""
        if self.rule == "every":
            return num_turns
        if self.rule == "turns":
            return len(self.turns)
        return self.max_forks

    def level_rows(self, batch: int, num_turns: int) -> tuple[int, ...]:
        """Rows of each level 0..L of a branching rollout of `batch` roots and `num_turns`
        turns: B (M N)^l."""
        mn = self.fork_slots(num_turns) * self.num_branches
        return tuple(batch * mn**level for level in range(self.levels + 1))

    def num_rows(self, batch: int, num_turns: int) -> int:
        """Rows of a branching rollout of `batch` roots and `num_turns` turns:
        B (1 + M N + ... + (M N)^L), B (1 + M N) for one level."""
        return sum(self.level_rows(batch, num_turns))


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(bc: BranchConfig, num_turns: int, action_len: int) -> None:
    """Raise ValueError naming the first bad value of `bc` (as its config key
    `rollout.branch.<field>`) for K = `num_turns` turns of `action_len` action slots."""
    if bc.rule not in RULES:
        raise ValueError(f"rollout.branch.rule={bc.rule!r}; allowed: {list(RULES)}")
    if not _whole(bc.num_branches) or bc.num_branches < 1:
        raise ValueError(f"rollout.branch.num_branches={bc.num_branches!r}; allowed: >= 1")
    if bc.rule == "turns":
        if not bc.turns:
            raise ValueError(
                f"rollout.branch.turns={bc.turns!r} with rule 'turns'; allowed: one or more "
                f"turns in [0, {num_turns})"
            )
        if not all(_whole(t) and 0 <= t < num_turns for t in bc.turns):
            raise ValueError(
                f"rollout.branch.turns={bc.turns!r}; allowed: whole turns in [0, {num_turns})"
            )
    if bc.rule in ("entropy", "arpo") and (not _whole(bc.max_forks) or bc.max_forks < 1):
        raise ValueError(f"rollout.branch.max_forks={bc.max_forks!r}; allowed: >= 1")
    if not _whole(bc.entropy_tokens) or not 1 <= bc.entropy_tokens <= action_len:
        raise ValueError(
            f"rollout.branch.entropy_tokens={bc.entropy_tokens!r}; allowed: 1..{action_len} "
            "(rollout.max_action_len)"
        )
    h = bc.entropy_threshold
    if isinstance(h, bool) or not isinstance(h, int | float) or math.isnan(h):
        raise ValueError(
            f"rollout.branch.entropy_threshold={h!r}; allowed: a number (-inf: no threshold)"
        )
    check_range("rollout.branch.arpo_weight", bc.arpo_weight)
    check_range("rollout.branch.arpo_prob", bc.arpo_prob, 0.0, 1.0)
    deepest = max_levels(bc, num_turns)
    if not _whole(bc.levels) or not 1 <= bc.levels <= deepest:
        raise ValueError(
            f"rollout.branch.levels={bc.levels!r}; allowed: 1..{deepest} (a branch forks only "
            f"after its own fork turn: rule {bc.rule!r} over {num_turns} turns forks at most "
            f"{deepest} deep)"
        )


def max_levels(bc: BranchConfig, num_turns: int) -> int:
    """The deepest level rule `bc.rule` can reach in `num_turns` turns (at least 1).

    A row forks at turns after its own fork turn, so the rows of level l start no earlier than
    turn l - 1 ("every", "entropy"), the l-th distinct listed turn ("turns") or turn l
    ("arpo", which never forks at turn 0); deeper levels would hold only empty rows.
    """
    if bc.rule == "turns":
        deepest = len(set(bc.turns))
    elif bc.rule == "arpo":
        deepest = num_turns - 1
    else:
        deepest = num_turns
    return max(deepest, 1)


def turn_entropy(entropy: jax.Array, action: jax.Array, first: int) -> jax.Array:
    """H[b, k]: mean sampling entropy of the first `first` action tokens of each turn.

    Args:
      entropy: f32[B, K, A] sampling entropy at the action slots of each turn.
      action: bool[B, K, A] slots actually sampled.
      first: static number of leading action tokens to average.

    Returns:
      f32[B, K], 0 for turns without an action token.
    """
    e, a = entropy[..., :first], action[..., :first].astype(jnp.float32)
    return jnp.sum(e * a, axis=-1) / jnp.maximum(jnp.sum(a, axis=-1), 1.0)


def _first_m(candidate: jax.Array, m: int) -> jax.Array:
    """int32[B, m]: the first m turns where `candidate` (bool[B, K]) holds, -1 padded."""
    k = candidate.shape[1]
    rank = jnp.cumsum(candidate, axis=1) - 1  # the candidate's position among its row's
    slot = jnp.where(candidate & (rank < m), rank, m)  # m = nowhere
    turns = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), candidate.shape)
    out = jnp.full((candidate.shape[0], m + 1), -1, jnp.int32)
    out = jax.vmap(lambda o, s, t: o.at[s].set(t))(out, slot, turns)
    return out[:, :m]


def fork_turns(
    bc: BranchConfig,
    turn_valid: jax.Array,
    entropy: jax.Array,
    key: jax.Array,
    first: jax.Array | None = None,
    reference: jax.Array | None = None,
) -> jax.Array:
    """The fork turn of every fork slot of every row: int32[R, M], -1 for an unused slot.

    A row forks only at turns it took (`turn_valid`): the state before a turn that did not
    happen is past the episode's end. A branch (a row of level >= 1 that forks again, `levels`
    > 1) forks only at turns it sampled after its fork turn t, from states it reached itself
    (`first` = t + 1): rule "every" at each of them, "turns" at the listed turns among them
    (slot m keeps listed turn m, so a slot at or before t is unused), "entropy" at the
    `max_forks` highest-entropy ones, "arpo" at the first `max_forks` that pass ARPO's test
    against the entropy of its root's first turn (`reference`, ARPO's initial entropy).

    Args:
      bc: the branching rule.
      turn_valid: bool[R, K] the row's turns.
      entropy: f32[R, K] H_k of each turn (`turn_entropy`), read at turns >= `first`.
      key: PRNG key of rule "arpo".
      first: int32[R] the earliest turn each row may fork at; None: 0 (the roots).
      reference: f32[R] rule "arpo"'s reference entropy H_0; None: `entropy[:, 0]` (the
        roots' own first turn).
    """
    b, k = turn_valid.shape
    turns = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
    if first is not None:
        turn_valid = turn_valid & (turns >= first[:, None])
    if bc.rule == "every":
        return jnp.where(turn_valid, turns, -1)
    if bc.rule == "turns":
        fixed = jnp.asarray(bc.turns, jnp.int32)
        return jnp.where(turn_valid[:, fixed], fixed[None, :], -1)
    if bc.rule == "entropy":
        m = bc.max_forks
        score = jnp.where(turn_valid & (entropy >= bc.entropy_threshold), entropy, -jnp.inf)
        if m > k:
            score = jnp.pad(score, ((0, 0), (0, m - k)), constant_values=-jnp.inf)
        top, idx = jax.lax.top_k(score, m)  # ties: the earlier turn first
        return jnp.where(jnp.isfinite(top), idx.astype(jnp.int32), -1)
    # arpo: the entropy change since the first turn's makes forking more likely
    h0 = entropy[:, :1] if reference is None else reference[:, None]
    u = jax.random.uniform(key, (b, k))
    p = jnp.clip(u - bc.arpo_weight * (entropy - h0), 0.0, 1.0)
    return _first_m(turn_valid & (turns >= 1) & (p <= bc.arpo_prob), bc.max_forks)


def _root_metadata(b: int, k: int) -> dict[str, jax.Array]:
    """Parent, fork turn, depth, branch id, root and step ids of the B roots."""
    roots = jnp.arange(b, dtype=jnp.int32)
    return dict(
        parent=jnp.full((b,), -1, jnp.int32),
        fork_turn=jnp.zeros((b,), jnp.int32),
        depth=jnp.zeros((b,), jnp.int32),
        branch_id=jnp.full((b,), -1, jnp.int32),
        root=roots,
        step_ids=roots[:, None] * k + jnp.arange(k, dtype=jnp.int32),
    )


def _level_metadata(
    parent: dict[str, jax.Array], fork: jax.Array, n: int, parent_row: int, row: int, depth: int
) -> dict[str, jax.Array]:
    """The metadata of the R x M x N rows forked from R parent rows (`_root_metadata`'s fields).

    Args:
      parent: the parent rows' metadata (their `root` and `step_ids` are read).
      fork: int32[R, M] fork turns of the parents' fork slots (`fork_turns`), -1 unused.
      n: N branches per fork slot.
      parent_row, row: index in the whole tree of the first parent row and the first new row.
      depth: the new rows' level.
    """
    r, m = fork.shape
    k = parent["step_ids"].shape[1]
    local = jnp.repeat(jnp.arange(r, dtype=jnp.int32), m * n)  # parent among the R
    turn = jnp.repeat(fork.reshape(-1), n)
    rows = r * m * n
    own = (row + jnp.arange(rows, dtype=jnp.int32))[:, None] * k + jnp.arange(k, dtype=jnp.int32)
    copied = jnp.arange(k)[None, :] < turn[:, None]  # turns before the fork: the parent's steps
    return dict(
        parent=parent_row + local,
        fork_turn=jnp.where(turn >= 0, turn, k),
        depth=jnp.full((rows,), depth, jnp.int32),
        branch_id=jnp.tile(jnp.arange(n, dtype=jnp.int32), r * m),
        root=parent["root"][local],
        step_ids=jnp.where(copied, parent["step_ids"][local], own),
    )


class _Level(NamedTuple):
    """The rows of one tree level, as the next level forks from them (R rows)."""

    eps: rollout_lib.Episodes  # prompts, group ids and sampling keys of the R rows
    snaps: rollout_lib.Carry | None  # carry at the start of turns `snap_from..K-1`, [K', R, ...]
    snap_from: int  # static: the turn of the first snapshot
    turns: Any  # the per-turn outputs of the turn loop, stacked over all K turns
    rows: rollout_lib.StepRows | None  # step rows stacked over K turns (context="window")
    turn_valid: jax.Array  # bool[R, K]
    entropy: jax.Array | None  # f32[R, K] H_k (`turn_entropy`), 0 on copied turns; None: last level
    first: jax.Array | None  # int32[R] earliest turn the row may fork at; None: 0 (roots)
    meta: dict[str, jax.Array]  # the rows' tree metadata (`_root_metadata` fields)
    row: int  # static: index in the whole tree of the first of the R rows


def branch_rollout(
    key: jax.Array,
    graphdef: nnx.GraphDef,
    params: Any,
    env,
    env_params: Any,
    cfg: rollout_lib.RolloutConfig,
    bc: BranchConfig,
    task_keys: jax.Array | None = None,
    shard_fn=None,
) -> tuple[TreeTrajectory, rollout_lib.StepRows | None]:
    """Roots plus N continuations from each fork point, `bc.levels` levels deep; pure, jittable.

    Args:
      key: PRNG key; the roots use it exactly as `rollout` does, the branches and rule "arpo"
        keys folded from it (the keys of level 1 do not depend on `bc.levels`).
      graphdef, params, env, env_params, cfg, task_keys: as `rollout.rollout_rows`.
        `cfg.turn_groups` is not applied: the roots run one turn group (a cache of T slots),
        so that the carries of all turns have one shape.
      bc: where to fork, how many continuations and how many levels deep.
      shard_fn: as `rollout_rows`; the rows of each level are `B (M N)^l`, so a batch-sharded
        mesh needs those divisible by its size too.

    Returns:
      (TreeTrajectory of `bc.num_rows(B, K)` rows, StepRows of those rows under
      context="window", None under "full"). See the module docstring for the row order and
      masks.
    """
    if cfg.role_params >= 2:  # a fork copies batch rows; role sets put a role axis first
        raise ValueError(
            f"rollout.branch with role_params={cfg.role_params}; allowed: role_params 0 or 1"
        )
    loop = rollout_lib.turn_loop(graphdef, params, env, env_params, cfg, shard_fn)
    lay = loop.lay
    k_turns, n = lay.turns, bc.num_branches
    check_config(bc, k_turns, lay.action)
    m = bc.fork_slots(k_turns)
    shard = shard_fn or (lambda tree: tree)

    # Roots: the turn loop of `rollout`, keeping the carry at the start of every turn.
    eps, carry = loop.start(key, task_keys)
    if carry.ctx is not None:
        carry = loop.grow(carry, lay.length)

    def root_turn(c, k):
        c2, out = loop.step(eps, c, k)
        return c2, (c, out)

    final, (snaps, (turns, rows)) = jax.lax.scan(root_turn, carry, jnp.arange(k_turns))
    root_traj, root_rows = loop.assemble(eps, turns, rows, final)
    key_rule, key_branch = jax.random.split(jax.random.fold_in(key, 1))

    def level_entropy(out):
        def blk_view(x):  # [K, R, A+O] -> the action slots [R, K, A]
            return jnp.swapaxes(x, 0, 1)[:, :, : lay.action]

        return turn_entropy(blk_view(out.entropy), blk_view(out.action), bc.entropy_tokens)

    b = root_traj.tokens.shape[0]
    level = _Level(
        eps, snaps, 0, turns, rows, root_traj.turn_valid, level_entropy(turns), None,
        _root_metadata(b, k_turns), 0,
    )  # fmt: skip
    k_start = min(bc.turns) if bc.rule == "turns" else 0

    def fork_level(level: _Level, fork: jax.Array, key_level: jax.Array, depth: int):
        """The rows forked from `level` at `fork` (int32[R, M]): (Trajectory, StepRows | None,
        their `_Level`, its snapshots kept only when a deeper level forks from it)."""
        parent = jnp.repeat(jnp.arange(fork.shape[0]), m * n)  # [R M N] parent among the R
        turn = jnp.repeat(fork.reshape(-1), n)
        used = turn >= 0
        start = jnp.where(used, turn, 0)
        keep = depth < bc.levels

        # The parent's carry at the fork turn; an unused slot is an episode already over.
        at = start if level.snap_from == 0 else jnp.maximum(start - level.snap_from, 0)
        c0 = jax.tree.map(lambda s: s[at, parent], level.snaps)
        c0 = c0._replace(done=c0.done | ~used, success=c0.success & used)
        c0 = shard(c0)
        key_sample, key_env = jax.random.split(key_level)
        peps = level.eps
        beps = rollout_lib.Episodes(
            peps.prompt_tokens[parent], peps.prompt_valid[parent], peps.group_ids[parent],
            key_sample, key_env,
        )  # fmt: skip

        def copy_turn(out, k):
            """The parents' output of turn k for the new rows, without the sampling record."""
            if out is None:
                return None
            root = jax.tree.map(lambda x: x[k][parent], out)
            if isinstance(root, rollout_lib.StepRows):
                cleared = ("action_mask", "obs_target", "logp")
            else:
                cleared = ("action", "logp", "entropy")
            return root._replace(**{f: jnp.zeros_like(getattr(root, f)) for f in cleared})

        def branch_turn(c, k):
            c2, (out, rw) = loop.step(beps, c, k)
            wait = (k < start) & used  # before its fork the branch keeps its parent's prefix
            c2 = jax.tree.map(lambda old, new: _rows_where(wait, old, new), c, c2)
            out = jax.tree.map(lambda r, o: _rows_where(wait, r, o), copy_turn(level.turns, k), out)
            if rw is not None:
                rw = jax.tree.map(
                    lambda r, o: _rows_where(wait, r, o), copy_turn(level.rows, k), rw
                )
            return c2, ((c, (out, rw)) if keep else (out, rw))

        bfinal, scanned = jax.lax.scan(branch_turn, c0, jnp.arange(k_start, k_turns))
        bsnaps, (bturns, brows) = scanned if keep else (None, scanned)

        def unused_empty(out):
            """A copied turn `out` with nothing in it on the rows of unused fork slots (as the
            turn loop leaves a finished episode's turn); step rows train on nothing already."""
            if isinstance(out, rollout_lib.StepRows):
                return out
            empty = dict(tokens=env.tokenizer.pad_id, valid=False, obs=False, turn_end=-1)
            empty.update(reward=0.0, turn_valid=False, action_valid=False)
            return out._replace(
                **{
                    f: _rows_where(used, getattr(out, f), jnp.full_like(getattr(out, f), v))
                    for f, v in empty.items()
                }
            )

        if k_start > 0:  # turns no rule forks at: every used branch copies them
            head = [unused_empty(copy_turn(level.turns, k)) for k in range(k_start)]
            head_rows = [copy_turn(level.rows, k) for k in range(k_start)]

            def stack(xs):
                return jax.tree.map(lambda *a: jnp.stack(a), *xs)

            bturns = jax.tree.map(lambda h, t: jnp.concatenate([h, t]), stack(head), bturns)
            if brows is not None:
                brows = jax.tree.map(lambda h, t: jnp.concatenate([h, t]), stack(head_rows), brows)
        traj, out_rows = loop.assemble(beps, bturns, brows, bfinal)
        row = level.row + level.turn_valid.shape[0]  # the levels are contiguous
        meta = _level_metadata(level.meta, fork, n, level.row, row, depth)
        child = _Level(
            beps, bsnaps, k_start, bturns, brows, traj.turn_valid,
            level_entropy(bturns) if keep else None,
            jnp.where(used, turn + 1, k_turns), meta, row,
        )  # fmt: skip
        return traj, out_rows, child

    h0 = level.entropy[:, 0]  # rule "arpo": each tree's reference entropy, its root's turn 0
    trajs, out_rows, metas = [root_traj], [root_rows], [level.meta]
    for depth in range(1, bc.levels + 1):
        if depth == 1:  # the keys of one-level trees
            key_fork, key_level = key_rule, key_branch
        else:
            key_fork = jax.random.fold_in(key_rule, depth)
            key_level = jax.random.fold_in(key_branch, depth)
        reference = None if depth == 1 else h0[level.meta["root"]]
        fork = fork_turns(bc, level.turn_valid, level.entropy, key_fork, level.first, reference)
        traj, rows_l, level = fork_level(level, fork, key_level, depth)
        trajs.append(traj)
        out_rows.append(rows_l)
        metas.append(level.meta)

    both = jax.tree.map(lambda *xs: jnp.concatenate(xs), *trajs)
    meta = {f: jnp.concatenate([d[f] for d in metas]) for f in metas[0]}
    tree = TreeTrajectory(
        **{f.name: getattr(both, f.name) for f in dataclasses.fields(both)}, **meta
    )
    if root_rows is None:
        return tree, None
    return tree, jax.tree.map(lambda *xs: jnp.concatenate(xs), *out_rows)


def _rows_where(rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """`where(rows, a, b)` with bool[R] `rows` broadcast over the trailing axes of a, b."""
    return jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b)
