"""Household task generation in JAX: candidate tasks from random bits, the first usable one of
the split's class (`base.first_qualifying`), and a fixed fallback task."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.household.world import (
    MAX_INSTANCES,
    OBJECT_TYPES,
    PICK,
    PICK_TWO,
    RECEPTACLE_TYPES,
    HouseholdState,
    task_hash,
)

if TYPE_CHECKING:
    from rl4agents.envs.household.env import Household

_MAX_ROUNDS = 16


def candidate(env: Household, bits: jax.Array, split: jax.Array) -> HouseholdState:
    """One task from uint32[2 + 3 M] random bits (may be unusable, see `generate`)."""
    m, num_types = env.config.num_objects, len(OBJECT_TYPES)
    combo = jnp.where(
        split == 2,
        jnp.asarray(env._ood_combos)[bits[0] % len(env._ood_combos)],
        jnp.asarray(env._combos)[bits[0] % len(env._combos)],
    )
    kind, gtype = combo[0], combo[1]
    grtype = jnp.asarray(env._goal_rtype)[bits[1] % len(env._goal_rtype)]
    types = (bits[2 : 2 + m] % num_types).astype(jnp.int32).at[0].set(gtype)
    types = types.at[1].set(jnp.where(kind == PICK_TWO, gtype, types[1]))
    # Instance numbers: the rank of a random key among the objects of the same type.
    keys = bits[2 + m : 2 + 2 * m]
    order = jnp.arange(m)
    earlier = (keys[None, :] < keys[:, None]) | (
        (keys[None, :] == keys[:, None]) & (order[None, :] < order[:, None])
    )
    inst = 1 + ((types[:, None] == types[None, :]) & earlier).sum(axis=1).astype(jnp.int32)
    locs = (bits[2 + 2 * m : 2 + 3 * m] % len(env.receptacles)).astype(jnp.int32)
    perm = jnp.argsort(types * MAX_INSTANCES + inst)  # canonical slot order: by name
    return initial_state(env, types[perm], inst[perm], locs[perm], jnp.stack([kind, gtype, grtype]))


def initial_state(env: Household, types, inst, locs, goal) -> HouseholdState:
    num_rec, m = len(env.receptacles), types.shape[0]
    return HouseholdState(
        obj_type=jnp.asarray(types, jnp.int32),
        obj_inst=jnp.asarray(inst, jnp.int32),
        obj_loc=jnp.asarray(locs, jnp.int32),
        obj_clean=jnp.zeros((m,), bool),
        obj_temp=jnp.zeros((m,), jnp.int32),
        rec_open=jnp.asarray(~env._openable),
        seen=jnp.zeros((num_rec,), bool),
        agent=jnp.asarray(num_rec, jnp.int32),
        goal=jnp.asarray(goal, jnp.int32),
        steps=jnp.zeros((), jnp.int32),
        done=jnp.zeros((), bool),
    )


def generate(env: Household, key: jax.Array, split: jax.Array) -> HouseholdState:
    """First usable candidate task of the split's class over while_loop rounds.

    Usable: at most MAX_INSTANCES objects per type, the goal not already holding, and the
    hash class of the split ("ood": either class, held-out goals). If no round finds one
    (probability far below 1e-30 for the defaults) a fixed task is used.
    """

    def _qualifies(task):
        fits = task.obj_inst.max() <= MAX_INSTANCES
        fresh = ~env.goal_holds(task)
        in_class = env.in_split(task_hash(task), split)
        return fits & fresh & in_class

    def _candidates(bits):
        tasks = jax.vmap(functools.partial(candidate, env), in_axes=(0, None))(bits, split)
        return tasks, jax.vmap(_qualifies)(tasks)

    return base.first_qualifying(
        key,
        _candidates,
        fallback_task(env),
        num_candidates=env.config.num_candidates,
        bits_per_candidate=2 + 3 * env.config.num_objects,
        max_rounds=_MAX_ROUNDS,
    )


def fallback_task(env: Household) -> HouseholdState:
    """Objects of cycling types on the countertop; goal "put an apple in cabinet"."""
    m, num_types = env.config.num_objects, len(OBJECT_TYPES)
    types, inst = np.arange(m) % num_types, np.arange(m) // num_types + 1
    perm = np.argsort(types * MAX_INSTANCES + inst)
    goal = np.array([PICK, 0, RECEPTACLE_TYPES.index("cabinet")], np.int32)
    return initial_state(env, types[perm], inst[perm], np.zeros(m, np.int32), goal)
