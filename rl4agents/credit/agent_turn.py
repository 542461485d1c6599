"""Agent- and turn-wise group advantages for multi-agent episodes (AT-GRPO).

In an episode where agents take turns (`envs.two_agent`: the guide at even turns, the walker
at odd ones), the turns of one agent at one turn index see prompts of one kind, and the turns
of the other agent another; GRPO's group of a task mixes them. AT-GRPO compares like with
like: a group is the turns that share (task, agent, turn index), and each agent is scored by
its own reward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common
from rl4agents.credit.outcome import _check_choice
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory


def agent_rewards(traj: Trajectory, num_agents: int, team_coef: float) -> jax.Array:
    """Each agent's reward after every turn: f32[B, A, K].

    A turn whose action did not parse (`turn_valid & ~turn_action_valid`) earns the penalty
    of that action alone, so its whole reward is the acting agent's own term; every other
    turn's reward is the team's (`envs.two_agent`'s `per_agent_returns` makes the same split).
    A turn's `token_penalty` (KL in the reward) is its acting agent's own term too. With
    `a(j) = j mod num_agents` the agent of turn j:

        u[b, a, j] = team_coef * team[b, j] + 1[a(j) = a] * own[b, j]

    Args:
      traj: B episodes of K turns; uses `turn_rewards`, `turn_valid`, `turn_action_valid`
        and `token_penalty` (when set).
      num_agents: A, the agents taking turns in order.
      team_coef: the weight of the team reward in each agent's reward.

    Returns:
      f32[B, A, K], 0 on turns that did not happen.
    """
    valid = traj.turn_valid
    rewards = jnp.where(valid, traj.turn_rewards.astype(jnp.float32), 0.0)
    penalty_turn = valid & ~traj.turn_action_valid
    own = jnp.where(penalty_turn, rewards, 0.0)
    team = rewards - own
    if traj.token_penalty is not None:
        kl, _, _ = common.turn_token_stats(traj.token_penalty, traj)
        own = own - jnp.where(valid, kl, 0.0)
    turns = valid.shape[1]
    acting = (jnp.arange(turns) % num_agents)[None, :] == jnp.arange(num_agents)[:, None]
    return team_coef * team[:, None, :] + jnp.where(acting[None], own[:, None, :], 0.0)


@register("at_grpo", needs_groups=True)
def at_grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    num_agents: int = 2,
    gamma: float = 1.0,
    team_coef: float = 1.0,
    norm: str = "std",
    group_by: str = "task",
    eps: float = 1e-6,
) -> CreditOutput:
    """AT-GRPO: group-relative advantages over groups keyed by (agent, turn).

    Zhao et al., "Stronger Together: On-Policy Reinforcement Learning for Collaborative
    LLMs" (arXiv 2510.11062; reference code pettingllms-ai/PettingLLMs). With `a(k) = k mod
    num_agents` the agent acting at turn k (the guide and the walker of `two_agent`) and
    `u[b, a, j]` agent a's reward after turn j (`agent_rewards`: `team_coef` x the team
    reward plus the penalties of a's own invalid turns):

    1. The acting agent's return from turn k:
       `R_{b,k} = sum_{j >= k, valid} gamma^(j-k) u[b, a(k), j]`.
    2. Groups: the valid turns of the batch with the same (task, agent, turn index) for
       `group_by="task"` (the G samples of a task at turn k; in alternating turns the agent
       is fixed by k), or the same (agent, turn index) over all tasks for `group_by="batch"`.
    3. `A_{b,k} = (R_{b,k} - mean_g) / (std_g + eps)` ("std") or `R_{b,k} - mean_g`
       ("mean"), unbiased std; a group of one gives 0. Turns that did not happen are in no
       group, so an episode that ended early does not pad the later groups with zeros.
    4. `A_{b,k}` on the action tokens of turn k.

    The paper forms each (agent, turn) group from K actions sampled at one shared state
    (tree sampling); here the group is the G episodes of a task at that turn, whose states
    may differ once their histories diverge. With one agent, no invalid turns and no KL this
    is `turn_return` with `norm="group"` (tested).

    Args:
      traj: Trajectory; uses `turn_rewards`, `turn_valid`, `turn_action_valid`, `group_ids`
        (and `token_penalty`).
      values: unused (critic-free).
      num_agents: agents taking turns in order, >= 1 (two_agent: 2).
      gamma: turn discount, in [0, 1].
      team_coef: weight of the team reward in each agent's reward, >= 0.
      norm: "std" | "mean".
      group_by: "task" | "batch".
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise ValueError(f"num_agents={num_agents!r}; allowed: a whole number >= 1")
    check_range("gamma", gamma, 0.0, 1.0)
    check_range("team_coef", team_coef, 0.0)
    _check_choice("norm", norm, ("std", "mean"))
    _check_choice("group_by", group_by, ("task", "batch"))
    if norm == "std":
        check_range("eps", eps, 0.0, low_open=True)
    valid = traj.turn_valid
    batch, turns = valid.shape
    per_agent = agent_rewards(traj, num_agents, team_coef)  # [B, A, K]
    returns_all = jax.vmap(
        lambda u: common.discounted_turn_returns(u, valid, gamma), in_axes=1, out_axes=1
    )(per_agent)  # [B, A, K]
    acting = jnp.arange(turns) % num_agents
    returns = jnp.take_along_axis(
        returns_all, jnp.broadcast_to(acting[None, None, :], (batch, 1, turns)), axis=1
    )[:, 0]  # [B, K]: the acting agent's return
    turn_idx = jnp.broadcast_to(jnp.arange(turns, dtype=jnp.int32), (batch, turns))
    if group_by == "task":
        task = jnp.broadcast_to(traj.group_ids[:, None], (batch, turns))
    else:
        task = jnp.zeros((batch, turns), jnp.int32)
    ids = common.dense_pair_ids(task.reshape(-1), turn_idx.reshape(-1))
    weights = valid.reshape(-1).astype(jnp.float32)
    adv = common.zscore(returns.reshape(-1), ids, weights, eps, with_std=norm == "std")
    _, _, size = common.weighted_group_stats(returns.reshape(-1), ids, weights)
    adv, size = adv.reshape(batch, turns), size.reshape(batch, turns)
    adv = jnp.where(valid, adv, 0.0)
    metrics = {
        "agent_turn_group_size": common.masked_mean(size, valid),
        "frac_turns_grouped": common.masked_mean((size > 1).astype(jnp.float32), valid),
        "agent_return_mean": common.masked_mean(returns, valid),
    }
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)
