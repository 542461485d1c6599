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
already treats as episodes without an action. The turns a branch copied from its root are in
the branch's trajectory (tokens, rewards, `turn_valid`: its return is a whole episode's return)
but not in its `action_mask` (and its `logp_behavior` / `entropy_behavior` are 0 there): every
sampled token is trained once, on the row that sampled it. The tree metadata
(`credit.tree.TreeTrajectory`) says who forked from whom; docs/methods.md, "Branching rollouts".
The train step samples with it when the config sets `rollout.branch.rule` (`StepConfig.branch`).

Costs: the carry is kept for all K turns of the roots (under context="full" K copies of the
roots' KV cache); the branches run one turn loop over turns `k_start..K-1`, where `k_start` is
the earliest turn any rule could fork at (the smallest fixed turn for "turns", else 0), and a
branch waits (computes a turn and keeps nothing) on turns before its own fork turn. Under
context="window" nothing is kept but the last `window_turns` turn blocks: a fork copies them
and the branch rebuilds its context from them like any turn does, so forking is cheap there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

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
    """

    rule: str = "every"
    num_branches: int = 2
    turns: tuple[int, ...] = ()
    max_forks: int = 1
    entropy_threshold: float = 0.0
    entropy_tokens: int = 1
    arpo_weight: float = 0.2
    arpo_prob: float = 0.5

    def fork_slots(self, num_turns: int) -> int:
        """M, fork slots per root, for a rollout of `num_turns` turns."""
        if self.rule == "every":
            return num_turns
        if self.rule == "turns":
            return len(self.turns)
        return self.max_forks

    def num_rows(self, batch: int, num_turns: int) -> int:
        """Rows of a branching rollout of `batch` roots and `num_turns` turns: B (1 + M N)."""
        return batch * (1 + self.fork_slots(num_turns) * self.num_branches)


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
    bc: BranchConfig, turn_valid: jax.Array, entropy: jax.Array, key: jax.Array
) -> jax.Array:
    """The fork turn of every fork slot of every root: int32[B, M], -1 for an unused slot.

    A root forks only at turns it took (`turn_valid`): the state before a turn that did not
    happen is past the episode's end.

    Args:
      bc: the branching rule.
      turn_valid: bool[B, K] the root's turns.
      entropy: f32[B, K] H_k of each turn (`turn_entropy`).
      key: PRNG key of rule "arpo".
    """
    b, k = turn_valid.shape
    turns = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
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
    u = jax.random.uniform(key, (b, k))
    p = jnp.clip(u - bc.arpo_weight * (entropy - entropy[:, :1]), 0.0, 1.0)
    return _first_m(turn_valid & (turns >= 1) & (p <= bc.arpo_prob), bc.max_forks)


def _tree_metadata(fork: jax.Array, n: int, k: int) -> dict[str, jax.Array]:
    """Parent, fork turn, depth, branch id, root and step ids of B roots + B*M*N branches."""
    b, m = fork.shape
    roots = jnp.arange(b, dtype=jnp.int32)
    parent = jnp.repeat(roots, m * n)
    turn = jnp.repeat(fork.reshape(-1), n)
    used = turn >= 0
    rows = b + b * m * n
    own = jnp.arange(rows, dtype=jnp.int32)[:, None] * k + jnp.arange(k, dtype=jnp.int32)
    copied = jnp.arange(k)[None, :] < turn[:, None]  # turns before the fork: the root's steps
    branch_steps = jnp.where(copied, own[parent], own[b:])
    return dict(
        parent=jnp.concatenate([jnp.full((b,), -1, jnp.int32), parent]),
        fork_turn=jnp.concatenate([jnp.zeros((b,), jnp.int32), jnp.where(used, turn, k)]),
        depth=jnp.concatenate([jnp.zeros((b,), jnp.int32), jnp.ones((b * m * n,), jnp.int32)]),
        branch_id=jnp.concatenate(
            [jnp.full((b,), -1, jnp.int32), jnp.tile(jnp.arange(n, dtype=jnp.int32), b * m)]
        ),
        root=jnp.concatenate([roots, parent]),
        step_ids=jnp.concatenate([own[:b], branch_steps]),
    )


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
    """Roots plus N continuations from each fork point; pure and jittable.

    Args:
      key: PRNG key; the roots use it exactly as `rollout` does, the branches and rule "arpo"
        keys folded from it.
      graphdef, params, env, env_params, cfg, task_keys: as `rollout.rollout_rows`.
        `cfg.turn_groups` is not applied: the roots run one turn group (a cache of T slots),
        so that the carries of all turns have one shape.
      bc: where to fork and how many continuations.
      shard_fn: as `rollout_rows`; the branch rows are `B x M x N`, so a batch-sharded mesh
        needs that divisible by its size too.

    Returns:
      (TreeTrajectory of B (1 + M N) rows, StepRows of those rows under context="window",
      None under "full"). See the module docstring for the row order and masks.
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

    # Fork points.
    key_rule, key_branch = jax.random.split(jax.random.fold_in(key, 1))

    def blk_view(x):  # [K, B, A+O] -> the action slots [B, K, A]
        return jnp.swapaxes(x, 0, 1)[:, :, : lay.action]

    entropy = turn_entropy(blk_view(turns.entropy), blk_view(turns.action), bc.entropy_tokens)
    fork = fork_turns(bc, root_traj.turn_valid, entropy, key_rule)  # [B, M]
    b = fork.shape[0]
    parent = jnp.repeat(jnp.arange(b), m * n)  # [R] branch rows
    turn = jnp.repeat(fork.reshape(-1), n)
    used = turn >= 0
    start = jnp.where(used, turn, 0)

    # Branch rows: the root's carry at the fork turn; an unused slot is an episode already over.
    c0 = jax.tree.map(lambda s: s[start, parent], snaps)
    c0 = c0._replace(done=c0.done | ~used, success=c0.success & used)
    c0 = shard(c0)
    key_sample, key_env = jax.random.split(key_branch)
    beps = rollout_lib.Episodes(
        eps.prompt_tokens[parent], eps.prompt_valid[parent], eps.group_ids[parent],
        key_sample, key_env,
    )  # fmt: skip
    k_start = min(bc.turns) if bc.rule == "turns" else 0

    def copy_turn(out, k):
        """The roots' output of turn k for the branch rows, without the sampling record."""
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
        wait = (k < start) & used  # before its fork the branch keeps the root's prefix
        c2 = jax.tree.map(lambda old, new: _rows_where(wait, old, new), c, c2)
        out = jax.tree.map(lambda r, o: _rows_where(wait, r, o), copy_turn(turns, k), out)
        if rw is not None:
            rw = jax.tree.map(lambda r, o: _rows_where(wait, r, o), copy_turn(rows, k), rw)
        return c2, (out, rw)

    bfinal, (bturns, brows) = jax.lax.scan(branch_turn, c0, jnp.arange(k_start, k_turns))
    if k_start > 0:  # turns no rule forks at: every branch copies them
        head = [copy_turn(turns, k) for k in range(k_start)]
        head_rows = [copy_turn(rows, k) for k in range(k_start)]

        def stack(xs):
            return jax.tree.map(lambda *a: jnp.stack(a), *xs)

        bturns = jax.tree.map(lambda h, t: jnp.concatenate([h, t]), stack(head), bturns)
        if brows is not None:
            brows = jax.tree.map(lambda h, t: jnp.concatenate([h, t]), stack(head_rows), brows)
    branch_traj, branch_rows = loop.assemble(beps, bturns, brows, bfinal)

    both = jax.tree.map(lambda a, c: jnp.concatenate([a, c]), root_traj, branch_traj)
    meta = _tree_metadata(fork, n, k_turns)
    tree = TreeTrajectory(
        **{f.name: getattr(both, f.name) for f in dataclasses.fields(both)}, **meta
    )
    out_rows = None
    if root_rows is not None:
        out_rows = jax.tree.map(lambda a, c: jnp.concatenate([a, c]), root_rows, branch_rows)
    return tree, out_rows


def _rows_where(rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """`where(rows, a, b)` with bool[R] `rows` broadcast over the trailing axes of a, b."""
    return jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b)
