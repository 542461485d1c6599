"""Host-side (NumPy) views of a household: a state from names, a readable rendering, and the
planner behind `Household.oracle_actions`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs.household import generator
from rl4agents.envs.household.world import (
    CLEAN,
    COMMANDS,
    COOL,
    GOAL_KINDS,
    HEAT,
    MAX_INSTANCES,
    OBJECT_TYPES,
    PICK_TWO,
    HouseholdState,
    goal_text,
    object_names,
)

if TYPE_CHECKING:
    from rl4agents.envs.household.env import Household


def make_state(
    env: Household,
    objects: dict[str, str],
    goal: str,
    agent: str | None = None,
    opened: Sequence[str] = (),
    seen: Sequence[str] = (),
    clean: Sequence[str] = (),
    hot: Sequence[str] = (),
    cold: Sequence[str] = (),
    steps: int = 0,
) -> HouseholdState:
    """A state from names, for tests and demos (host side).

    Args:
      objects: object name -> receptacle name or "inventory" (at most M objects; the
        remaining slots are empty).
      goal: a goal sentence, e.g. "put a clean mug in cabinet".
      agent: the receptacle the agent is at, or None for the middle of the room.
      opened: openable receptacles that are open (the others are closed).
      seen: receptacles whose contents the agent has seen.
      clean, hot, cold: objects with that property.
      steps: turns already taken.
    """
    m, num_rec = env.config.num_objects, len(env.receptacles)
    names = object_names()
    if len(objects) > m:
        raise ValueError(f"at most {m} objects, got {len(objects)}")
    rec_index = {r: i for i, r in enumerate(env.receptacles)}
    for where in [*objects.values(), *opened, *seen, *([agent] if agent else [])]:
        if where not in rec_index and where != "inventory":
            raise ValueError(f"unknown receptacle {where!r}; allowed: {env.receptacles}")
    for name in [*objects, *clean, *hot, *cold]:
        if name not in names:
            raise ValueError(f"unknown object {name!r}; allowed: {names}")
    goals = {
        goal_text((k, t, r)): (k, t, r)
        for k in range(len(GOAL_KINDS))
        for t in range(len(OBJECT_TYPES))
        for r in env._goal_rtype
    }
    if goal not in goals:
        raise ValueError(f"unknown goal {goal!r}; e.g. {sorted(goals)[:3]}")
    ordered = sorted(objects, key=names.index)
    types = np.full(m, -1, np.int32)
    inst = np.zeros(m, np.int32)
    locs = np.full(m, -1, np.int32)
    for i, name in enumerate(ordered):
        types[i], inst[i] = divmod(names.index(name), MAX_INSTANCES)
        inst[i] += 1
        where = objects[name]
        locs[i] = num_rec if where == "inventory" else rec_index[where]
    state = generator.initial_state(env, types, inst, locs, np.array(goals[goal], np.int32))
    rec_open = ~env._openable | np.isin(env.receptacles, list(opened))
    state = state.replace(
        obj_clean=jnp.asarray(np.isin(ordered + [""] * (m - len(ordered)), list(clean))),
        obj_temp=jnp.asarray(
            [1 if n in hot else 2 if n in cold else 0 for n in ordered] + [0] * (m - len(ordered)),
            jnp.int32,
        ),
        rec_open=jnp.asarray(rec_open),
        seen=jnp.asarray(np.isin(env.receptacles, list(seen))),
        agent=jnp.asarray(num_rec if agent is None else rec_index[agent], jnp.int32),
        steps=jnp.asarray(steps, jnp.int32),
    )
    done = bool(env.goal_holds(state)) or steps >= env.config.max_steps
    return state.replace(done=jnp.asarray(done))


def render(env: Household, state: HouseholdState) -> str:
    """Goal, agent, inventory and every receptacle with its contents (host side)."""
    s = jax.tree.map(np.asarray, jax.device_get(state))
    num_rec, names = len(env.receptacles), object_names()

    def obj(i):
        flags = [w for w, on in (("clean", s.obj_clean[i]),) if on]
        flags += {1: ["hot"], 2: ["cold"]}.get(int(s.obj_temp[i]), [])
        name = names[int(s.obj_type[i]) * MAX_INSTANCES + int(s.obj_inst[i]) - 1]
        return name + (f" ({', '.join(flags)})" if flags else "")

    agent = int(s.agent)
    where = "the middle of the room" if agent == num_rec else env.receptacles[agent]
    held = [obj(i) for i in range(len(s.obj_loc)) if s.obj_loc[i] == num_rec]
    lines = [
        f"goal: {goal_text(s.goal)}",
        f"agent: at {where}, step {int(s.steps)}/{env.config.max_steps}"
        + (", done" if bool(s.done) else ""),
        f"holding: {held[0] if held else 'nothing'}",
    ]
    for r, rec in enumerate(env.receptacles):
        flags = ["open" if s.rec_open[r] else "closed"] if env._openable[r] else []
        flags.append("seen" if s.seen[r] else "unseen")
        inside = [obj(i) for i in range(len(s.obj_loc)) if s.obj_loc[i] == r]
        lines.append(f"{rec} [{', '.join(flags)}]: {', '.join(inside) or '-'}")
    return "\n".join(lines) + "\n"


def oracle_actions(env: Household, state: HouseholdState, max_len: int = 200) -> list[int] | None:
    """The planner's action ids from `state` until the goal holds, or None.

    The planner only uses what the agent has observed: the goal, where it is, what it
    holds, which receptacles it opened, and the contents of receptacles it has seen. It
    takes a found goal object (else it visits the first receptacle it has not seen,
    opening it if closed), cleans/heats/cools it at the sink/microwave/fridge, and puts it
    in the first receptacle of the goal's type (opening it if closed); twice for
    pick_two. A useless held object is put down first. The returned plan is the planner
    run forward on a host copy of the state (it sees what the agent would see then).

    Returns:
      Action ids; [] when the goal already holds; None when the episode is over unsolved
      or the goal cannot be reached (e.g. too few objects of the goal's type).
    """
    world = _HostWorld(env, state)
    if world.success:
        return []
    if world.done:
        return None
    plan = []
    while len(plan) < max_len:
        action = world.next_action()
        if action is None:
            return None
        plan.append(action)
        world.apply(action)
        if world.success:
            return plan
    return None


class _HostWorld:
    """NumPy copy of one household state with the planner and the dynamics (host side)."""

    def __init__(self, env: Household, state: HouseholdState):
        s = jax.tree.map(lambda x: np.array(x), jax.device_get(state))
        self.env = env
        self.num_rec = len(env.receptacles)
        self.type, self.inst, self.loc = s.obj_type, s.obj_inst, s.obj_loc
        self.clean, self.temp = s.obj_clean, s.obj_temp
        self.open, self.seen = s.rec_open, s.seen
        self.agent, self.goal = int(s.agent), [int(g) for g in s.goal]
        self.done = bool(s.done)
        self.success = self._good().sum() >= self._need()

    def _need(self) -> int:
        return 2 if self.goal[0] == PICK_TWO else 1

    def _prop(self) -> np.ndarray:
        kind = self.goal[0]
        if kind == CLEAN:
            return self.clean.copy()
        if kind in (HEAT, COOL):
            return self.temp == (1 if kind == HEAT else 2)
        return np.ones_like(self.clean)

    def _good(self) -> np.ndarray:
        in_rec = (self.loc >= 0) & (self.loc < self.num_rec)
        rtype = self.env._rec_type[np.clip(self.loc, 0, self.num_rec - 1)]
        return (self.type == self.goal[1]) & self._prop() & in_rec & (rtype == self.goal[2])

    def _act(self, cmd: str, slot: int = -1, rec: int = -1) -> int:
        if cmd in ("go", "open", "close"):
            return self.env.action_id(
                f"{'go to' if cmd == 'go' else cmd} {self.env.receptacles[rec]}"
            )
        name = object_names()[self.type[slot] * MAX_INSTANCES + self.inst[slot] - 1]
        if cmd in ("take", "put"):
            word = "from" if cmd == "take" else "in"
            return self.env.action_id(f"{cmd} {name} {word} {self.env.receptacles[rec]}")
        tool = {"clean": "sink", "heat": "microwave", "cool": "fridge"}[cmd]
        return self.env.action_id(f"{cmd} {name} with {tool}")

    def _reach(self, rec: int) -> int | None:
        """The next action towards standing at an open `rec`, or None when there."""
        if self.agent != rec:
            return self._act("go", rec=rec)
        if not self.open[rec]:
            return self._act("open", rec=rec)
        return None

    def next_action(self) -> int | None:
        """The planner's next action id (observed information only), or None if stuck."""
        env, num_rec = self.env, self.num_rec
        held = np.flatnonzero(self.loc == num_rec)
        if held.size:
            o = int(held[0])
            if self.type[o] == self.goal[1]:
                if not self._prop()[o]:
                    kind = self.goal[0]
                    tool = {CLEAN: env._sink, HEAT: env._microwave, COOL: env._fridge}[kind]
                    if self.agent != tool:
                        return self._act("go", rec=tool)
                    return self._act(GOAL_KINDS[kind], slot=o)
                targets = np.flatnonzero(env._rec_type == self.goal[2])
                target = self.agent if self.agent in targets else int(targets[0])
            else:  # not useful: put it down where the agent is (or on the first surface)
                target = self.agent if self.agent < num_rec else int(np.argmin(env._openable))
            step = self._reach(target)
            return self._act("put", slot=o, rec=target) if step is None else step
        in_rec = (self.loc >= 0) & (self.loc < num_rec)
        known = in_rec & self.seen[np.clip(self.loc, 0, num_rec - 1)]
        wanted = np.flatnonzero((self.type == self.goal[1]) & known & ~self._good())
        if wanted.size:
            o = int(wanted[0])
            rec = int(self.loc[o])
            step = self._reach(rec)
            return self._act("take", slot=o, rec=rec) if step is None else step
        unseen = np.flatnonzero(~self.seen)
        if not unseen.size:
            return None
        step = self._reach(int(unseen[0]))
        return self.env.action_id("look") if step is None else step  # look marks it seen

    def apply(self, action: int) -> None:
        """Applies action id `action` with the environment's rules (steps not counted)."""
        env, num_rec = self.env, self.num_rec
        cmd = COMMANDS[env._act_cmd[action]]
        name, rec = int(env._act_obj[action]), int(env._act_rec[action])
        names = self.type * MAX_INSTANCES + self.inst - 1
        slots = np.flatnonzero((names == name) & (self.type >= 0))
        o = int(slots[0]) if slots.size and name >= 0 else -1
        holding = (self.loc == num_rec).any()
        at = self.agent == rec
        if cmd == "go" and not at:
            self.agent = rec
        elif cmd == "open" and at and env._openable[rec] and not self.open[rec]:
            self.open[rec] = True
        elif cmd == "close" and at and env._openable[rec] and self.open[rec]:
            self.open[rec] = False
        elif cmd == "take" and at and self.open[rec] and o >= 0 and self.loc[o] == rec:
            if not holding:
                self.loc[o] = num_rec
        elif cmd == "put" and at and self.open[rec] and o >= 0 and self.loc[o] == num_rec:
            self.loc[o] = rec
        elif cmd in ("clean", "heat", "cool") and o >= 0 and self.loc[o] == num_rec:
            tool = {"clean": env._sink, "heat": env._microwave, "cool": env._fridge}[cmd]
            if self.agent == tool:
                if cmd == "clean":
                    self.clean[o] = True
                else:
                    self.temp[o] = 1 if cmd == "heat" else 2
        if self.agent < num_rec and self.open[self.agent]:
            self.seen[self.agent] = True
        self.success = self._good().sum() >= self._need()
