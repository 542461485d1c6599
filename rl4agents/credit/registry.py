"""Credit-assignment registry: advantage estimators selected by name.

A credit function (`CreditFn`) has the signature

    fn(traj: Trajectory, values: f32[B, T] | None, *, <hparams with reference defaults>)
        -> CreditOutput

`values` holds critic values per slot for estimators registered with `needs_values=True` and is
`None` otherwise. Hyperparameters are keyword-only, so `inspect.signature` of the registered
function is the single source of truth for a variant's config section (`validate`, `defaults`).
Resolve a variant before tracing: `functools.partial(get(name), **validate(name, hparams))`.

The generic `Registry` class is reused by `rl4agents.losses.registry` for policy losses and loss
aggregation modes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax


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


class Registry:
    """Name -> function table; duplicates raise, unknown names list the known ones.

    Hyperparameters of a registered function are its keyword-only parameters; positional
    parameters are the data inputs (e.g. `traj, values`).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **attrs: Any) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` under `name`; `attrs` are stored and set on `fn`."""

        def wrap(fn):
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._fns[name] = fn
            self._attrs[name] = dict(attrs)
            for key, value in attrs.items():
                setattr(fn, key, value)
            return fn

        return wrap

    def names(self) -> list[str]:
        return sorted(self._fns)

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._fns:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {self.names()}")
        return self._fns[name]

    def attr(self, name: str, key: str, default: Any = None) -> Any:
        self.get(name)
        return self._attrs[name].get(key, default)

    def fields(self, name: str) -> list[str]:
        """Names of the keyword-only hyperparameters of variant `name`."""
        params = inspect.signature(self.get(name)).parameters.values()
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def defaults(self, name: str) -> dict[str, Any]:
        """The reference defaults of variant `name` (its config section)."""
        params = inspect.signature(self.get(name)).parameters
        return {k: params[k].default for k in self.fields(name)}

    def validate(self, name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check `hparams` against the signature of `name`; return them merged with defaults.

        Raises:
          KeyError: unknown `name`.
          ValueError: a field that is not a hyperparameter of `name` (message lists the
            allowed fields).
        """
        allowed = self.fields(name)
        hparams = dict(hparams or {})
        unknown = sorted(set(hparams) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown} for {self.kind} {name!r}; allowed fields: {allowed}"
            )
        sig = inspect.signature(self.get(name))
        # Keep only the keyword-only parameters so the data inputs need not be supplied.
        kw_sig = sig.replace(parameters=[sig.parameters[k] for k in allowed])
        bound = kw_sig.bind(**hparams)
        bound.apply_defaults()
        return dict(bound.arguments)


_CREDIT = Registry("credit function")


def register(
    name: str, *, needs_values: bool = False, needs_greedy: bool = False
) -> Callable[[CreditFn], CreditFn]:
    """Decorator registering a credit function under `name` (duplicates raise ValueError).

    Args:
      name: registry key, e.g. "grpo".
      needs_values: the estimator consumes critic values (`values` must not be None); also set
        as the attribute `fn.needs_values`.
      needs_greedy: the estimator consumes `traj.baseline_reward`, the score of one greedy
        episode per task, which the train step then rolls out (ReMax).
    """
    return _CREDIT.register(name, needs_values=needs_values, needs_greedy=needs_greedy)


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


def fields(name: str) -> list[str]:
    """Hyperparameter names of credit function `name`."""
    return _CREDIT.fields(name)


def defaults(name: str) -> dict[str, Any]:
    """Reference defaults of credit function `name` (one config sub-dict per variant)."""
    return _CREDIT.defaults(name)


def validate(name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check `hparams` for credit function `name` and return them merged with the defaults.

    Raises:
      KeyError: unknown `name` (lists names()).
      ValueError: unknown field (names the field, the variant and the allowed fields).
    """
    return _CREDIT.validate(name, hparams)
