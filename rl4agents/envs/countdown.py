"""Countdown with a calculator tool as a multi-turn text environment.

The agent gets `num_numbers` small numbers and a target. Each turn it answers either

  "calc a op b"  with op one of "+", "-", "*" and a, b numbers it currently holds: the result
                 replaces the two operands; the reply is "a op b = r" and the numbers left;
  "answer n"     which ends the episode.

An answer scores `goal_reward` (success) only when n equals the target, n is one of the numbers
currently held, and at least one calc was made. Generated targets are never among the starting
numbers, so the target must be built with the tool: guessing it without calcs cannot score.
Every number is an integer in 0..`max_value` (at most 99, two digits): a calc whose result is
negative or above `max_value` is an invalid turn, as is one naming a number not held (a number
held once cannot be used twice). Invalid turns cost `invalid_penalty` and change nothing.

The action table enumerates every string "calc a op b" and "answer n" over 0..`max_value`
(3 (M+1)^2 + (M+1) actions, 2914 for the default M = 30) and the parser matches the whole
action against it (`text.match_action`), so any tokenizer works. Numbers held are kept sorted
ascending; the observation lists them as "left: 3 , 5 , 7" (commas keep multi-digit numbers
apart when a tokenizer spells digits one by one).

Generation (pure JAX, from the reset key): `num_candidates` candidates per round, each drawing
`num_numbers` starting numbers uniformly from 1..`max_start` and combining them all by
`num_numbers - 1` random operations on random pairs ("-" takes the larger minus the smaller),
so every task is solvable. A candidate qualifies when every intermediate result is in range,
the target is in [`min_target`, `max_value`], the target is not a starting number, and the
task's class matches the split: a task (sorted starting numbers, target) belongs to the test
class when `hash_u32(task) % 1000 < test_fraction * 1000`, so training never generates a test
task. Rounds repeat (at most `_MAX_ROUNDS`, inside a `while_loop`); if none qualifies (which has
negligible probability for the defaults) a fixed solvable task found at construction is used.
The "ood" split has more numbers and larger targets: `num_numbers=ood_num_numbers`,
`max_value=ood_max_value` and targets from `ood_min_target` (default: one above the training
`max_value`), either class.

Process signal (`progress_reward` c > 0): potential-based shaping `c * (d(s) - d(s'))`, where
d is the fewest calcs that still make the target appear among the numbers held (0 once it is
held; `num_numbers` when it can no longer be made). A calc on a shortest route to the target
earns +c, a detour 0 or less, a dead end -c times the lost distance; the optimal policy is
unchanged (Ng et al., 1999).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = base.SPLITS
OPS = ("+", "-", "*")
EMPTY = -1  # a used slot of `CountdownState.numbers`
_MAX_ROUNDS = 16
_MAX_NUMBERS = 5  # d(s) enumerates every calc sequence; 5 numbers is ~20k leaf multisets
_LINE = 6  # fragment slots of an observation's first line ("a op b = r\n")


CountdownParams = base.SplitParams


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
            value = getattr(self, name)
            if not 2 <= value <= _MAX_NUMBERS:
                raise ValueError(f"{name} must be in [2, {_MAX_NUMBERS}], got {value}")
        for name in ("max_value", "ood_max_value"):
            value = getattr(self, name)
            if not 1 <= value <= 99:
                raise ValueError(f"{name} must be in [1, 99] (two-digit numbers), got {value}")
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
        base.check_test_fraction(self.test_fraction)
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")
        base.check_nonnegative("progress_reward", self.progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", self.invalid_penalty, " (it is subtracted)")
        base.check_nonnegative("goal_reward", self.goal_reward)


@flax.struct.dataclass
class CountdownState:
    """One episode's state."""

    numbers: jax.Array  # int32[N] numbers held, ascending, then EMPTY for used slots
    target: jax.Array  # int32[] the number to build
    done: jax.Array  # bool[] answered


def canonical(numbers: jax.Array) -> jax.Array:
    """Sort the numbers held ascending with EMPTY slots last.

    Args:
      numbers: int32[..., N] numbers, EMPTY (-1) for used slots, in any order.

    Returns:
      int32[..., N] the same multiset, ascending, EMPTY slots at the end.
    """
    big = jnp.iinfo(jnp.int32).max
    ordered = jnp.sort(jnp.where(numbers < 0, big, numbers), axis=-1)
    return jnp.where(ordered == big, EMPTY, ordered).astype(jnp.int32)


def task_hash(numbers: jax.Array, target: jax.Array) -> jax.Array:
    """uint32[] hash of a task: canonical starting numbers int32[N] and target int32[]."""
    return text.hash_u32(jnp.concatenate([canonical(numbers), jnp.reshape(target, (1,))]))


def _children(
    states: jax.Array, valid: jax.Array, slots: int, max_value: int
) -> tuple[jax.Array, jax.Array]:
    """Every multiset one calc away.

    Args:
      states: int32[S, N] canonical multisets whose numbers all lie in the first `slots` slots.
      valid: bool[S] which rows are real states.
      slots: static number of leading slots to pair up.
      max_value: largest allowed result.

    Returns:
      children int32[S * P * 3, N] (canonical; P = slots choose 2 pairs, 3 operations each)
      and bool[S * P * 3] which children are real (live parent, both operands held, in range).
    """
    n = states.shape[1]
    pairs = np.array([(i, j) for i in range(slots) for j in range(i + 1, slots)], np.int32)
    a, b = states[:, pairs[:, 0]], states[:, pairs[:, 1]]  # [S, P], a <= b (canonical)
    results = jnp.stack([a + b, jnp.abs(a - b), a * b], axis=-1)  # [S, P, 3]
    ok = valid[:, None, None] & ((a >= 0) & (b >= 0))[..., None] & (results <= max_value)
    cols = np.arange(n)
    first = (cols[None, :] == pairs[:, :1])[None, :, None, :]  # [1, P, 1, N]
    second = (cols[None, :] == pairs[:, 1:])[None, :, None, :]
    child = jnp.where(first, results[..., None], jnp.where(second, EMPTY, states[:, None, None]))
    return canonical(child).reshape(-1, n), ok.reshape(-1)


def calc_distance(numbers: jax.Array, target: jax.Array, max_value: int) -> jax.Array:
    """Fewest calcs after which the target is among the numbers held.

    Enumerates every calc sequence (fixed shapes; about 20k multisets for 5 numbers).

    Args:
      numbers: int32[N] canonical numbers held (EMPTY for used slots).
      target: int32[] target.
      max_value: largest allowed result (static).

    Returns:
      int32[] 0 if the target is held, k if k calcs can make it, N if no sequence can.
    """
    n = numbers.shape[0]
    hits = [jnp.any(numbers == target)]
    frontier, valid = numbers[None], jnp.ones((1,), bool)
    for level in range(n - 1):
        frontier, valid = _children(frontier, valid, n - level, max_value)
        hits.append(jnp.any(valid & jnp.any(frontier == target, axis=1)))
    hits = jnp.stack(hits)
    return jnp.where(hits.any(), jnp.argmax(hits), n).astype(jnp.int32)


def solve(
    numbers: tuple[int, ...], target: int, max_value: int, num_slots: int
) -> list[tuple[int, str, int]] | None:
    """Shortest calc sequence (host side, breadth-first over multisets) that makes the target.

    Args:
      numbers: the numbers held.
      target: the target.
      max_value: largest allowed result.
      num_slots: N, the number of starting numbers (the goal needs at least one calc made,
        i.e. fewer than N numbers held).

    Returns:
      [(a, op, b), ...] calcs with a >= b, after which the target is held; None if impossible.
    """
    start = tuple(sorted(numbers))
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        held = queue.popleft()
        if target in held and len(held) < num_slots:
            plan = []
            while parent[held] is not None:
                held, calc = parent[held]
                plan.append(calc)
            return plan[::-1]
        for i, j in itertools.combinations(range(len(held)), 2):
            small, large = held[i], held[j]  # held is sorted
            rest = held[:i] + held[i + 1 : j] + held[j + 1 :]
            for op, result in zip(OPS, (large + small, large - small, large * small)):
                child = tuple(sorted(rest + (result,)))
                if result <= max_value and child not in parent:
                    parent[child] = (held, (large, op, small))
                    queue.append(child)
    return None


def _reachable(numbers: tuple[int, ...], max_value: int) -> set[int]:
    """Every number held after one or more calcs from `numbers` (host side)."""
    seen, queue, values = {tuple(sorted(numbers))}, [tuple(sorted(numbers))], set()
    while queue:
        held = queue.pop()
        for i, j in itertools.combinations(range(len(held)), 2):
            small, large = held[i], held[j]
            rest = held[:i] + held[i + 1 : j] + held[j + 1 :]
            for result in (large + small, large - small, large * small):
                child = tuple(sorted(rest + (result,)))
                if result <= max_value and child not in seen:
                    seen.add(child)
                    values.update(child)
                    queue.append(child)
    return values


@registry.register("countdown")
class Countdown(base.TextEnv):
    """Countdown with a calculator tool (see the module docstring).

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
        self._fallback = self._find_fallback()

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
        numbers, target = self._generate(key, params.split)
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
        return new_state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=is_answer,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=won,
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

    @property
    def _bits_per_candidate(self) -> int:
        n = self.config.num_numbers
        return n + 3 * (n - 1)

    def _candidate(self, bits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One random task by combining all starting numbers (may not qualify).

        Args:
          bits: uint32[_bits_per_candidate] random bits.

        Returns:
          (start int32[N] canonical starting numbers, target int32[], in_range bool[] every
          intermediate result was at most max_value).
        """
        n, c = self.config.num_numbers, self.config
        numbers = (1 + bits[:n] % c.max_start).astype(jnp.int32)
        start = numbers
        slots = jnp.arange(n)
        in_range = jnp.ones((), bool)
        # Selects and masked sums instead of gathers and scatters: the same values, and it
        # compiles several times faster inside the vmapped while_loop.
        for k in range(n - 1):
            live = n - k  # live numbers occupy slots [0, live)
            pick = bits[n + 3 * k : n + 3 * k + 3]
            i = (pick[0] % live).astype(jnp.int32)
            j = (pick[1] % (live - 1)).astype(jnp.int32)
            j = j + (j >= i)
            x = jnp.sum(jnp.where(slots == i, numbers, 0))
            y = jnp.sum(jnp.where(slots == j, numbers, 0))
            op = pick[2] % 3
            result = jnp.where(op == 0, x + y, jnp.where(op == 1, jnp.abs(x - y), x * y))
            in_range = in_range & (result <= c.max_value)
            # lo <- result, hi <- the last live number, the last live slot <- EMPTY (lo < hi).
            lo, hi = jnp.minimum(i, j), jnp.maximum(i, j)
            moved = jnp.where(slots == hi, numbers[live - 1], numbers)
            moved = jnp.where(slots == live - 1, EMPTY, moved)
            numbers = jnp.where(slots == lo, result, moved)
        return canonical(start), numbers[0], in_range

    def _generate(self, key: jax.Array, split: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(int32[N] starting numbers, int32[] target) of the split's class (`_MAX_ROUNDS`
        rounds of `num_candidates` candidates; the fixed fallback task if none qualifies)."""
        c = self.config

        def _qualifies(start, target, in_range):
            fits = in_range & (target >= c.min_target) & (target <= c.max_value)
            in_class = self.in_split(task_hash(start, target), split)
            return fits & ~jnp.any(start == target) & in_class

        def _candidates(bits):
            start, target, in_range = jax.vmap(self._candidate)(bits)
            return (start, target), jax.vmap(_qualifies)(start, target, in_range)

        fallback_numbers, fallback_target = self._fallback
        return base.first_qualifying(
            key,
            _candidates,
            (jnp.asarray(fallback_numbers, jnp.int32), jnp.asarray(fallback_target, jnp.int32)),
            num_candidates=c.num_candidates,
            bits_per_candidate=self._bits_per_candidate,
            max_rounds=_MAX_ROUNDS,
        )

    def _find_fallback(self) -> tuple[np.ndarray, int]:
        """A fixed solvable task for the astronomically rare exhausted generation (host side)."""
        c = self.config
        n = c.num_numbers
        tries = itertools.islice(
            itertools.combinations_with_replacement(range(c.max_start, 0, -1), n), 200
        )
        for numbers in tries:
            targets = [
                v
                for v in _reachable(numbers, c.max_value)
                if c.min_target <= v <= c.max_value and v not in numbers
            ]
            if targets:
                return np.array(sorted(numbers), np.int32), max(targets)
        raise ValueError(
            f"no task with a target in [min_target={c.min_target}, max_value="
            f"{c.max_value}] is reachable from {n} numbers in 1..{c.max_start}; "
            "lower min_target or raise max_value / max_start"
        )

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
