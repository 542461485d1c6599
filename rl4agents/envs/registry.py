"""Environment registry: `make(name, **kwargs)` builds a registered environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register(name: str):
    """Decorator registering an environment constructor under `name` (duplicates raise)."""

    def wrap(ctor):
        if name in _REGISTRY:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = ctor
        return ctor

    return wrap


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Callable[..., Any]:
    """The constructor of environment `name`; unknown names raise with the known ones."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; known environments: {names()}")
    return _REGISTRY[name]


def make(name: str, **kwargs) -> Any:
    """Build environment `name`; unknown names raise with the list of known ones."""
    return get(name)(**kwargs)


def defaults(name: str) -> dict[str, Any]:
    """Constructor defaults of environment `name` (its config section; tokenizer excluded)."""
    from rl4agents import config_utils

    return config_utils.signature_defaults(get(name), skip=("tokenizer", "self"))


def validate(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check constructor kwargs of `name`; unknown fields raise naming the allowed ones."""
    allowed = defaults(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for environment {name!r}; allowed: {sorted(allowed)}"
        )
    return {**allowed, **kwargs}
