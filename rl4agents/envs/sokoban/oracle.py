"""Host-side Sokoban solver: breadth-first search over (player, boxes)."""

from __future__ import annotations

import collections

import jax
import numpy as np

from rl4agents.envs.sokoban.world import DELTAS, SokobanState


def solve(state: SokobanState, max_nodes: int = 200_000) -> list[int] | None:
    """Shortest action-id sequence solving the room (BFS over player and boxes), or None.

    Args:
      state: a single (unbatched) state; host or device arrays.
      max_nodes: give up (return None) after visiting this many states.

    Returns:
      Action ids (0 up, 1 down, 2 left, 3 right); [] when already solved; None when the
      room is unsolvable or the search exceeded `max_nodes`.
    """
    state = jax.device_get(state)
    walls = np.asarray(state.walls)
    n = walls.shape[0]
    free = ~walls.ravel()
    targets = frozenset(np.flatnonzero(np.asarray(state.targets)).tolist())
    start = (
        int(state.player[0]) * n + int(state.player[1]),
        frozenset(np.flatnonzero(np.asarray(state.boxes)).tolist()),
    )
    steps = [int(dr) * n + int(dc) for dr, dc in DELTAS]
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        player, boxes = node
        if boxes <= targets:
            plan = []
            while parent[node] is not None:
                node, action = parent[node]
                plan.append(action)
            return plan[::-1]
        for action, step in enumerate(steps):
            nxt = player + step  # the border is walls, so nxt stays inside the grid
            if not free[nxt]:
                continue
            new_boxes = boxes
            if nxt in boxes:
                behind = nxt + step
                if not free[behind] or behind in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {behind}
            child = (nxt, new_boxes)
            if child not in parent:
                parent[child] = (node, action)
                if len(parent) > max_nodes:
                    return None
                queue.append(child)
    return None
