"""Two-agent cooperation: a guide that sees the map and a walker that moves, one shared policy.

A `size x size` grid holds walls, a goal and the walker. The two agents take turns within one
episode, the guide first (`agent_of_turn(k) = k % 2`), and the same policy plays both roles,
told which one by a role prompt:

  guide turns   observation "guide:" and the whole map, one row of cells per line:
                "_" floor, "#" wall, "G" goal, "W" walker;
                action: a message "say up", "say down", "say left", "say right" or "say stay".
  walker turns  observation "walker:", the guide's last message ("guide says up", or
                "guide says nothing" after an invalid message) and the (2r+1) x (2r+1) cells
                around the walker (`view_radius` r; off-grid cells "#", the goal looks like
                floor: the walker cannot see it); action: "up", "down", "left", "right",
                "stay". Moving into a wall or off the grid leaves the walker in place.

A message on a walker turn or a move on a guide turn is as invalid as junk: that agent's turn
is penalised (`-invalid_penalty`, `valid_action=False`), the observation says so and lists the
role's actions, and the roles still alternate. The team reward `goal_reward` comes on the walker
turn that reaches the goal (done, success). With `progress_reward` c > 0 each walker turn also
earns the potential-based `c * (d(s) - d(s'))`, d the shortest-path distance to the goal. The
episode ends unsolved (done) after `max_steps` turns of either agent.

Credit per agent: `per_agent_returns` splits a batch of turn rewards into the guide's and the
walker's returns: each gets the whole team reward (goal and progress) plus the penalties of its
own invalid turns only. This env trains "one shared policy with role prompts": the rollout
samples every turn from the same policy. Two separate policies would route turn k to policy
`agent_of_turn(k)`: sample its action from that policy, train each policy only on the action
tokens of its own turns (`turn_ids % 2 == agent` in a Trajectory), with `per_agent_returns(...)
[:, agent]` (or per-turn rewards masked the same way) as its return.

Maps are drawn in JAX from the reset key like FrozenLake's: `num_candidates` Bernoulli
(`wall_prob`) wall layouts with a random start and goal per round, the first whose goal is
reachable at a shortest-path distance in [`min_distance`, `max_steps // 2`] and whose class
matches the split. The train/test split is by map: `hash_u32(walls, start, goal) % 1000 <
test_fraction * 1000` is the test class. "ood" is larger maps (`ood_size`, with
`ood_max_steps`), either class.

Modules: `world` (roles, actions, cells, state, distances, map hash), `generator` (map
generation), `host` (states from text, rendering, the oracle's plan) and `env` (the registered
`TwoAgent`: settings, tables, both roles' views, `reset_env` / `step_env`, per-agent returns).
"""

from rl4agents.envs.two_agent.env import TwoAgent, TwoAgentConfig
from rl4agents.envs.two_agent.world import (
    ACTIONS,
    AGENTS,
    CELLS,
    DELTAS,
    DIRECTIONS,
    FLOOR,
    GOAL,
    GUIDE,
    NO_MESSAGE,
    SPLITS,
    STAY,
    WALKER,
    WALKER_CELL,
    WALL,
    TwoAgentParams,
    TwoAgentState,
    agent_of_turn,
    distance_map,
    map_hash,
)

__all__ = [
    "TwoAgent",
    "TwoAgentConfig",
    "ACTIONS",
    "AGENTS",
    "CELLS",
    "DELTAS",
    "DIRECTIONS",
    "FLOOR",
    "GOAL",
    "GUIDE",
    "NO_MESSAGE",
    "SPLITS",
    "STAY",
    "WALKER",
    "WALKER_CELL",
    "WALL",
    "TwoAgentParams",
    "TwoAgentState",
    "agent_of_turn",
    "distance_map",
    "map_hash",
]
