"""Sokoban room generation in JAX, after gym-sokoban: carve a topology by a random walk of
3x3 masks, place targets and the player, then pull the boxes off the targets by reverse play."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.sokoban.world import (
    DELTAS,
    SokobanState,
    _interior,
    box_distance,
    puzzle_hash,
)

_MAX_ROUNDS = 16
_P_CHANGE_DIRECTION = 0.35
_P_PREFER_PULL = 0.5
# gym-sokoban's carving patterns: each topology step opens one of these 3x3 masks.
_CARVE_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    bool,
)


def bits_per_candidate(size: int, carve_steps: int, reverse_steps: int) -> int:
    """Random uint32 words `candidate` consumes."""
    return 2 + 3 * carve_steps + size * size + reverse_steps


def candidate(
    bits: jax.Array, size: int, num_boxes: int, carve_steps: int, reverse_steps: int
) -> SokobanState:
    """One room by topology carving, placement and reverse play (may be unusable).

    Args:
      bits: uint32[bits_per_candidate(...)] random bits (one threefry call serves every
        candidate: each random sampler costs compilation time).

    Returns:
      The candidate room.
    """
    n = size
    deltas = jnp.asarray(DELTAS)
    c, r = carve_steps, reverse_steps
    start = 1 + (bits[:2] % (n - 2)).astype(jnp.int32)
    change = bits[2 : 2 + c] < jnp.uint32(_P_CHANGE_DIRECTION * 2**32)
    turns = (bits[2 + c : 2 + 2 * c] % 4).astype(jnp.int32)
    masks = (bits[2 + 2 * c : 2 + 3 * c] % len(_CARVE_MASKS)).astype(jnp.int32)
    place_scores = (bits[2 + 3 * c : 2 + 3 * c + n * n] >> 8).reshape(n, n).astype(jnp.int32)
    move_bits = bits[2 + 3 * c + n * n : 2 + 3 * c + n * n + r]

    def _carve_step(i, carry):
        floor, pos, direction = carry
        direction = jnp.where(change[i], turns[i], direction)
        pos = jnp.clip(pos + deltas[direction], 1, n - 2)
        corner = (pos[0] - 1, pos[1] - 1)
        window = jax.lax.dynamic_slice(floor, corner, (3, 3)) | jnp.asarray(_CARVE_MASKS)[masks[i]]
        return jax.lax.dynamic_update_slice(floor, window, corner), pos, direction

    floor = jnp.zeros((n, n), bool).at[start[0], start[1]].set(True)
    floor, _, _ = jax.lax.fori_loop(
        0, carve_steps, _carve_step, (floor, start, jnp.zeros((), jnp.int32))
    )
    floor = floor & jnp.asarray(_interior(n))

    scores = jnp.where(floor, place_scores, -1).ravel()
    picked = jnp.argsort(-scores)[: num_boxes + 1]  # distinct floor cells (if enough floor)
    targets = jnp.zeros((n * n,), bool).at[picked[:num_boxes]].set(True).reshape(n, n)
    player = jnp.stack([picked[num_boxes] // n, picked[num_boxes] % n]).astype(jnp.int32)

    def _reverse_step(i, carry):
        boxes, player = carry
        word = move_bits[i]
        nxt, behind = player + deltas, player - deltas  # [4, 2] per direction
        can_move = floor[nxt[:, 0], nxt[:, 1]] & ~boxes[nxt[:, 0], nxt[:, 1]]
        can_pull = can_move & boxes[behind[:, 0], behind[:, 1]]
        # With probability _P_PREFER_PULL pull some adjacent box (first from a random
        # offset); else walk in a random direction (pulling if a box happens to be behind).
        order = ((word >> 2) + jnp.arange(4, dtype=jnp.uint32)) % 4
        pull_dir = order[jnp.argmax(can_pull[order])]
        prefer = (word >> 8) % 256 < jnp.uint32(256 * _P_PREFER_PULL)
        direction = jnp.where(prefer & can_pull.any(), pull_dir, word % 4).astype(jnp.int32)
        pulled = boxes.at[behind[direction, 0], behind[direction, 1]].set(False)
        pulled = pulled.at[player[0], player[1]].set(True)
        boxes = jnp.where(can_pull[direction], pulled, boxes)
        return boxes, jnp.where(can_move[direction], nxt[direction], player)

    boxes, player = jax.lax.fori_loop(0, reverse_steps, _reverse_step, (targets, player))
    return SokobanState(
        walls=~floor,
        targets=targets,
        boxes=boxes,
        player=player,
        done=jnp.zeros((), bool),
    )


def generate(
    key: jax.Array,
    split: jax.Array,
    *,
    size: int,
    num_boxes: int,
    carve_steps: int,
    reverse_steps: int,
    min_box_distance: int,
    num_candidates: int,
    in_split,
) -> SokobanState:
    """First usable candidate of the split's class over while_loop rounds (`in_split(task_hash,
    split)` is the env's split predicate); `fallback_room` if none qualifies."""

    def _qualifies(room):
        enough_floor = (~room.walls).sum() >= num_boxes + 2
        far_enough = box_distance(room) >= min_box_distance
        in_class = in_split(puzzle_hash(room), split)
        return enough_floor & far_enough & in_class

    def _candidates(bits):
        rooms = jax.vmap(lambda b: candidate(b, size, num_boxes, carve_steps, reverse_steps))(bits)
        return rooms, jax.vmap(_qualifies)(rooms)

    return base.first_qualifying(
        key,
        _candidates,
        fallback_room(size, num_boxes),
        num_candidates=num_candidates,
        bits_per_candidate=bits_per_candidate(size, carve_steps, reverse_steps),
        max_rounds=_MAX_ROUNDS,
    )


def fallback_room(size: int, num_boxes: int) -> SokobanState:
    """Open room: targets on row 1, boxes below them on row 2, player at (3, 1)."""
    n, k = size, num_boxes
    walls = np.ones((n, n), bool)
    walls[1:-1, 1:-1] = False
    targets = np.zeros((n, n), bool)
    targets[1, 1 : 1 + k] = True
    boxes = np.zeros((n, n), bool)
    boxes[2, 1 : 1 + k] = True
    return SokobanState(
        walls=jnp.asarray(walls),
        targets=jnp.asarray(targets),
        boxes=jnp.asarray(boxes),
        player=jnp.asarray([3, 1], jnp.int32),
        done=jnp.zeros((), bool),
    )
