"""The maze's world: constants, the episode state, and the layout functions the generator, the
dynamics and the oracle share."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
ACTIONS = ("up", "down", "left", "right")
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # (row, col) per action id
ALGORITHMS = ("dfs", "prim")
# Cell codes (also fragment ids: the cell fragments come first in the table).
WALL, OPEN, GOAL, AGENT = range(4)
_CELLS = {"wall": "#", "open": "_", "goal": "G", "agent": "P"}
_CHARS = tuple(_CELLS.values())
_VISITED_CHAR = "."  # render only: an open cell the agent has stood on


MazeParams = base.SplitParams


@flax.struct.dataclass
class MazeState:
    """One episode; H = 2 * size + 1 grid cells per side, rooms at odd (row, col)."""

    walls: jax.Array  # bool[H, H] wall cells (border, even-even cells, uncarved passages)
    goal: jax.Array  # int32[2] goal (row, col), a room
    pos: jax.Array  # int32[2] agent (row, col)
    visited: jax.Array  # bool[H, H] cells the agent has stood on (its history, not shown)
    dist: jax.Array  # int32[H, H] BFS moves to the goal (a function of walls and goal)
    done: jax.Array  # bool[] reached the goal


def far_distance(side: int) -> int:
    """The distance `distance_map` gives walls and unreachable cells on a side x side grid."""
    return side * side


def distance_map(walls: jax.Array, goal: jax.Array) -> jax.Array:
    """BFS distance (in moves) from every cell to the goal through open cells.

    Args:
      walls: bool[H, H] wall cells.
      goal: int32[2] goal (row, col), an open cell.

    Returns:
      int32[H, H] moves to the goal; `far_distance(H)` on walls and unreachable cells.
    """
    side = walls.shape[0]
    far = far_distance(side)
    dist = jnp.full((side, side), far, jnp.int32).at[goal[0], goal[1]].set(0)

    def _relax(carry):
        d, _ = carry
        padded = jnp.pad(d, 1, constant_values=far)
        nearest = jnp.minimum(
            jnp.minimum(padded[:-2, 1:-1], padded[2:, 1:-1]),
            jnp.minimum(padded[1:-1, :-2], padded[1:-1, 2:]),
        )
        relaxed = jnp.where(walls, far, jnp.minimum(d, nearest + 1))
        return relaxed, jnp.any(relaxed != d)

    # One BFS layer per iteration, until nothing changes (at most one per open cell).
    dist, _ = jax.lax.while_loop(lambda c: c[1], _relax, (dist, jnp.ones((), bool)))
    return dist


def layout_hash(walls: jax.Array) -> jax.Array:
    """uint32[] hash of a maze layout bool[H, H] (decides its train/test class)."""
    return text.hash_u32(walls.astype(jnp.int32))


def serpentine_walls(size: int) -> np.ndarray:
    """bool[H, H] a fixed perfect maze: every row of rooms open, rows joined at alternate ends."""
    side = 2 * size + 1
    walls = np.ones((side, side), bool)
    walls[1:-1:2, 1:-1] = False  # each row of rooms and the passages between them
    for r in range(size - 1):
        col = 2 * size - 1 if r % 2 == 0 else 1
        walls[2 * r + 2, col] = False
    return walls


def _room_walls(size: int) -> np.ndarray:
    """bool[H, H] every cell a wall except the rooms (odd row, odd col)."""
    walls = np.ones((2 * size + 1, 2 * size + 1), bool)
    walls[1::2, 1::2] = False
    return walls


def _edges(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room pairs (int32[E] a, int32[E] b) of the room grid and the flat passage cell between."""
    side = 2 * size + 1
    a, b, passage = [], [], []
    for row in range(size):
        for col in range(size):
            for drow, dcol in ((0, 1), (1, 0)):
                if row + drow < size and col + dcol < size:
                    a.append(row * size + col)
                    b.append((row + drow) * size + col + dcol)
                    passage.append((2 * row + 1 + drow) * side + 2 * col + 1 + dcol)
    return np.array(a, np.int32), np.array(b, np.int32), np.array(passage, np.int32)
