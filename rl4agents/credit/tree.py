"""Tree credit: estimators over episodes that share prefixes (VinePPO, Tree-GRPO, ARPO, SALT).

A branching rollout (`rl4agents.rollout.branch`) returns a `TreeTrajectory`: a `Trajectory`
whose rows are the roots and the continuations forked from them, plus who forked from whom. The
estimators here read that structure through two arrays:

- `step_ids int32[B, K]`: the agent step (an action and the observation it got) of each turn;
  two rows have the same id at turn k exactly when they share every turn up to and including k.
  A row *owns* its steps from `fork_turn` on (it sampled them); the steps before were copied
  from its parent, are out of its `action_mask`, and are trained on the owner's row.
- the *state* before turn k, `s_k`: the task's prompt for k = 0 (shared by the task group), else
  the step of turn k - 1.

On a plain `Trajectory` (no tree) every row is its own tree: rows share only the prompt of their
task, so each estimator still runs (docs/methods.md gives what each reduces to). Each is
declared `needs_tree` (`requires_tree`): a config that trains with one and no branching rule
(`rollout.branch.rule="none"`) is refused at start-up.

Leaf scores are `common.episode_scores` (the outcome minus the summed token penalty); a row
is a leaf when it took a turn. Standard deviations are unbiased (ddof=1); a group of one gives 0.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common
from rl4agents.credit.outcome import _check_choice
from rl4agents.credit.registry import CreditOutput, declare, register
from rl4agents.registry import for_section
from rl4agents.types import Trajectory


@flax.struct.dataclass
class TreeTrajectory(Trajectory):
    """A `Trajectory` of roots and branches with its tree metadata (shapes as `Trajectory`).

    The metadata fields default to None only so that the dataclass can extend `Trajectory`;
    `rl4agents.rollout.branch.branch_rollout` fills all of them.
    """

    parent: jax.Array | None = None  # int32[B] row this row was forked from, -1 for a root
    fork_turn: jax.Array | None = None  # int32[B] first turn the row sampled (K: none)
    depth: jax.Array | None = None  # int32[B] forks between the root and the row
    branch_id: jax.Array | None = None  # int32[B] index among the fork's N branches, -1 root
    root: jax.Array | None = None  # int32[B] root row of the row's tree
    step_ids: jax.Array | None = None  # int32[B, K] step node of each turn (module docstring)


def tree_of(traj: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(step_ids int32[B, K], root int32[B], fork_turn int32[B]) of `traj`.

    A plain `Trajectory` (or one without metadata) is a forest of one-row trees: step ids
    `b K + k`, root `b`, fork turn 0.
    """
    b, k = traj.turn_valid.shape
    steps = getattr(traj, "step_ids", None)
    if steps is None:
        own = jnp.arange(b * k, dtype=jnp.int32).reshape(b, k)
        return own, jnp.arange(b, dtype=jnp.int32), jnp.zeros((b,), jnp.int32)
    return steps, traj.root, traj.fork_turn


def requires_tree(name: str) -> bool:
    """Whether credit function `name` is declared `needs_tree`: the train step runs it only
    on a branching rollout (`rollout.branch.rule` other than "none"), whose tree it reads."""
    return bool(for_section("credit").attr(name, "needs_tree", False))


def state_ids(traj: Trajectory, steps: jax.Array) -> jax.Array:
    """int32[B, K] id of the state each turn acted from, in [0, B K + B).

    s_0 is the task's prompt (`B K + dense group id`), s_k for k >= 1 the step of turn k - 1.
    """
    b, k = steps.shape
    task = b * k + common.dense_group_ids(traj.group_ids)
    return jnp.concatenate([task[:, None], steps[:, :-1]], axis=1)


def owned_steps(traj: Trajectory, fork_turn: jax.Array) -> jax.Array:
    """bool[B, K]: the valid turns the row sampled itself (k >= fork_turn)."""
    k = jnp.arange(traj.turn_valid.shape[1])
    return traj.turn_valid & (k[None, :] >= fork_turn[:, None])


def _node_sums(x: jax.Array, ids: jax.Array, w: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Per element: the sum of w x and of w over the elements of its node (ids in [0, n))."""
    flat = ids.reshape(-1)
    s = jax.ops.segment_sum((w * x).reshape(-1), flat, num_segments=n)
    c = jax.ops.segment_sum(w.reshape(-1), flat, num_segments=n)
    return s[flat].reshape(ids.shape), c[flat].reshape(ids.shape)


@register("vineppo")
def vineppo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    gamma: float = 1.0,
    train_on: str = "roots",
) -> CreditOutput:
    """VinePPO: Monte-Carlo values from the continuations of a shared state, no critic.

    VinePPO, https://arxiv.org/abs/2410.01679 (McGill-NLP/VinePPO): the value of an
    intermediate state is the mean return of K continuations resampled from it, and a step's
    advantage is `r_t + gamma V(s_{t+1}) - V(s_t)`. Here the continuations are the rows of
    the batch that share a state (the branches of a branching rollout; the task group at the
    prompt). With `G_{b,k}` the discounted return of row b from turn k (turn rewards minus each
    turn's token penalty) and `n_{b,k}` its step at turn k:

    - `Q(n) = mean G_{c,k}` over the rows c through step n: `r_k + gamma V(s_{k+1})` with
      `V(s_{k+1})` the mean return of the continuations after the step (rows through a step
      share its reward and the state after it);
    - `V_b(s_k) = mean Q(n')` over the other steps n' != n_{b,k} taken from the same state
      `s_k`, one term per step (continuations that share an action count once); these are
      samples of the policy at `s_k` that do not depend on row b's action;
    - `A_{b,k} = Q(n_{b,k}) - V_b(s_k)` on the steps row b sampled, 0 when no other step was
      taken from `s_k` (nothing to compare with).

    With branching rule "every" and N branches, every state of a root has N other steps, as
    VinePPO's K = N value rollouts per step. On a plain `Trajectory` this is a leave-one-out
    group baseline (RLOO) on the first turn and 0 on the others.

    Args:
      traj: Trajectory or TreeTrajectory; uses `turn_rewards`, `turn_valid`, `group_ids` and
        the tree metadata.
      values: unused (critic-free).
      gamma: turn discount (VinePPO uses 1).
      train_on: "roots" (VinePPO: branches only estimate values, their advantages are 0,
        and the train step leaves their tokens out of the loss) or "all" (every row's
        sampled steps).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    check_range("gamma", gamma, 0.0, 1.0)
    _check_choice("train_on", train_on, ("roots", "all"))
    steps, root, fork_turn = tree_of(traj)
    b, k = steps.shape
    valid = traj.turn_valid
    ret = common.discounted_turn_returns(common.penalised_turn_rewards(traj), valid, gamma)
    total, count = _node_sums(ret, steps, valid.astype(jnp.float32), b * k)
    q = total / jnp.maximum(count, 1.0)  # Q of each row's step
    owned = owned_steps(traj, fork_turn)  # each step node has exactly one owner
    q_sum, n_steps = _node_sums(q, state_ids(traj, steps), owned.astype(jnp.float32), b * k + b)
    others = n_steps - 1.0  # every valid step's node has its owner among the state's steps
    baseline = (q_sum - q) / jnp.maximum(others, 1.0)
    trained = owned & (others > 0)
    if train_on == "roots":
        trained = trained & (root == jnp.arange(b))[:, None]
    adv = jnp.where(trained, q - baseline, 0.0)
    metrics = {
        "vine_frac_steps_valued": common.masked_mean(trained.astype(jnp.float32), owned),
        "vine_other_steps": common.masked_mean(others, owned),
    }
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)


def _leaf_scores(traj: Trajectory) -> tuple[jax.Array, jax.Array]:
    """(score f32[B], leaf weight f32[B]): a row is a leaf when it took a turn and has
    something to train on (`common.trainable_episodes`: an episode an episode filter dropped
    is in no statistic)."""
    leaf = (traj.num_turns > 0) & common.trainable_episodes(traj)
    return common.episode_scores(traj), leaf.astype(jnp.float32)


def _zscore(x, ids, w, eps, with_std=True) -> jax.Array:
    """(x - mean) / (std + eps) within dense groups `ids`; 0 for a group of one."""
    return common.zscore(x, ids, w, eps, with_std)


def _attribute(
    traj: Trajectory, steps: jax.Array, fork_turn: jax.Array, leaf_adv: jax.Array, reduce: str
) -> tuple[jax.Array, jax.Array]:
    """Per owned step: the sum or mean of `leaf_adv` over the leaves through the step.

    Returns (advantages f32[B, T], per-step f32[B, K]).
    """
    b, k = steps.shape
    valid = traj.turn_valid
    w = valid.astype(jnp.float32)
    x = jnp.broadcast_to(leaf_adv[:, None], (b, k))
    total, count = _node_sums(x, steps, w, b * k)
    per_step = total if reduce == "sum" else total / jnp.maximum(count, 1.0)
    per_step = jnp.where(owned_steps(traj, fork_turn), per_step, 0.0)
    return common.turns_to_tokens(per_step, traj), per_step


@register("tree_grpo")
def tree_grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    prefix: str = "sum",
    scale: str = "std",
    eps: float = 1e-6,
) -> CreditOutput:
    """Tree-GRPO: intra-tree plus inter-tree group-relative advantages over agent-step nodes.

    Tree Search for LLM Agent Reinforcement Learning, https://arxiv.org/abs/2509.21240
    (AMAP-ML/Tree-GRPO). Each leaf (row) i with score `R_i` in tree `T(i)` (a root and its
    branches) of task group `g(i)` gets
    `A_i = (R_i - mean_{T(i)} R) / (std_{T(i)} R + eps) + (R_i - mean_{g(i)} R) / (std_{g(i)} R
    + eps)` (scale "none": without the divisions). Tree-GRPO trains every leaf on its whole
    path, so a step shared by several leaves is trained once per leaf; here each step is in
    the batch once (on the row that sampled it) and gets `sum` (prefix "sum": the same
    gradient as one copy per leaf) or `mean` (prefix "mean") of `A_i` over the leaves below
    it. A tree of one leaf has intra-tree advantage 0, so on a plain `Trajectory` this is GRPO.

    Args:
      traj: Trajectory or TreeTrajectory; uses `outcome_reward`, `token_penalty`,
        `num_turns`, `group_ids`, `turn_valid` and the tree metadata.
      values: unused.
      prefix: "sum" | "mean", how a shared step combines the advantages of its leaves.
      scale: "std" | "none".
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    _check_choice("prefix", prefix, ("sum", "mean"))
    _check_choice("scale", scale, ("std", "none"))
    check_range("eps", eps, 0.0, low_open=True)
    steps, root, fork_turn = tree_of(traj)
    score, leaf = _leaf_scores(traj)
    with_std = scale == "std"
    trees = common.dense_pair_ids(traj.group_ids, root)
    intra = _zscore(score, trees, leaf, eps, with_std)
    inter = _zscore(score, common.dense_group_ids(traj.group_ids), leaf, eps, with_std)
    leaf_adv = jnp.where(leaf > 0, intra + inter, 0.0)
    adv, per_step = _attribute(traj, steps, fork_turn, leaf_adv, prefix)
    metrics = {
        "tree_adv_intra_abs": common.masked_mean(jnp.abs(intra), leaf > 0),
        "tree_adv_inter_abs": common.masked_mean(jnp.abs(inter), leaf > 0),
    }
    return CreditOutput(adv, None, metrics)


@register("arpo")
def arpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> CreditOutput:
    """ARPO's advantage attribution: a shared step gets the mean advantage of its branches.

    Agentic Reinforced Policy Optimization, https://arxiv.org/abs/2507.19849
    (dongguanting/ARPO), "hard" attribution: every leaf i gets the GRPO advantage
    `A_i = (R_i - mean_g R) / (std_g R + eps)` over all leaves of its task group (roots and
    branches alike), tokens a leaf sampled alone get `A_i` and tokens of a step shared by
    several leaves get the mean of their `A_i`. ARPO's branching rule (fork where the entropy
    rose since the first turn) is `rollout.branch.BranchConfig(rule="arpo")`. On a plain
    `Trajectory` this is GRPO.

    Args:
      traj: Trajectory or TreeTrajectory.
      values: unused.
      scale: "std" | "none".
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    _check_choice("scale", scale, ("std", "none"))
    check_range("eps", eps, 0.0, low_open=True)
    steps, _, fork_turn = tree_of(traj)
    score, leaf = _leaf_scores(traj)
    ids = common.dense_group_ids(traj.group_ids)
    leaf_adv = jnp.where(leaf > 0, _zscore(score, ids, leaf, eps, scale == "std"), 0.0)
    adv, per_step = _attribute(traj, steps, fork_turn, leaf_adv, "mean")
    shared = _node_sums(
        jnp.ones_like(per_step), steps, traj.turn_valid.astype(jnp.float32), steps.size
    )[1]
    metrics = {
        "arpo_frac_steps_shared": common.masked_mean(
            (shared > 1).astype(jnp.float32), owned_steps(traj, fork_turn)
        )
    }
    return CreditOutput(adv, None, metrics)


def history_divergence(traj: Trajectory) -> jax.Array:
    """int32[B, B]: the first turn at which the histories of two rows differ (K: never).

    Rows are compared slot by slot (all rows share the slot layout): the first slot where
    their valid masks or valid tokens differ lies in turn block `max(cummax turn_ids)` of the
    two rows (-1 in the prompt: the histories differ from the start).
    """
    b, k = traj.turn_valid.shape
    t = traj.tokens.shape[1]
    tok = jnp.where(traj.valid_mask, traj.tokens, -1)
    differ = (tok[:, None, :] != tok[None, :, :]) | (
        traj.valid_mask[:, None, :] != traj.valid_mask[None, :, :]
    )
    first = jnp.where(differ.any(-1), jnp.argmax(differ, axis=-1), t)  # [B, B]
    block = jax.lax.cummax(traj.turn_ids, axis=1)  # [B, T]
    at = jnp.minimum(first, t - 1)
    turn = jnp.maximum(
        jnp.take_along_axis(block, at, axis=1), jnp.take_along_axis(block, at.T, axis=1).T
    )
    return jnp.where(first < t, turn, k).astype(jnp.int32)


@register("salt", needs_groups=True)
def salt(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> CreditOutput:
    """SALT: step advantages averaged over the trajectory graph of the task group.

    SALT, https://arxiv.org/abs/2510.20022: the episodes of a task group form a graph whose
    nodes are steps with the same history (the prompt and every action and observation so
    far); each episode gets the GRPO advantage `A_i = (R_i - mean_g R) / (std_g R + eps)` and
    each step the mean of `A_i` over the episodes through its node, so a step every episode
    took gets about 0 and a step taken only by winners keeps a positive sign. Histories are
    compared token by token (`history_divergence`): no tree metadata is needed, and on a
    branching rollout whose branches never resample the same step this equals `arpo`. It is
    not GiGPO over history anchors: GiGPO adds a step-group return term to the episode
    advantage, SALT replaces the episode advantage by the node mean (tests/credit/test_tree.py).

    Args:
      traj: Trajectory (or TreeTrajectory).
      values: unused.
      scale: "std" | "none".
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    _check_choice("scale", scale, ("std", "none"))
    check_range("eps", eps, 0.0, low_open=True)
    score, leaf = _leaf_scores(traj)
    ids = common.dense_group_ids(traj.group_ids)
    leaf_adv = jnp.where(leaf > 0, _zscore(score, ids, leaf, eps, scale == "std"), 0.0)
    div = history_divergence(traj)  # [B, B]
    k = traj.turn_valid.shape[1]
    same_group = ids[:, None] == ids[None, :]
    turn = jnp.arange(k)
    # node[b, c, k]: row c passed row b's step k
    node = (
        same_group[:, :, None]
        & (div[:, :, None] > turn[None, None, :])
        & traj.turn_valid[None, :, :]
        & traj.turn_valid[:, None, :]
    )
    w = node.astype(jnp.float32)
    count = w.sum(axis=1)
    per_step = jnp.einsum("bck,c->bk", w, leaf_adv) / jnp.maximum(count, 1.0)
    per_step = jnp.where(traj.turn_valid, per_step, 0.0)
    metrics = {"salt_node_size": common.masked_mean(count, traj.turn_valid)}
    return CreditOutput(common.turns_to_tokens(per_step, traj), None, metrics)


# These estimators compare the continuations of a branching rollout; on a plain batch they
# reduce to simpler ones (RLOO on the first turn, GRPO; docs/methods.md), so the train step
# runs them only with a branching rule (`requires_tree`, `rollout.branch`).
for _name in ("vineppo", "tree_grpo", "arpo", "salt"):
    declare(_name, needs_tree=True)
