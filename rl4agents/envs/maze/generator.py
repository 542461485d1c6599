"""Maze generation in JAX: perfect mazes carved by randomized depth-first search or Prim, then
the goal and the start placed on the carved layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl4agents.envs.maze.world import (
    DELTAS,
    MazeState,
    _edges,
    _room_walls,
    distance_map,
    layout_hash,
    serpentine_walls,
)

_MAX_ROUNDS = 16


def carve_bits(size: int, algorithm: str) -> int:
    """Random uint32 words `carve` consumes per maze of `size` rooms per side."""
    n = size
    if algorithm == "dfs":
        return 1 + 4 * 2 * n * n  # root, then 4 direction scores per push-or-pop iteration
    return 1 + (n * n - 1) * 2 * n * (n - 1)  # root, then a score per edge per added room


def carve(bits: jax.Array, size: int, algorithm: str) -> jax.Array:
    """One perfect maze of `size` rooms per side by `algorithm` ("dfs" or "prim"), as walls.

    Args:
      bits: uint32[carve_bits(size, algorithm)] random words.
      size: rooms per side.
      algorithm: "dfs" or "prim".

    Returns:
      bool[H, H] walls: every room open, exactly size**2 - 1 passages carved.
    """
    return _carve_dfs(bits, size) if algorithm == "dfs" else _carve_prim(bits, size)


def _carve_dfs(bits: jax.Array, size: int) -> jax.Array:
    """Randomized depth-first search (recursive backtracker) on a fixed-size stack.

    Each of 2 * n^2 iterations (n^2 - 1 pushes and at most n^2 - 1 pops before the last
    push) carves from the top room to a random unvisited neighbour, or pops when it has none.
    """
    n, side = size, 2 * size + 1
    iterations = 2 * n * n
    deltas = jnp.asarray(DELTAS)
    root = (bits[0] % (n * n)).astype(jnp.int32)
    # Scores >= 1 for any direction; 0 marks a blocked one.
    scores = (bits[1:].reshape(iterations, 4) >> 1) + jnp.uint32(1)
    cells = jnp.arange(side * side)
    rooms = jnp.arange(n * n)
    slots = jnp.arange(n * n + 1)

    # Updates are one-hot selects, not scatters.
    def _iteration(i, carry):
        walls, seen, stack, depth = carry
        top = stack[jnp.maximum(depth - 1, 0)]
        row, col = top // n, top % n
        nrow, ncol = row + deltas[:, 0], col + deltas[:, 1]
        inside = (nrow >= 0) & (nrow < n) & (ncol >= 0) & (ncol < n)
        neighbour = jnp.clip(nrow, 0, n - 1) * n + jnp.clip(ncol, 0, n - 1)
        can = inside & ~seen[neighbour] & (depth > 0)
        pick = jnp.argmax(jnp.where(can, scores[i], jnp.uint32(0)))
        push = can.any()
        nxt = neighbour[pick]
        passage = (2 * row + 1 + deltas[pick, 0]) * side + 2 * col + 1 + deltas[pick, 1]
        walls = walls & ~(push & (cells == passage))
        seen = seen | (push & (rooms == nxt))
        stack = jnp.where(push & (slots == depth), nxt, stack)
        depth = jnp.where(push, depth + 1, jnp.maximum(depth - 1, 0))
        return walls, seen, stack, depth

    init = (
        jnp.asarray(_room_walls(n).ravel()),
        rooms == root,
        jnp.where(slots == 0, root, 0),
        jnp.ones((), jnp.int32),
    )
    walls, _, _, _ = jax.lax.fori_loop(0, iterations, _iteration, init)
    return walls.reshape(side, side)


def _carve_prim(bits: jax.Array, size: int) -> jax.Array:
    """Randomized Prim: n^2 - 1 times, carve a random edge from the tree to a new room."""
    n, side = size, 2 * size + 1
    room_a, room_b, passage = _edges(n)
    num_edges = len(passage)
    root = (bits[0] % (n * n)).astype(jnp.int32)
    scores = (bits[1:].reshape(n * n - 1, num_edges) >> 1) + jnp.uint32(1)
    cells = jnp.arange(side * side)
    rooms = jnp.arange(n * n)
    room_a, room_b, passage = jnp.asarray(room_a), jnp.asarray(room_b), jnp.asarray(passage)

    def _iteration(i, carry):
        walls, tree = carry
        frontier = tree[room_a] ^ tree[room_b]  # never empty before the tree spans
        pick = jnp.argmax(jnp.where(frontier, scores[i], jnp.uint32(0)))
        walls = walls & (cells != passage[pick])
        tree = tree | (rooms == room_a[pick]) | (rooms == room_b[pick])
        return walls, tree

    init = (jnp.asarray(_room_walls(n).ravel()), rooms == root)
    walls, _ = jax.lax.fori_loop(0, n * n - 1, _iteration, init)
    return walls.reshape(side, side)


def generate(key: jax.Array, split: jax.Array, config, in_split) -> MazeState:
    """A maze of the split's class (while_loop rounds of candidates), goal and start.

    `config` is the env's `MazeConfig`; `in_split(task_hash, split)` is its split predicate.
    The rounds are written out rather than `base.first_qualifying`: the round's random words
    past the candidates also place the goal and the start.

    One threefry call per round serves every candidate and the placement of the goal and
    the start (each random sampler in the graph costs compilation time).
    """
    n, num = config.size, config.num_candidates
    maze_bits = carve_bits(n, config.algorithm)
    place_bits = 1 + n * n

    def _qualifies(walls):
        return in_split(layout_hash(walls), split)

    def _round(carry):
        round_index, _, best, _ = carry
        shape = (num * maze_bits + place_bits,)
        bits = jax.random.bits(jax.random.fold_in(key, round_index), shape, jnp.uint32)
        candidates = bits[: num * maze_bits].reshape(num, maze_bits)
        walls = jax.vmap(lambda b: carve(b, n, config.algorithm))(candidates)
        ok = jax.vmap(_qualifies)(walls)
        found = ok.any()
        best = jnp.where(found, walls[jnp.argmax(ok)], best)
        return round_index + 1, found, best, bits[num * maze_bits :]

    init = (
        jnp.zeros((), jnp.int32),
        jnp.zeros((), bool),
        jnp.asarray(serpentine_walls(n)),
        jnp.zeros((place_bits,), jnp.uint32),
    )
    _, _, walls, bits = jax.lax.while_loop(lambda c: ~c[1] & (c[0] < _MAX_ROUNDS), _round, init)

    goal_room = (bits[0] % (n * n)).astype(jnp.int32)
    goal = jnp.stack([2 * (goal_room // n) + 1, 2 * (goal_room % n) + 1])
    dist = distance_map(walls, goal)
    room_dist = dist[1::2, 1::2].ravel()
    eligible = room_dist >= jnp.minimum(config.min_distance, room_dist.max())
    # Scores >= 1 for eligible rooms (never the goal: min_distance >= 2), 0 otherwise.
    scores = jnp.where(eligible, (bits[1:] >> 1) + jnp.uint32(1), jnp.uint32(0))
    start_room = jnp.argmax(scores).astype(jnp.int32)
    pos = jnp.stack([2 * (start_room // n) + 1, 2 * (start_room % n) + 1])
    return MazeState(
        walls=walls,
        goal=goal,
        pos=pos,
        visited=jnp.zeros_like(walls).at[pos[0], pos[1]].set(True),
        dist=dist,
        done=jnp.zeros((), bool),
    )
