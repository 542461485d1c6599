"""Host-side (NumPy) views of the two-agent map: a state from text, a readable rendering, and
the oracle's plan for both roles."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs.two_agent.world import (
    AGENTS,
    CELLS,
    DELTAS,
    DIRECTIONS,
    NO_MESSAGE,
    STAY,
    WALKER,
    TwoAgentState,
    distance_map,
    initial_state,
)

if TYPE_CHECKING:
    from rl4agents.envs.two_agent.env import TwoAgent


def state_from_text(
    env: TwoAgent, grid: str, steps: int = 0, message: str = "nothing"
) -> TwoAgentState:
    """A state from rows of "_", "#", "G", "W" (one G, one W; the inverse of `render`).

    Args:
      grid: the map, one row per line.
      steps: turns already taken (even: the guide acts next).
      message: the pending guide message (a DIRECTIONS word or "nothing").
    """
    rows = grid.strip().split("\n")
    n = len(rows)
    if n != env.config.size or any(len(r) != n for r in rows):
        raise ValueError(f"expected a {env.config.size}x{env.config.size} grid, got {rows}")
    if any(set(r) - set(CELLS.values()) for r in rows):
        raise ValueError(f"allowed cells: {list(CELLS.values())}, got {rows}")
    if message not in (*DIRECTIONS, "nothing"):
        raise ValueError(f"unknown message {message!r}; allowed: {[*DIRECTIONS, 'nothing']}")
    chars = np.array([list(r) for r in rows])
    (goal,) = np.argwhere(chars == "G")
    (pos,) = np.argwhere(chars == "W")
    walls = jnp.asarray(chars == "#")
    goal = jnp.asarray(goal, jnp.int32)
    state = initial_state(walls, goal, pos, distance_map(walls, goal))
    msg = DIRECTIONS.index(message) if message in DIRECTIONS else NO_MESSAGE
    return state.replace(
        message=jnp.asarray(msg, jnp.int32),
        steps=jnp.asarray(steps, jnp.int32),
        done=jnp.asarray(steps >= env.config.max_steps),
    )


def render(env: TwoAgent, state: TwoAgentState) -> str:
    """The whole map ("W" over "G" once reached), then whose turn it is (host side)."""
    codes = np.asarray(jax.device_get(env.cell_codes(state)))
    chars = tuple(CELLS.values())
    grid = "".join("".join(chars[c] for c in row) + "\n" for row in codes)
    steps, message = int(np.asarray(state.steps)), int(np.asarray(state.message))
    words = (*DIRECTIONS, "nothing")
    status = "done" if bool(np.asarray(state.done)) else f"{AGENTS[steps % 2]} to act"
    return grid + f"turn {steps}/{env.config.max_steps}, {status}, message: {words[message]}\n"


def shortest_path(walls: np.ndarray, start: tuple, goal: tuple) -> list[int] | None:
    """Moves (DIRECTIONS ids) of a shortest path from start to goal (BFS), or None."""
    n = walls.shape[0]
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while parent[cell] is not None:
                cell, move = parent[cell]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in enumerate(DELTAS[:STAY].tolist()):
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not walls[nxt] and nxt not in parent:
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return None


def oracle_actions(env: TwoAgent, state: TwoAgentState) -> list[int] | None:
    """Action ids for both roles: the guide says the first move of a shortest path (it
    sees the map), the walker does what the message says ("stay" after "nothing"); each
    role uses only its own observation.

    Returns:
      The alternating plan from `state`; [] once the goal is reached; None when the
      episode is over unsolved or the goal is unreachable.
    """
    s = jax.tree.map(np.asarray, jax.device_get(state))
    walls, goal = s.walls, tuple(s.goal.tolist())
    pos = tuple(s.pos.tolist())
    if pos == goal:
        return []
    if bool(s.done):
        return None
    plan = []
    if int(s.steps) % 2 == WALKER:
        move = int(s.message) if int(s.message) < NO_MESSAGE else STAY
        plan.append(len(DIRECTIONS) + move)
        nxt = (pos[0] + DELTAS[move][0], pos[1] + DELTAS[move][1])
        n = walls.shape[0]
        if 0 <= nxt[0] < n and 0 <= nxt[1] < n and not walls[nxt]:
            pos = nxt
        if pos == goal:
            return plan
    moves = shortest_path(walls, pos, goal)
    if moves is None:
        return None
    for move in moves:
        plan += [move, len(DIRECTIONS) + move]
    return plan
