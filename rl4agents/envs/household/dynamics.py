"""Household dynamics: what an action does to the state, the goal test and the progress
potential. Pure functions of one episode; `env` supplies the static receptacle and action
tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.envs.household.world import (
    CLEAN,
    CLEAN_CMD,
    CLOSE,
    COOL,
    COOL_CMD,
    GO,
    HEAT,
    HEAT_CMD,
    INVENTORY,
    LOOK,
    MAX_INSTANCES,
    OBS_ARRIVE,
    OBS_CARRYING,
    OBS_CLEANED,
    OBS_CLOSED,
    OBS_COOLED,
    OBS_EMPTY_HANDS,
    OBS_HEATED,
    OBS_INVALID,
    OBS_LOOK_AT,
    OBS_LOOK_MIDDLE,
    OBS_NOTHING,
    OBS_OPENED,
    OBS_PUT,
    OBS_TAKEN,
    OPEN,
    PICK_TWO,
    PUT,
    TAKE,
    HouseholdState,
)

if TYPE_CHECKING:
    from rl4agents.envs.household.env import Household


def apply(env: Household, state: HouseholdState, cmd: jax.Array, index: jax.Array):
    """The state after command `cmd` (-1 = invalid) of action `index`.

    Returns:
      (new state (steps/done unchanged), ok bool[] preconditions held, slot int32[] the
      named object's slot (0 if none), rec int32[] the receptacle the message names).
    """
    num_rec = len(env.receptacles)
    name = jnp.asarray(env._act_obj)[index]
    r_arg = jnp.asarray(env._act_rec)[index]
    names = state.obj_type * MAX_INSTANCES + state.obj_inst - 1
    hit = (names == name) & (state.obj_type >= 0) & (name >= 0)
    exists, slot = hit.any(), jnp.argmax(hit).astype(jnp.int32)
    held = state.obj_loc == num_rec
    holds_named = exists & held[slot]
    agent = state.agent
    rec = jnp.where(r_arg >= 0, r_arg, jnp.minimum(agent, num_rec - 1))
    at_r = agent == r_arg
    openable = jnp.asarray(env._openable)[rec]
    is_open = state.rec_open[rec]
    ok = jnp.select(
        [
            cmd == GO,
            cmd == OPEN,
            cmd == CLOSE,
            cmd == TAKE,
            cmd == PUT,
            cmd == CLEAN_CMD,
            cmd == HEAT_CMD,
            cmd == COOL_CMD,
            (cmd == LOOK) | (cmd == INVENTORY),
        ],
        [
            agent != r_arg,
            at_r & openable & ~is_open,
            at_r & openable & is_open,
            at_r & is_open & exists & (state.obj_loc[slot] == r_arg) & ~held.any(),
            at_r & is_open & holds_named,
            (agent == env._sink) & holds_named,
            (agent == env._microwave) & holds_named,
            (agent == env._fridge) & holds_named,
            True,
        ],
        False,
    )
    do = lambda c: ok & (cmd == c)  # noqa: E731
    new_agent = jnp.where(do(GO), r_arg, agent).astype(jnp.int32)
    rec_open = state.rec_open.at[rec].set(
        jnp.where(do(OPEN), True, jnp.where(do(CLOSE), False, is_open))
    )
    loc = jnp.where(do(TAKE), num_rec, jnp.where(do(PUT), r_arg, state.obj_loc[slot]))
    temp = jnp.where(do(HEAT_CMD), 1, jnp.where(do(COOL_CMD), 2, state.obj_temp[slot]))
    here = jnp.arange(num_rec) == new_agent
    new_state = state.replace(
        obj_loc=state.obj_loc.at[slot].set(loc.astype(jnp.int32)),
        obj_clean=state.obj_clean.at[slot].set(state.obj_clean[slot] | do(CLEAN_CMD)),
        obj_temp=state.obj_temp.at[slot].set(temp.astype(jnp.int32)),
        rec_open=rec_open,
        seen=state.seen | (here & rec_open),
        agent=new_agent,
    )
    # Transforms and look name the agent's receptacle; inventory names the held object.
    held_slot = jnp.argmax(held).astype(jnp.int32)
    slot = jnp.where(cmd == INVENTORY, held_slot, slot)
    rec = jnp.where(r_arg >= 0, r_arg, jnp.minimum(new_agent, num_rec - 1))
    return new_state, ok, slot, rec


def outcome(env: Household, state, new_state, cmd, ok) -> jax.Array:
    """int32[] observation kind of the turn (one of the `OBS_INVALID ... OBS_EMPTY_HANDS` rows)."""
    num_rec = len(env.receptacles)
    by_cmd = jnp.asarray(
        [
            OBS_ARRIVE,
            OBS_OPENED,
            OBS_CLOSED,
            OBS_TAKEN,
            OBS_PUT,
            OBS_CLEANED,
            OBS_HEATED,
            OBS_COOLED,
            OBS_LOOK_AT,
            OBS_CARRYING,
        ]
    )[jnp.maximum(cmd, 0)]
    by_cmd = jnp.where((cmd == LOOK) & (state.agent == num_rec), OBS_LOOK_MIDDLE, by_cmd)
    holding = (state.obj_loc == num_rec).any()
    by_cmd = jnp.where((cmd == INVENTORY) & ~holding, OBS_EMPTY_HANDS, by_cmd)
    return jnp.where(cmd < 0, OBS_INVALID, jnp.where(ok, by_cmd, OBS_NOTHING)).astype(jnp.int32)


def goal_objects(env: Household, state: HouseholdState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(good bool[M], prop bool[M], in_receptacle bool[M]) of the goal's objects.

    good: of the goal's type, with its property, in a receptacle of the goal's type.
    """
    num_rec = len(env.receptacles)
    kind, gtype, grtype = state.goal[0], state.goal[1], state.goal[2]
    prop = jnp.select(
        [kind == CLEAN, kind == HEAT, kind == COOL],
        [state.obj_clean, state.obj_temp == 1, state.obj_temp == 2],
        jnp.ones_like(state.obj_clean),
    )
    in_rec = (state.obj_loc >= 0) & (state.obj_loc < num_rec)
    rtype = jnp.asarray(env._rec_type)[jnp.clip(state.obj_loc, 0, num_rec - 1)]
    good = (state.obj_type == gtype) & prop & in_rec & (rtype == grtype)
    return good, prop, in_rec


def goal_holds(env: Household, state: HouseholdState) -> jax.Array:
    """bool[] the goal holds: one (two for pick_two) good objects in goal receptacles."""
    good, _, _ = goal_objects(env, state)
    return good.sum() >= jnp.where(state.goal[0] == PICK_TWO, 2, 1)


def potential(env: Household, state: HouseholdState) -> jax.Array:
    """f32[] progress phi: sum over the best 1 (2 for pick_two) goal-type objects of a stage.

    Stage: 4 placed with the property in a goal receptacle, 3 held with the property (any
    held one for pick goals), 2 held without it, 1 found (in a seen receptacle), else 0.
    """
    num_rec = len(env.receptacles)
    good, prop, in_rec = goal_objects(env, state)
    held = state.obj_loc == num_rec
    known = held | (in_rec & state.seen[jnp.clip(state.obj_loc, 0, num_rec - 1)])
    stage = jnp.where(good, 4, jnp.where(held, 2 + prop, jnp.where(known, 1, 0)))
    stage = jnp.where(state.obj_type == state.goal[1], stage, 0)
    top = -jnp.sort(-stage)
    return (top[0] + jnp.where(state.goal[0] == PICK_TWO, top[1], 0)).astype(jnp.float32)
