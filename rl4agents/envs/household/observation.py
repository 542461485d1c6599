"""Household observations as fragment ids: the prompt, what the agent sees at a receptacle, and
the turn's message."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.envs.household.world import (
    MAX_INSTANCES,
    HouseholdState,
)

if TYPE_CHECKING:
    from rl4agents.envs.household.env import Household


def describe(env: Household, state: HouseholdState, rec: jax.Array) -> jax.Array:
    """int32[3 M + 3] fragment ids: what the agent sees at receptacle `rec` (-1 = none).

    "it is closed ." or "in it you see a mug 1 , and an apple 2 ." (or "... nothing .").
    """
    m = state.obj_type.shape[0]
    f = env._f
    here = state.obj_loc == rec
    count = here.sum()
    rank = jnp.cumsum(here) - 1
    sep = jnp.where(rank == 0, -1, jnp.where(rank == count - 1, f["comma_and"], f["comma"]))
    typ = jnp.maximum(state.obj_type, 0)
    names = typ * MAX_INSTANCES + jnp.maximum(state.obj_inst, 1) - 1
    items = jnp.stack(
        [sep, jnp.asarray(env._art_frag)[typ], jnp.asarray(env._name_frag)[names]], axis=1
    )
    items = jnp.where(here[:, None], items, -1).ravel()
    head = jnp.where(jnp.asarray(env._openable)[rec], f["in_it"], f["on_it"])
    seen = jnp.concatenate(
        [
            head[None],
            items,
            jnp.where(count == 0, f["nothing"], -1)[None],
            jnp.array([f["period"]]),
        ]
    )
    closed = jnp.full((3 * m + 3,), -1).at[0].set(f["closed"])
    return jnp.where(state.rec_open[rec], seen, closed).astype(jnp.int32)


def obs_ids(env: Household, state, kind, slot, rec, success, timeout) -> jax.Array:
    """int32[W] fragment ids of the observation of kind `kind` (rows padded with -1)."""
    f = env._f
    width = env._obs_width
    typ = jnp.maximum(state.obj_type[slot], 0)
    name = jnp.asarray(env._name_frag)[
        typ * MAX_INSTANCES + jnp.maximum(state.obj_inst[slot], 1) - 1
    ]
    art = jnp.asarray(env._art_frag)[typ]
    recf = jnp.asarray(env._rec_frag)[rec]
    desc = describe(env, state, rec)
    rows = [
        [f["invalid"]],
        [f["nothing_happens"]],
        [f["arrive"], recf, f["period"], desc],
        [f["open"], recf, f["period"], desc],
        [f["close"], recf, f["period"]],
        [f["take"], name, f["from"], recf, f["period"]],
        [f["put"], name, f["in_the"], recf, f["period"]],
        [f["clean"], name, f["using"], recf, f["period"]],
        [f["heat"], name, f["using"], recf, f["period"]],
        [f["cool"], name, f["using"], recf, f["period"]],
        [f["at"], recf, f["period"], desc],
        [f["middle"]],
        [f["carrying"], art, name, f["period"]],
        [f["empty_hands"]],
    ]
    table = []
    for row in rows:
        parts = jnp.concatenate([jnp.atleast_1d(jnp.asarray(p, jnp.int32)) for p in row])
        table.append(jnp.pad(parts, (0, width - 2 - parts.shape[0]), constant_values=-1))
    suffix = jnp.where(success, f["success"], jnp.where(timeout, f["timeout"], -1))
    return jnp.concatenate([jnp.stack(table)[kind], jnp.stack([suffix, f["end"]])]).astype(
        jnp.int32
    )


def prompt_ids(env: Household, state: HouseholdState) -> jax.Array:
    """int32[8] fragment ids of the prompt: the room, then "your task is to : <goal> ."."""
    kind, obj = state.goal[0], state.goal[1]
    f = env._f
    return jnp.stack(
        [
            f["intro"],
            f["task"],
            jnp.asarray(env._goal_head)[kind, obj],
            jnp.asarray(env._goal_word)[kind, obj],
            f["in"],
            jnp.asarray(env._rtype_frag)[state.goal[2]],
            f["period"],
            f["end"],
        ]
    ).astype(jnp.int32)
