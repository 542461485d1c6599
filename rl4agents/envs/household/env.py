"""The registered `Household` environment: its static tables, `reset` and `step`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.household import dynamics, generator, host, observation
from rl4agents.envs.household.world import (
    ARTICLES,
    COMMANDS,
    GOAL_HEADS,
    GOAL_KINDS,
    GOAL_RECEPTACLE_TYPES,
    MAX_INSTANCES,
    OBJECT_TYPES,
    OPENABLE_TYPES,
    PHRASES,
    PLURALS,
    RECEPTACLE_TYPES,
    HouseholdParams,
    HouseholdState,
    goal_combos,
    goal_text,
    object_names,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class HouseholdConfig:
    """Static settings (the constructor's arguments; see `Household`), checked when built."""

    num_objects: int = 6
    num_cabinets: int = 2
    num_drawers: int = 2
    max_steps: int = 40
    goal_reward: float = 1.0
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    test_fraction: float = 0.2
    ood_num_objects: int = 9
    num_candidates: int = 32

    def __post_init__(self):
        max_objects = len(OBJECT_TYPES) * MAX_INSTANCES
        for name in ("num_objects", "ood_num_objects"):
            base.check_range(name, getattr(self, name), 2, max_objects)
        for name in ("num_cabinets", "num_drawers"):
            base.check_range(name, getattr(self, name), 1, 3)
        base.check_range("max_steps", self.max_steps, 1)
        base.check_shared_settings(self)


@registry.register("household")
class Household(base.TextEnv):
    """ALFWorld-like household text environment (see the `household` package docstring).

    Attributes:
      config: `HouseholdConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      receptacles: the receptacle names ("countertop 1", ...), R of them; index = id.
      max_prompt_len: P, length of the room-and-goal prompt returned by `reset`.
      max_obs_len: O, length of the observation returned by `step`.
      max_action_len: longest action in tokens.
      num_actions: size of the action table (`action_strings`).

    Args (a value out of its range raises ValueError at construction):
      num_objects: object slots per task, in [2, len(OBJECT_TYPES) * MAX_INSTANCES].
      num_cabinets: cabinets in the room, in [1, 3].
      num_drawers: drawers in the room, in [1, 3].
      max_steps: turns per episode (ALFWorld's step limit), >= 1.
      goal_reward: reward on the turn the goal first holds, >= 0.
      progress_reward: potential-based process reward c, >= 0 (0 = off).
      invalid_penalty: subtracted on a turn whose action is not in the table, >= 0.
      test_fraction: share of tasks in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_num_objects: `num_objects` of the "ood" tasks, in [2, len(OBJECT_TYPES) *
        MAX_INSTANCES].
      num_candidates: candidate tasks per generation round, >= 1.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        num_objects: int = 6,
        num_cabinets: int = 2,
        num_drawers: int = 2,
        max_steps: int = 40,
        goal_reward: float = 1.0,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        test_fraction: float = 0.2,
        ood_num_objects: int = 9,
        num_candidates: int = 32,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(HouseholdConfig, locals()), tokenizer)

        counts = {"cabinet": num_cabinets, "drawer": num_drawers}
        rec_types = [t for t in RECEPTACLE_TYPES for _ in range(counts.get(t, 1))]
        numbers = [rec_types[: i + 1].count(t) for i, t in enumerate(rec_types)]
        self.receptacles = tuple(f"{t} {n}" for t, n in zip(rec_types, numbers))
        self._rec_type = np.array([RECEPTACLE_TYPES.index(t) for t in rec_types], np.int32)
        self._openable = np.array([t in OPENABLE_TYPES for t in rec_types])
        self._sink = rec_types.index("sink")
        self._microwave = rec_types.index("microwave")
        self._fridge = rec_types.index("fridge")
        self._goal_rtype = np.array(
            [RECEPTACLE_TYPES.index(t) for t in GOAL_RECEPTACLE_TYPES], np.int32
        )
        self._combos, self._ood_combos = goal_combos()

        # Action table: command x argument over the fixed name pools.
        names = object_names()
        actions = [("go", -1, r, f"go to {rec}") for r, rec in enumerate(self.receptacles)]
        actions += [("open", -1, r, f"open {rec}") for r, rec in enumerate(self.receptacles)]
        actions += [("close", -1, r, f"close {rec}") for r, rec in enumerate(self.receptacles)]
        for cmd, word in (("take", "from"), ("put", "in")):
            for n, name in enumerate(names):
                for r, rec in enumerate(self.receptacles):
                    actions.append((cmd, n, r, f"{cmd} {name} {word} {rec}"))
        for cmd, tool in (("clean", "sink"), ("heat", "microwave"), ("cool", "fridge")):
            actions += [(cmd, n, -1, f"{cmd} {name} with {tool}") for n, name in enumerate(names)]
        actions += [("look", -1, -1, "look"), ("inventory", -1, -1, "inventory")]
        self.action_strings = tuple(a[3] for a in actions)
        self._action_index = {a: i for i, a in enumerate(self.action_strings)}
        self._act_cmd = np.array([COMMANDS.index(a[0]) for a in actions], np.int32)
        self._act_obj = np.array([a[1] for a in actions], np.int32)
        self._act_rec = np.array([a[2] for a in actions], np.int32)
        self.action_table = text.FragmentTable.build(
            self.tokenizer, {s: s for s in self.action_strings}
        )
        self.num_actions = len(actions)
        self.max_action_len = int(self.action_table.lengths.max())

        listing = " , ".join(f"a {r}" for r in self.receptacles[:-1])
        intro = (
            "you are in the middle of a room . looking quickly around you , you see "
            f"{listing} , and a {self.receptacles[-1]} .\n"
        )
        # Names, articles and goal pieces always follow a word: each starts with a space.
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **{f"name:{n}": f" {n}" for n in names},
                **{f"rec:{r}": f" {r}" for r in self.receptacles},
                **{f"art:{t}": f" {a}" for t, a in zip(OBJECT_TYPES, ARTICLES)},
                **{f"type:{t}": f" {t}" for t in OBJECT_TYPES},
                **{f"plural:{t}": f" {p}" for t, p in zip(OBJECT_TYPES, PLURALS)},
                **{f"rtype:{t}": f" {t}" for t in RECEPTACLE_TYPES},
                **{f"head:{k}": f" {h}" for k, h in GOAL_HEADS.items()},
                **PHRASES,
                "intro": intro,
            },
        )
        f = self._frags.id
        self._f = {k: f(k) for k in (*PHRASES, "intro")}
        self._name_frag = np.array([f(f"name:{n}") for n in names], np.int32)
        self._rec_frag = np.array([f(f"rec:{r}") for r in self.receptacles], np.int32)
        self._art_frag = np.array([f(f"art:{t}") for t in OBJECT_TYPES], np.int32)
        self._rtype_frag = np.array([f(f"rtype:{t}") for t in RECEPTACLE_TYPES], np.int32)
        # Goal sentence pieces per (kind, object type): " put a clean" + " mug".
        heads = np.zeros((len(GOAL_KINDS), len(OBJECT_TYPES)), np.int32)
        words = np.zeros_like(heads)
        for k, kind in enumerate(GOAL_KINDS):
            for t, obj in enumerate(OBJECT_TYPES):
                head = f"pick_{ARTICLES[t]}" if kind == "pick" else kind
                heads[k, t] = f(f"head:{head}")
                words[k, t] = f(f"plural:{obj}" if kind == "pick_two" else f"type:{obj}")
        self._goal_head, self._goal_word = heads, words

        lens = self._frags.lengths
        ln = lambda *keys: int(sum(lens[f(k)] for k in keys))  # noqa: E731
        name_len = int(lens[self._name_frag].max())
        rec_len = int(lens[self._rec_frag].max())
        m = num_objects
        # Every object listed at one receptacle: "a mug 1 , an apple 2 , and a knife 1 .".
        listing_len = m * (int(lens[self._art_frag].max()) + name_len) + (m - 1) * ln("comma")
        listing_len += ln("comma_and") - ln("comma")
        describe_len = max(
            ln("closed"),
            max(ln("in_it"), ln("on_it")) + listing_len + ln("period"),
            max(ln("in_it"), ln("on_it")) + ln("nothing", "period"),
        )
        rows = (
            ln("invalid"),
            ln("nothing_happens"),
            max(ln("arrive"), ln("open"), ln("at")) + rec_len + ln("period") + describe_len,
            ln("close", "period") + rec_len,
            ln("take", "from", "period") + name_len + rec_len,
            ln("put", "in_the", "period") + name_len + rec_len,
            max(ln("clean"), ln("heat"), ln("cool")) + ln("using", "period") + name_len + rec_len,
            ln("middle"),
            ln("carrying", "period") + int(lens[self._art_frag].max()) + name_len,
            ln("empty_hands"),
        )
        suffix = max(ln("success"), ln("timeout"))
        self._obs_width = 3 * m + 8  # fragment slots of the longest observation row
        self.max_obs_len = max(rows) + suffix + ln("end")
        self.max_prompt_len = (
            ln("intro", "task", "in", "period", "end")
            + int(lens[heads].max())
            + int(lens[words].max())
            + int(lens[self._rtype_frag[self._goal_rtype]].max())
        )

    # ------------------------------------------------------------------------------ dynamics

    def ood_config(self) -> HouseholdConfig:
        """The "ood" tasks: held-out goal combinations among `ood_num_objects` objects."""
        return dataclasses.replace(self.config, num_objects=self.config.ood_num_objects)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: HouseholdParams
    ) -> tuple[HouseholdState, jax.Array, jax.Array]:
        """Draws a task of the params' class; the agent starts in the middle of the room.

        Returns:
          The state, the room-and-goal obs_tokens int32[P] and obs_len int32[].
        """
        state = generator.generate(self, key, params.split)
        ids = observation.prompt_ids(self, state)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: HouseholdState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: HouseholdParams,
    ) -> tuple[HouseholdState, TimeStep]:
        """One turn: parse the action, apply it if its preconditions hold, observe.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `HouseholdState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `HouseholdParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        index = jnp.maximum(action, 0)
        cmd = jnp.where(valid, jnp.asarray(self._act_cmd)[index], -1)
        new_state, ok, slot, rec = dynamics.apply(self, state, cmd, index)

        success = self.goal_holds(new_state)
        steps = state.steps + 1
        timeout = ~success & (steps >= c.max_steps)
        new_state = new_state.replace(steps=steps, done=success | timeout)
        kind = dynamics.outcome(self, state, new_state, cmd, ok)
        ids = observation.obs_ids(self, new_state, kind, slot, rec, success, timeout)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        reward = jnp.where(success, c.goal_reward, 0.0)
        reward = reward - jnp.where(valid, 0.0, c.invalid_penalty)
        if c.progress_reward:
            reward = reward + c.progress_reward * (
                self.potential(new_state) - self.potential(state)
            )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=new_state.done, valid=valid, success=success
        )

    def anchor(self, state: HouseholdState) -> jax.Array:
        """uint32[] hash of the observable world: objects, receptacles, agent, seen, goal.

        The step counter (and `done`, which only it can set without the goal holding) is left
        out: it is not shown to the policy, and the same situation reached at different turns
        should share an anchor (GiGPO-style grouping).
        """
        parts = [
            state.obj_type,
            state.obj_inst,
            state.obj_loc,
            state.obj_clean.astype(jnp.int32),
            state.obj_temp,
            state.rec_open.astype(jnp.int32),
            state.seen.astype(jnp.int32),
            state.agent[None],
            state.goal,
        ]
        return text.hash_u32(jnp.concatenate([jnp.asarray(p, jnp.int32) for p in parts]))

    def action_id(self, action: str) -> int:
        """Index of an action string in the action table (ValueError if not in it)."""
        if action not in self._action_index:
            raise ValueError(
                f"{action!r} is not in the action table; e.g. {self.action_strings[:3]}"
            )
        return self._action_index[action]

    # ------------------------------------------------------------------- goal and progress

    def goal_holds(self, state: HouseholdState) -> jax.Array:
        """bool[] the goal holds: one (two for pick_two) good objects in goal receptacles."""
        return dynamics.goal_holds(self, state)

    def potential(self, state: HouseholdState) -> jax.Array:
        """f32[] progress phi (see `dynamics.potential`)."""
        return dynamics.potential(self, state)

    # ---------------------------------------------------------------------------- host side

    def goal_text(self, goal: Sequence[int]) -> str:
        """The goal sentence of goal int32[3] (kind, object type, receptacle type)."""
        return goal_text(goal)

    def make_state(
        self,
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
        """A state from names, for tests and demos (host side; see `host.make_state`)."""
        return host.make_state(self, objects, goal, agent, opened, seen, clean, hot, cold, steps)

    def render(self, state: HouseholdState) -> str:
        """Goal, agent, inventory and every receptacle with its contents (host side)."""
        return host.render(self, state)

    def oracle_actions(self, state: HouseholdState, max_len: int = 200) -> list[int] | None:
        """The planner's action ids from `state` until the goal holds, or None (see
        `host.oracle_actions`)."""
        return host.oracle_actions(self, state, max_len)
