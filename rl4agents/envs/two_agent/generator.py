"""Two-agent map generation in JAX: random wall layouts with a start and a goal from random
bits, the first qualifying one of the split's class (`base.first_qualifying`), and an open
fallback map."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.envs import base
from rl4agents.envs.two_agent.world import (
    TwoAgentState,
    distance_map,
    initial_state,
    map_hash,
)

if TYPE_CHECKING:
    from rl4agents.envs.two_agent.env import TwoAgent

_MAX_ROUNDS = 16


def generate(env: TwoAgent, key: jax.Array, split: jax.Array) -> TwoAgentState:
    """First qualifying candidate map of the split's class over while_loop rounds.

    If no round finds one (probability below 1e-50 for the defaults) an open map with the
    walker and the goal in opposite corners is used.
    """
    n, num = env.config.size, env.config.num_candidates

    def _candidate(bits):
        walls = (bits[: n * n] < jnp.uint32(env.config.wall_prob * 2**32)).reshape(n, n)
        cells = (bits[n * n :] % (n * n)).astype(jnp.int32)
        start, goal = jnp.stack(jnp.divmod(cells[0], n)), jnp.stack(jnp.divmod(cells[1], n))
        walls = walls.at[start[0], start[1]].set(False).at[goal[0], goal[1]].set(False)
        dist = distance_map(walls, goal)
        d = dist[start[0], start[1]]
        ok = (d >= env.config.min_distance) & (2 * d <= env.config.max_steps)
        ok = ok & env.in_split(map_hash(walls, start, goal), split)
        return initial_state(walls, goal, start, dist), ok

    walls, goal = jnp.zeros((n, n), bool), jnp.array([n - 1, n - 1], jnp.int32)
    fallback = initial_state(walls, goal, jnp.zeros((2,), jnp.int32), distance_map(walls, goal))
    return base.first_qualifying(
        key,
        jax.vmap(_candidate),
        fallback,
        num_candidates=num,
        bits_per_candidate=n * n + 2,
        max_rounds=_MAX_ROUNDS,
    )
