"""The Countdown environment: its settings, the turn dynamics and the observation text (the
package docstring describes the task)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.countdown import generator
from rl4agents.envs.countdown.solver import solve
from rl4agents.envs.countdown.world import (
    _LINE,
    _MAX_NUMBERS,
    EMPTY,
    OPS,
    CountdownParams,
    CountdownState,
    calc_distance,
    canonical,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    """Static settings (the constructor's arguments; see `Countdown`), checked when built."""

    num_numbers: int = 3
    max_start: int = 9
    max_value: int = 30
    min_target: int = 10
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    goal_reward: float = 1.0
    test_fraction: float = 0.2
    ood_num_numbers: int = 4
    ood_max_value: int = 60
    ood_min_target: int | None = None
    num_candidates: int = 64

    @property
    def resolved_ood_min_target(self) -> int:
        """`ood_min_target`, None meaning `max_value + 1`."""
        return self.max_value + 1 if self.ood_min_target is None else self.ood_min_target

    def __post_init__(self):
        for name in ("num_numbers", "ood_num_numbers"):
            base.check_range(name, getattr(self, name), 2, _MAX_NUMBERS)
        for name in ("max_value", "ood_max_value"):
            base.check_range(name, getattr(self, name), 1, 99, " (two-digit numbers)")
        max_start, max_value, ood_max_value = self.max_start, self.max_value, self.ood_max_value
        if not 1 <= max_start <= max_value:
            raise ValueError(f"max_start must be in [1, max_value={max_value}], got {max_start}")
        if max_start > ood_max_value:
            raise ValueError(
                f"max_start must be <= ood_max_value={ood_max_value} (the ood env's starting "
                f"numbers), got {max_start}"
            )
        if not 0 <= self.min_target <= max_value:
            raise ValueError(
                f"min_target must be in [0, max_value={max_value}], got {self.min_target}"
            )
        ood_min = self.resolved_ood_min_target
        if not 0 <= ood_min <= ood_max_value:
            raise ValueError(
                f"ood_min_target must be in [0, ood_max_value={ood_max_value}], got {ood_min} "
                "(None means max_value + 1)"
            )
        base.check_shared_settings(self)


@registry.register("countdown")
class Countdown(base.TextEnv):
    """Countdown with a calculator tool (see the package docstring).

    Attributes:
      config: `CountdownConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      num_calcs: 3 (M + 1)^2, the calc actions (action ids below it).
      max_prompt_len: P, length of the rules, target and numbers returned by `reset`.
      max_obs_len: O, length of the observation returned by `step`.
      max_action_len: longest action ("calc M * M") in tokens.
      num_actions: 3 (M + 1)^2 calc actions then M + 1 answer actions.

    Args (a value out of its range raises ValueError at construction):
      num_numbers: N, starting numbers per task, in [2, 5].
      max_start: largest starting number, in [1, max_value] (and <= ood_max_value).
      max_value: M, largest number the tool may produce (and the action table covers), in
        [1, 99].
      min_target: smallest target, in [0, max_value]; some target in range must be reachable.
      progress_reward: potential-based process reward c, >= 0 (0 = off).
      invalid_penalty: subtracted on an invalid turn, >= 0.
      goal_reward: reward for answering the target, >= 0.
      test_fraction: share of tasks in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_num_numbers: starting numbers of the "ood" tasks, in [2, 5].
      ood_max_value: `max_value` of the "ood" env, in [1, 99].
      ood_min_target: smallest "ood" target, in [0, ood_max_value] (None = max_value + 1).
      num_candidates: candidate tasks per generation round, >= 1.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        num_numbers: int = 3,
        max_start: int = 9,
        max_value: int = 30,
        min_target: int = 10,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        goal_reward: float = 1.0,
        test_fraction: float = 0.2,
        ood_num_numbers: int = 4,
        ood_max_value: int = 60,
        ood_min_target: int | None = None,
        num_candidates: int = 64,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(CountdownConfig, locals()), tokenizer)
        self._fallback = generator.find_fallback(self.config)

        m = max_value + 1
        self.num_calcs = len(OPS) * m * m
        self.num_actions = self.num_calcs + m
        actions = {}
        for op in OPS:
            for a in range(m):
                for b in range(m):
                    actions[f"calc {a} {op} {b}"] = f"calc {a} {op} {b}"
        for value in range(m):
            actions[f"answer {value}"] = f"answer {value}"
        self.action_table = text.FragmentTable.build(self.tokenizer, actions)
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                # Numbers first: fragment id v is the number v.
                **{f"num{v}": f" {v}" for v in range(m)},
                **{f"op{op}": f" {op}" for op in OPS},
                "intro": (
                    f"make the target with calc a op b ( op is + - * , results 0 to {max_value} )"
                    " then answer n\n"
                ),
                "target": "target",
                "eq": " =",
                "nl": "\n",
                "left": "left:",
                "comma": " ,",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "invalid": "invalid action , allowed: calc a op b or answer n\n",
                "unavailable": "invalid calc , use the numbers left\n",
                "range": f"invalid calc , result not in 0 to {max_value}\n",
                "won": "you won",
                "wrong": "you lost , not the target",
                "unmade": "you lost , make the target with calc first",
            },
        )
        length = lambda name: int(self._frags.lengths[self._frags.id(name)])  # noqa: E731
        num_len = int(self._frags.lengths[:m].max())
        op_len = max(length(f"op{op}") for op in OPS)
        held = length("left") + num_len * num_numbers + length("comma") * (num_numbers - 1)
        calc_line = 3 * num_len + op_len + length("eq") + length("nl")
        invalid_line = max(length(k) for k in ("invalid", "unavailable", "range"))
        answer_line = max(length(k) for k in ("won", "wrong", "unmade"))
        self.max_action_len = int(self.action_table.lengths.max())
        self.max_obs_len = max(calc_line + held, invalid_line + held, answer_line) + length("end")
        self.max_prompt_len = (
            length("intro") + length("target") + num_len + length("nl") + held + length("end")
        )

    def ood_config(self) -> CountdownConfig:
        """More numbers and larger targets: `ood_num_numbers`, `ood_max_value` and targets
        from `ood_min_target`."""
        c = self.config
        ood_min = c.resolved_ood_min_target
        return dataclasses.replace(
            c,
            num_numbers=c.ood_num_numbers,
            max_value=c.ood_max_value,
            min_target=ood_min,
            ood_min_target=ood_min,
        )

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: CountdownParams
    ) -> tuple[CountdownState, jax.Array, jax.Array]:
        """Draws a solvable task of the params' class.

        Returns:
          The state, obs_tokens int32[P] holding the rules, target and numbers, and obs_len
          int32[].
        """
        numbers, target = generator.generate(
            key, params.split, self.config, self.in_split, self._fallback
        )
        state = CountdownState(numbers=numbers, target=target, done=jnp.zeros((), bool))
        ids = jnp.concatenate(
            [
                jnp.asarray([self._frags.id(k) for k in ("intro", "target")], jnp.int32),
                target[None],
                jnp.asarray([self._frags.id("nl")], jnp.int32),
                self._held_ids(numbers),
                jnp.asarray([self._frags.id("end")], jnp.int32),
            ]
        )
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: CountdownState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: CountdownParams,
    ) -> tuple[CountdownState, TimeStep]:
        """One turn: parse the action, run the calc or judge the answer, observe.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `CountdownState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `CountdownParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        m = c.max_value + 1
        action = text.match_action(self.action_table, action_tokens, action_len)
        is_calc = (action >= 0) & (action < self.num_calcs)
        is_answer = action >= self.num_calcs
        calc = jnp.clip(action, 0, self.num_calcs - 1)
        op, a, b = calc // (m * m), (calc // m) % m, calc % m
        value = action - self.num_calcs

        numbers = state.numbers
        slots = jnp.arange(c.num_numbers)
        first = jnp.argmax(numbers == a)
        second_mask = (numbers == b) & (slots != first)
        second = jnp.argmax(second_mask)
        available = jnp.any(numbers == a) & jnp.any(second_mask)
        result = jnp.where(op == 0, a + b, jnp.where(op == 1, a - b, a * b))
        in_range = (result >= 0) & (result <= c.max_value)
        calc_ok = is_calc & available & in_range
        combined = canonical(
            jnp.where(slots == first, result, jnp.where(slots == second, EMPTY, numbers))
        )
        new_numbers = jnp.where(calc_ok, combined, numbers)

        held = jnp.any(numbers == state.target)
        made = jnp.sum(numbers >= 0) < c.num_numbers
        won = is_answer & (value == state.target) & held & made
        new_state = state.replace(numbers=new_numbers, done=is_answer)

        valid = calc_ok | is_answer
        reward = jnp.where(valid, 0.0, -c.invalid_penalty) + jnp.where(won, c.goal_reward, 0.0)
        if c.progress_reward:
            dist = lambda x: calc_distance(x, state.target, c.max_value)  # noqa: E731
            reward = reward + c.progress_reward * (dist(numbers) - dist(new_numbers))

        frag = self._frags.id
        none = -jnp.ones((_LINE - 1,), jnp.int32)
        calc_line = jnp.stack(
            [a, frag("op+") + op, b, jnp.asarray(frag("eq")), result, jnp.asarray(frag("nl"))]
        ).astype(jnp.int32)
        message = jnp.select(
            [
                action < 0,
                is_calc & ~available,
                is_calc & ~in_range,
                won,
                is_answer & (value != state.target),
            ],
            [frag("invalid"), frag("unavailable"), frag("range"), frag("won"), frag("wrong")],
            frag("unmade"),
        )
        line = jnp.where(calc_ok, calc_line, jnp.concatenate([message[None], none]))
        held_ids = jnp.where(is_answer, -1, self._held_ids(new_numbers))
        ids = jnp.concatenate([line, held_ids, jnp.asarray([frag("end")], jnp.int32)])
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=is_answer, valid=valid, success=won
        )

    def anchor(self, state: CountdownState) -> jax.Array:
        """uint32[] hash of (numbers held, target, done): the whole state."""
        return text.hash_u32(
            jnp.concatenate(
                [
                    jnp.asarray(state.numbers, jnp.int32),
                    jnp.reshape(jnp.asarray(state.target, jnp.int32), (1,)),
                    jnp.reshape(jnp.asarray(state.done, jnp.int32), (1,)),
                ]
            )
        )

    def _held_ids(self, numbers: jax.Array) -> jax.Array:
        """int32[1 + 2N] fragment ids of "left: a , b , c" (used slots contribute nothing)."""
        alive = numbers >= 0
        after_first = jnp.arange(self.config.num_numbers) > 0
        commas = jnp.where(alive & after_first, self._frags.id("comma"), -1)
        values = jnp.where(alive, numbers, -1)
        pairs = jnp.stack([commas, values], axis=1).ravel()
        return jnp.concatenate([jnp.asarray([self._frags.id("left")]), pairs]).astype(jnp.int32)

    def calc_action(self, a: int, op: str, b: int) -> int:
        """Action id of "calc a op b" (op one of "+", "-", "*"; a, b in 0..max_value)."""
        m = self.config.max_value + 1
        if op not in OPS or not (0 <= a < m and 0 <= b < m):
            raise ValueError(f"no action 'calc {a} {op} {b}'; allowed: ops {OPS}, 0..{m - 1}")
        return (OPS.index(op) * m + a) * m + b

    def answer_action(self, value: int) -> int:
        """Action id of "answer value" (value in 0..max_value)."""
        max_value = self.config.max_value
        if not 0 <= value <= max_value:
            raise ValueError(f"no action 'answer {value}'; allowed: 0..{max_value}")
        return self.num_calcs + value

    def action_text(self, action: int) -> str:
        """The string of action id `action`, e.g. "calc 3 * 5" (host side)."""
        return self.action_table.names[action]

    def render(self, state: CountdownState) -> str:
        """The target and the numbers held as text (host side)."""
        numbers = np.asarray(jax.device_get(state.numbers))
        held = " ".join(str(v) for v in numbers if v >= 0)
        done = "done\n" if bool(state.done) else ""
        return f"target: {int(state.target)}\nnumbers: {held}\n{done}"

    def state_from_numbers(
        self, numbers: list[int], target: int, done: bool = False
    ) -> CountdownState:
        """Builds a state holding `numbers` (at most N, each in 0..max_value) with `target`."""
        n, max_value = self.config.num_numbers, self.config.max_value
        if not 1 <= len(numbers) <= n:
            raise ValueError(f"expected 1..{n} numbers, got {numbers}")
        if not all(0 <= v <= max_value for v in [*numbers, target]):
            raise ValueError(f"numbers and target must be in 0..{max_value}")
        padded = sorted(numbers) + [EMPTY] * (n - len(numbers))
        return CountdownState(
            numbers=jnp.asarray(padded, jnp.int32),
            target=jnp.asarray(target, jnp.int32),
            done=jnp.asarray(done),
        )

    def oracle_actions(self, state: CountdownState) -> list[int] | None:
        """Fewest calcs that build the target, then "answer target"; None if impossible.

        Breadth-first search over the numbers held (observable), so closed-loop demonstrations
        are imitable. Returns [] once done.
        """
        if bool(state.done):
            return []
        numbers = tuple(int(v) for v in np.asarray(jax.device_get(state.numbers)) if v >= 0)
        target = int(state.target)
        plan = solve(numbers, target, self.config.max_value, self.config.num_numbers)
        if plan is None:
            return None
        return [self.calc_action(*calc) for calc in plan] + [self.answer_action(target)]
