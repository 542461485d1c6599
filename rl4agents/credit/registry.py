"""Credit-assignment registry: advantage estimators selected by name.

A credit function (`CreditFn`) has the signature

    fn(traj: Trajectory, values: f32[B, T] | None, *, <hparams with reference defaults>)
        -> CreditOutput

`values` holds critic values per slot for estimators registered with `needs_values=True` and is
`None` otherwise. Hyperparameters are keyword-only, so `inspect.signature` of the registered
function is the single source of truth for a variant's config section (`validate`, `defaults`).
Resolve a variant before tracing: `functools.partial(get(name), **validate(name, hparams))`.

The table is a `rl4agents.registry.Registry`, the one registry type of every extension point;
each variant declares the facts callers need (`needs_values`, `needs_greedy`, `needs_groups`)
when it registers, so nothing else derives them from its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from rl4agents.registry import Registry
from rl4agents.types import Trajectory


class CreditOutput(NamedTuple):
    """What a credit function returns.

    Attributes:
      advantages: f32[B, T] per-slot advantages, exactly zero off `traj.action_mask`.
      returns: f32[B, T] value targets (zero off `action_mask`) for critic methods, else None.
      metrics: dict of f32[] scalars for logging.
    """

    advantages: jax.Array
    returns: jax.Array | None
    metrics: dict[str, jax.Array]


CreditFn = Callable[..., CreditOutput]


_CREDIT = Registry("credit function", section="credit")


def register(
    name: str, *, needs_values: bool = False, needs_greedy: bool = False, needs_groups: bool = False
) -> Callable[[CreditFn], CreditFn]:
    """Decorator registering a credit function under `name` (duplicates raise ValueError).

    Args:
      name: registry key, e.g. "grpo".
      needs_values: the estimator consumes critic values (`values` must not be None); also set
        as the attribute `fn.needs_values`.
      needs_greedy: the estimator consumes `traj.baseline_reward`, the score of one greedy
        episode per task, which the train step then rolls out (ReMax).
      needs_groups: the estimator compares the samples of one task (a group baseline), so
        `rollout.group_size` must be at least 2.
    """
    return _CREDIT.register(
        name, needs_values=needs_values, needs_greedy=needs_greedy, needs_groups=needs_groups
    )


def declare(name: str, **facts: bool) -> None:
    """Add facts (`needs_groups=True`, ...) to the registered credit function `name`."""
    _CREDIT.declare(name, **facts)


def get(name: str) -> CreditFn:
    """The credit function registered as `name`; unknown names raise KeyError listing names()."""
    return _CREDIT.get(name)


def names() -> list[str]:
    """Sorted names of all registered credit functions."""
    return _CREDIT.names()


def requires_values(name: str) -> bool:
    """Whether credit function `name` needs critic values."""
    return bool(_CREDIT.attr(name, "needs_values", False))


def requires_greedy(name: str) -> bool:
    """Whether credit function `name` needs a greedy baseline episode per task."""
    return bool(_CREDIT.attr(name, "needs_greedy", False))


def requires_groups(name: str) -> bool:
    """Whether credit function `name` compares the samples of a task (group_size >= 2)."""
    return bool(_CREDIT.attr(name, "needs_groups", False))


def fields(name: str) -> list[str]:
    """Hyperparameter names of credit function `name`."""
    return _CREDIT.fields(name)


def defaults(name: str) -> dict[str, Any]:
    """Reference defaults of credit function `name` (one config sub-dict per variant)."""
    return _CREDIT.defaults(name)


def probe_trajectory(
    batch: int = 4, length: int = 12, turns: int = 3
) -> Any:  # Trajectory of jax.ShapeDtypeStruct
    """An abstract `Trajectory` (shapes and dtypes only, optional fields included) to trace an
    estimator with `jax.eval_shape`, so that its checks of hyperparameters run at start-up."""

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    b, t, k = batch, length, turns
    f32, i32, b8 = jax.numpy.float32, jax.numpy.int32, jax.numpy.bool_
    return Trajectory(
        tokens=spec((b, t), i32),
        valid_mask=spec((b, t), b8),
        action_mask=spec((b, t), b8),
        obs_mask=spec((b, t), b8),
        turn_ids=spec((b, t), i32),
        turn_end=spec((b, k), i32),
        logp_behavior=spec((b, t), f32),
        turn_rewards=spec((b, k), f32),
        turn_valid=spec((b, k), b8),
        turn_action_valid=spec((b, k), b8),
        anchors=spec((b, k), jax.numpy.uint32),
        outcome_reward=spec((b,), f32),
        success=spec((b,), b8),
        done=spec((b,), b8),
        truncated=spec((b,), b8),
        group_ids=spec((b,), i32),
        num_turns=spec((b,), i32),
        entropy_behavior=spec((b, t), f32),
        baseline_reward=spec((b,), f32),
        token_penalty=spec((b, t), f32),
    )


def validate(name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check `hparams` for credit function `name` and return them merged with the defaults.

    Besides the fields, the values are checked: the estimator is traced once on an abstract
    trajectory (`probe_trajectory`, no computation), so every check it makes of its
    hyperparameters (ranges, choices) fails here, at start-up, not in the first train step.

    Raises:
      KeyError: unknown `name` (lists names()).
      ValueError: unknown field (names the field, the variant and the allowed fields), or a
        value the estimator refuses ("credit.grpo: eps=-1.0; allowed: > 0").
    """
    bound = _CREDIT.validate(name, hparams)
    traj = probe_trajectory()
    values = jax.ShapeDtypeStruct(traj.tokens.shape, jax.numpy.float32)
    fn = get(name)
    try:
        jax.eval_shape(lambda tr, v: fn(tr, v, **bound), traj, values)
    except ValueError as e:
        raise ValueError(f"credit.{name}: {e}") from e
    return bound
