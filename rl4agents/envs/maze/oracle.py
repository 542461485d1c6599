"""Host-side plans for the maze: the shortest path (it reads the hidden goal) and the imitable
nearest-frontier exploration (it reads only what the agent has seen)."""

from __future__ import annotations

import collections

import jax
import numpy as np

from rl4agents.envs.maze.world import DELTAS, MazeState


def shortest_plan(state: MazeState) -> list[int] | None:
    """Shortest action-id sequence to the goal (BFS over the whole maze), or None.

    Uses hidden information: the full maze and the goal position. Returns [] at the goal and
    None when the goal is unreachable.
    """
    state = jax.device_get(state)
    walls = np.asarray(state.walls)
    pos, goal = tuple(np.asarray(state.pos).tolist()), tuple(np.asarray(state.goal).tolist())
    return _bfs_plan(~walls, pos, lambda cell: cell == goal)


def seen_cells(visited: np.ndarray, view_radius: int) -> np.ndarray:
    """bool[H, H] cells inside the window of some visited cell (bool[H, H]): what the agent
    has seen."""
    visited = np.asarray(jax.device_get(visited))
    r, side = view_radius, visited.shape[0]
    padded = np.zeros((side + 2 * r, side + 2 * r), bool)
    for dr in range(-r, r + 1):
        for dc in range(-r, r + 1):
            padded[r + dr : r + dr + side, r + dc : r + dc + side] |= visited
    return padded[r : r + side, r : r + side]


def explore_plan(state: MazeState, view_radius: int) -> list[int] | None:
    """An imitable plan: nearest-frontier exploration over the cells seen so far.

    Uses only what the agent has observed (the windows around the cells it visited, in
    `state.visited`, and whether the goal was among them). If the goal has been seen, the plan
    is the shortest path to it through seen open cells; otherwise it is the shortest path
    through seen open cells to the nearest frontier, a seen open cell whose window still holds
    unseen cells (ties: the first found by a BFS expanding up, down, left, right). Called every
    turn, this explores the maze depth-first-like until the goal comes into view. Returns []
    at the goal and None when nothing is left to explore.
    """
    state = jax.device_get(state)
    walls, goal = np.asarray(state.walls), tuple(np.asarray(state.goal).tolist())
    pos = tuple(np.asarray(state.pos).tolist())
    seen = seen_cells(state.visited, view_radius)
    known_open = seen & ~walls
    if seen[goal]:
        return _bfs_plan(known_open, pos, lambda cell: cell == goal)
    r = view_radius
    unseen = np.pad(~seen, r, constant_values=False)

    def _frontier(cell):
        window = unseen[cell[0] : cell[0] + 2 * r + 1, cell[1] : cell[1] + 2 * r + 1]
        return bool(window.any())

    return _bfs_plan(known_open, pos, _frontier)


def _bfs_plan(free: np.ndarray, start: tuple, is_target) -> list[int] | None:
    """Shortest action ids from start to the first cell with is_target(cell) through free cells."""
    side = free.shape[0]
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        if is_target(cell):
            plan = []
            while parent[cell] is not None:
                cell, action = parent[cell]
                plan.append(action)
            return plan[::-1]
        for action, (dr, dc) in enumerate(DELTAS.tolist()):
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < side and 0 <= nxt[1] < side and free[nxt] and nxt not in parent:
                parent[nxt] = (cell, action)
                queue.append(nxt)
    return None
