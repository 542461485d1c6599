"""The two-agent map's vocabulary and state: roles, directions, actions and cells, the episode
state, shortest-path distances and the map hash that decides a map's split class."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
AGENTS = ("guide", "walker")
GUIDE, WALKER = range(2)
DIRECTIONS = ("up", "down", "left", "right", "stay")
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1], [0, 0]], np.int32)  # (row, col)
# Action ids 0..4 are the guide's messages, 5..9 the walker's moves, in DIRECTIONS order.
ACTIONS = tuple(f"say {d}" for d in DIRECTIONS) + DIRECTIONS
NO_MESSAGE = len(DIRECTIONS)  # message id after an invalid guide turn ("guide says nothing")
STAY = DIRECTIONS.index("stay")
CELLS = {"floor": "_", "wall": "#", "goal": "G", "walker": "W"}
FLOOR, WALL, GOAL, WALKER_CELL = range(4)  # cell codes = fragment ids (cells come first)


# Per-run parameters: `split` 0 train class, 1 test class, 2 either class (ood).
TwoAgentParams = base.SplitParams


@flax.struct.dataclass
class TwoAgentState:
    """One episode; the agent to act is `agent_of_turn(steps)`."""

    walls: jax.Array  # bool[N, N]
    goal: jax.Array  # int32[2] (row, col)
    pos: jax.Array  # int32[2] walker (row, col)
    dist: jax.Array  # int32[N, N] shortest-path distance to the goal (N * N = unreachable)
    message: jax.Array  # int32[] guide's message for the walker to act on, NO_MESSAGE if none
    steps: jax.Array  # int32[] turns taken (both agents)
    done: jax.Array  # bool[] goal reached or step limit hit


def _shift(x: jax.Array, drow: int, dcol: int, fill) -> jax.Array:
    """x moved by (drow, dcol), `fill` shifted in: out[r, c] = x[r - drow, c - dcol]."""
    n = x.shape[0]
    padded = jnp.pad(x, 1, constant_values=fill)
    return jax.lax.dynamic_slice(padded, (1 - drow, 1 - dcol), (n, n))


def distance_map(walls: jax.Array, goal: jax.Array) -> jax.Array:
    """Shortest-path distances to the goal through non-walls (4-connected).

    Args:
      walls: bool[N, N] wall layout.
      goal: int32[2] goal cell (not a wall).

    Returns:
      int32[N, N] distance of every cell to the goal; N * N for walls and unreachable cells.
    """
    n = walls.shape[0]
    far = n * n
    init = jnp.full((n, n), far, jnp.int32).at[goal[0], goal[1]].set(0)

    def _relax(_, dist):
        near = [_shift(dist, dr, dc, far) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))]
        best = jnp.minimum(dist, jnp.min(jnp.stack(near), axis=0) + 1)
        return jnp.where(walls, far, jnp.minimum(best, far))

    return jax.lax.fori_loop(0, n * n, _relax, init)


def map_hash(walls: jax.Array, start: jax.Array, goal: jax.Array) -> jax.Array:
    """uint32[] hash of a map (walls bool[N, N], start and goal int32[2]): its split class."""
    return text.hash_u32(jnp.concatenate([walls.astype(jnp.int32).ravel(), start, goal]))


def agent_of_turn(turn):
    """The agent acting at turn index `turn` (int or int array): 0 guide, 1 walker."""
    return turn % 2


def initial_state(walls, goal, pos, dist) -> TwoAgentState:
    """The state at the start of an episode on this map: no message yet, the guide to act."""
    return TwoAgentState(
        walls=walls,
        goal=jnp.asarray(goal, jnp.int32),
        pos=jnp.asarray(pos, jnp.int32),
        dist=dist,
        message=jnp.asarray(NO_MESSAGE, jnp.int32),
        steps=jnp.zeros((), jnp.int32),
        done=jnp.zeros((), bool),
    )
