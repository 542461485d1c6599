"""Maze with partial observability (a memory task) as a multi-turn text environment.

A perfect maze (exactly one path between any two cells) of `size x size` rooms is drawn on a
grid of `(2 * size + 1)` character cells per side: rooms sit at odd (row, col), the cells
between two rooms are passages (open when carved) and the border and every even-even cell are
walls. The agent moves one grid cell per turn ("up", "down", "left", "right"; a move into a wall
is a valid turn that leaves it in place) and sees only the `(2 * view_radius + 1)` square window
around itself, one row of single-character cells per line:

  "#" wall (or off-grid), "_" open, "G" goal (only when inside the window), "P" the agent.

No coordinates and no visited marks are shown: to find the goal the agent must remember where it
has been (dead reckoning from its own moves and views). Reaching the goal ends the episode with
`goal_reward`. A turn whose text is not an action costs `invalid_penalty`; its observation says
so and lists the allowed words before the view. Optional per-turn process signals:
`progress_reward * (d(s) - d(s'))` with d the BFS distance to the goal through the maze
(potential-based shaping; it uses the hidden goal position), and `explore_reward` for each
grid cell entered for the first time (the exploration sub-goal; it depends on the episode's
history, which the anchor leaves out, see `Maze.anchor`).

Generation (pure JAX, from the reset key): `num_candidates` mazes per round are carved in
parallel by `algorithm`, with fixed-size loops:
  "dfs" (default): randomized depth-first search (recursive backtracker), a `fori_loop` of
    `2 * size**2` push-or-pop iterations on a fixed-size stack. Long winding corridors with few
    branches, so dead ends are long and remembering explored branches matters. At 4 x 4 rooms
    the layouts repeat now and then (about 3.8k distinct in 20k draws);
  "prim": randomized Prim, `size**2 - 1` iterations each adding a random tree-to-new-room
    edge. Many short dead ends, shorter paths, more distinct layouts (16k in 20k draws at 4 x 4).
The first candidate whose layout class matches the split is kept (at most
`generator._MAX_ROUNDS` rounds; if none qualifies, probability about 0.81**256 < 1e-23 for the
defaults, a fixed serpentine maze of either class is used).
Then the goal is a uniformly random room and the start a uniformly random room at least
`min_distance` moves from it along the maze (capped at the farthest room). The default 2 allows
any other room, so difficulty varies from task to task and random play still reaches the goal
now and then (about 1 episode in 6 within 48 random turns at size 4): the sparse reward has some
signal from the start.

Splits: a layout is test-class when `hash_u32(walls) % 1000 < test_fraction * 1000`; "train"
only generates train-class layouts, "test" only test-class ones, so training never sees a test
maze (with any start and goal). "ood" is a larger maze (`size=ood_size`, default 6) of either
class.

Modules: `world` (constants, state, distance map, layout hash and fixed layouts), `generator`
(carving and the goal and start placement), `oracle` (the host-side shortest and exploration
plans) and `env` (the registered `Maze`: settings, tables, `reset_env` / `step_env`).
"""

from rl4agents.envs.maze.env import Maze, MazeConfig
from rl4agents.envs.maze.generator import carve, carve_bits, generate
from rl4agents.envs.maze.oracle import explore_plan, seen_cells, shortest_plan
from rl4agents.envs.maze.world import (
    ACTIONS,
    AGENT,
    ALGORITHMS,
    DELTAS,
    GOAL,
    OPEN,
    SPLITS,
    WALL,
    MazeParams,
    MazeState,
    distance_map,
    far_distance,
    layout_hash,
    serpentine_walls,
)

__all__ = [
    "Maze",
    "MazeConfig",
    "carve",
    "carve_bits",
    "generate",
    "explore_plan",
    "seen_cells",
    "shortest_plan",
    "ACTIONS",
    "AGENT",
    "ALGORITHMS",
    "DELTAS",
    "GOAL",
    "OPEN",
    "SPLITS",
    "WALL",
    "MazeParams",
    "MazeState",
    "distance_map",
    "far_distance",
    "layout_hash",
    "serpentine_walls",
]
