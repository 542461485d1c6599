"""Sokoban's world: constants, the episode state, cell codes, the hashes and the move rule."""

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
# Cell codes (also fragment ids: the cell fragments come first in the table).
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)
_CHARS = ("#", "_", ".", "$", "*", "@", "+")
_CELL_NAMES = ("wall", "floor", "target", "box", "box_on_target", "player", "player_on_target")


SokobanParams = base.SplitParams


@flax.struct.dataclass
class SokobanState:
    """One episode's room; the outer border is always wall."""

    walls: jax.Array  # bool[N, N]
    targets: jax.Array  # bool[N, N]
    boxes: jax.Array  # bool[N, N]
    player: jax.Array  # int32[2] (row, col)
    done: jax.Array  # bool[] every box on a target


def _interior(n: int) -> np.ndarray:
    inside = np.zeros((n, n), bool)
    inside[1:-1, 1:-1] = True
    return inside


def _static_cells(state: SokobanState) -> jax.Array:
    """int32[N, N] codes of walls, floor, targets and boxes (no player)."""
    box = jnp.where(state.targets, BOX_ON_TARGET, BOX)
    empty = jnp.where(state.targets, TARGET, FLOOR)
    return jnp.where(state.walls, WALL, jnp.where(state.boxes, box, empty)).astype(jnp.int32)


def cell_codes(state: SokobanState) -> jax.Array:
    """int32[N, N] cell codes (WALL ... PLAYER_ON_TARGET); a bijection of the state's layout."""
    cells = _static_cells(state)
    row, col = state.player[0], state.player[1]
    on_target = state.targets[row, col]
    return cells.at[row, col].set(jnp.where(on_target, PLAYER_ON_TARGET, PLAYER))


def box_distance(state: SokobanState) -> jax.Array:
    """int32[] sum over boxes of the Manhattan distance to the nearest target (0 iff solved)."""
    n = state.walls.shape[0]
    rows, cols = jnp.divmod(jnp.arange(n * n), n)
    dist = jnp.abs(rows[:, None] - rows[None, :]) + jnp.abs(cols[:, None] - cols[None, :])
    dist = jnp.where(state.targets.ravel()[None, :], dist, 2 * n)
    return jnp.where(state.boxes.ravel(), dist.min(axis=1), 0).sum().astype(jnp.int32)


def room_hash(state: SokobanState) -> jax.Array:
    """uint32[] hash of walls, targets, boxes and player: the anchor (`text.hash_u32`, 32-bit
    FNV-1a, so distinct rooms can share one; within one room's states none was found)."""
    return text.hash_u32(cell_codes(state))


def puzzle_hash(state: SokobanState) -> jax.Array:
    """uint32[] hash of walls, targets and boxes, without the player: the split class, so one
    puzzle generated with two player starts is in one split."""
    return text.hash_u32(_static_cells(state))


def move(state: SokobanState, delta: jax.Array, valid: jax.Array) -> SokobanState:
    """The state after the player tries to move by delta int32[2] (no-op unless valid)."""
    n = state.walls.shape[0]
    player = state.player
    nxt = player + delta
    behind = jnp.clip(nxt + delta, 0, n - 1)  # only read when nxt holds a box (not a wall)
    box_ahead = state.boxes[nxt[0], nxt[1]]
    behind_free = ~state.walls[behind[0], behind[1]] & ~state.boxes[behind[0], behind[1]]
    moves = valid & ~state.walls[nxt[0], nxt[1]] & (~box_ahead | behind_free)
    push = moves & box_ahead
    pushed = state.boxes.at[nxt[0], nxt[1]].set(False).at[behind[0], behind[1]].set(True)
    boxes = jnp.where(push, pushed, state.boxes)
    return state.replace(
        boxes=boxes,
        player=jnp.where(moves, nxt, player),
        done=~(boxes & ~state.targets).any(),
    )
