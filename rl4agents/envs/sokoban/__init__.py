"""Sokoban as a multi-turn text environment, with rooms generated in JAX.

The room is `size x size` cells including the outer wall border (gym-sokoban's `dim_room`).
Each turn the agent answers "up", "down", "left" or "right"; walking into a box pushes it when the
cell behind it is free (floor or target), otherwise nothing moves. The observation is the room,
one row of single-character cells per line:

  "#" wall, "_" floor, "." target, "$" box, "*" box on target, "@" player, "+" player on target.

Rewards follow gym-sokoban: -`step_penalty` per turn, +`box_reward` for each box pushed onto a
target, -`box_reward` for each box pushed off one, +`finish_reward` when every box is on a target
(done, success). An unparsable action costs `step_penalty + invalid_penalty` and moves nothing.

Generation (pure JAX, from the reset key), after gym-sokoban's reverse-play generator:
  1. topology: a random walk carves floor inside the border (`carve_steps` steps, default
     1.7 * 2 * size as in gym-sokoban, each opening one of gym-sokoban's 3x3 masks; the
     direction changes with probability 0.35 per step);
  2. `num_boxes` targets and the player on distinct floor cells; every box starts on a target;
  3. reverse play: a random walk of `reverse_steps` player moves (default twice the carve steps)
     in which a move away from an adjacent box pulls it along; half of the moves pull some
     adjacent box when one can be pulled. Every reverse move undoes as a forward move or push,
     so the room is solvable (the tests check it with the BFS oracle).
`num_candidates` rooms are generated in parallel per round; the first one whose boxes are at least
`min_box_distance` from the targets (summed Manhattan distance to the nearest target; 1 = "some
box moved off its target"; the default 2 per box removes most one-push rooms) and whose hash class
matches the split is kept. Rounds repeat up to `generator._MAX_ROUNDS`; the astronomically rare
fallback is a fixed open room.

Splits: a room's class is test when `puzzle_hash(room) % 1000 < test_fraction * 1000`, a hash
of its walls, targets and boxes but not the player, so the same puzzle from another start (the
player walks to the other start, then plays the same moves) never lands in both splits; "train"
only generates train-class rooms, "test" only test-class ones. "ood" is a larger room with more
boxes: `size=ood_size` (default 7) and `num_boxes=ood_num_boxes` (default 2), either class.

Modules: `world` (constants, state, cell codes, hashes, the move rule), `generator` (carving,
placement and reverse play), `oracle` (the host-side BFS solver) and `env` (the registered
`Sokoban`: settings, tables, `reset_env` / `step_env`).
"""

from rl4agents.envs.sokoban.env import Sokoban, SokobanConfig
from rl4agents.envs.sokoban.generator import candidate, fallback_room, generate
from rl4agents.envs.sokoban.oracle import solve
from rl4agents.envs.sokoban.world import (
    ACTIONS,
    BOX,
    BOX_ON_TARGET,
    DELTAS,
    FLOOR,
    PLAYER,
    PLAYER_ON_TARGET,
    SPLITS,
    TARGET,
    WALL,
    SokobanParams,
    SokobanState,
    box_distance,
    cell_codes,
    move,
    puzzle_hash,
    room_hash,
)

__all__ = [
    "Sokoban",
    "SokobanConfig",
    "candidate",
    "fallback_room",
    "generate",
    "solve",
    "ACTIONS",
    "BOX",
    "BOX_ON_TARGET",
    "DELTAS",
    "FLOOR",
    "PLAYER",
    "PLAYER_ON_TARGET",
    "SPLITS",
    "TARGET",
    "WALL",
    "SokobanParams",
    "SokobanState",
    "box_distance",
    "cell_codes",
    "move",
    "puzzle_hash",
    "room_hash",
]
