"""The environment protocol: pure functions over fixed-shape token arrays.

Functions act on one episode; batch them with `jax.vmap` at the call site. Per-task data lives
in the state or the params, never in `self`, so one compilation serves every task. Once `done`
is set, `step` is absorbing: state unchanged, zero reward, empty observation.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.types import TimeStep


class Environment(Protocol):
    """A multi-turn text environment over token arrays.

    Attributes (static, set at construction):
      tokenizer: the tokenizer its fragments were encoded with.
      max_obs_len: O, the static length of `TimeStep.obs_tokens` after `step`.
      max_prompt_len: P, the static length of the observation returned by `reset`.
      max_action_len: the longest valid action in tokens (the rollout's A must be at least
        this plus one for the end-of-action token).
    """

    tokenizer: text.Tokenizer
    max_obs_len: int
    max_prompt_len: int
    max_action_len: int

    def default_params(self, split: str = "train") -> Any: ...

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, TimeStep]: ...

    def step(
        self,
        key: jax.Array,
        state: Any,
        action_tokens: jax.Array,  # int32[A]
        action_len: jax.Array,  # int32[]
        params: Any,
    ) -> tuple[Any, TimeStep]: ...

    def render(self, state: Any) -> str: ...


def absorbing(done: jax.Array, old, new):
    """Select `old` where the episode was already done, else `new` (pytrees, one episode)."""
    return jax.tree.map(lambda o, n: jnp.where(done, o, n), old, new)


def empty_timestep(obs_len: int, anchor: jax.Array, pad_id: int) -> TimeStep:
    """The timestep returned by `step` after `done`: nothing appended, no reward."""
    return TimeStep(
        obs_tokens=jnp.full((obs_len,), pad_id, jnp.int32),
        obs_len=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        done=jnp.ones((), bool),
        anchor=anchor,
        valid_action=jnp.ones((), bool),
        success=jnp.zeros((), bool),
    )


def check_test_fraction(test_fraction: float) -> None:
    """Raises ValueError unless both splits get tasks: tasks hash into 1000 classes and the
    first `round(1000 * test_fraction)` are the test split (`in_split_class`)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 1 <= round(test_fraction * 1000) <= 999:
        raise ValueError(
            "test_fraction must leave each class at least 1/1000 of the tasks (tasks hash "
            f"into 1000 classes: round(test_fraction * 1000) in [1, 999]), got {test_fraction}"
        )


def check_nonnegative(name: str, value: float, note: str = "") -> None:
    """Raises ValueError "{name} must be >= 0{note}, got {value}" unless `value >= 0` (NaN
    fails). `note` says why, e.g. " (it is subtracted)"."""
    if not value >= 0.0:
        raise ValueError(f"{name} must be >= 0{note}, got {value}")


def in_split_class(task_hash: jax.Array, test_threshold: int, split: jax.Array) -> jax.Array:
    """bool[]: a task of this hash belongs to `split` (0 train, 1 test, 2 OOD).

    Tasks whose `task_hash % 1000 < test_threshold` form the held-out (test) class; training
    generates only the other class, and OOD (a differently configured env) takes either.
    """
    is_test = task_hash % 1000 < test_threshold
    return (split == 2) | (is_test == (split == 1))


def first_qualifying(
    key: jax.Array,
    candidates_fn,
    fallback: Any,
    *,
    num_candidates: int,
    bits_per_candidate: int,
    max_rounds: int,
) -> Any:
    """The first qualifying candidate task over `while_loop` rounds (procedural generation).

    Round r draws uint32[num_candidates, bits_per_candidate] random bits from
    `fold_in(key, r)` and calls `candidates_fn(bits) -> (candidates, ok)`: a pytree of
    `num_candidates` tasks (leading axis) and bool[num_candidates]. The first round with any
    `ok` gives its first qualifying task; if none of `max_rounds` rounds does, `fallback` (one
    task, the same pytree structure without the leading axis) is returned.
    """

    def _round(carry):
        round_index, _, best = carry
        shape = (num_candidates, bits_per_candidate)
        bits = jax.random.bits(jax.random.fold_in(key, round_index), shape, jnp.uint32)
        candidates, ok = candidates_fn(bits)
        found = ok.any()
        chosen = jax.tree.map(lambda x: x[jnp.argmax(ok)], candidates)
        best = jax.tree.map(lambda b, c: jnp.where(found, c, b), best, chosen)
        return round_index + 1, found, best

    init = (jnp.zeros((), jnp.int32), jnp.zeros((), bool), fallback)
    _, _, task = jax.lax.while_loop(lambda c: ~c[1] & (c[0] < max_rounds), _round, init)
    return task
