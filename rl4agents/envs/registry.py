"""Environment registry: `make(name, **kwargs)` builds a registered environment.

Each entry declares its rollout backend: "jax" (the default: `reset`/`step` are pure JAX and
the rollout is one jitted program) or "host" (Python text environments stepped on worker
threads, `rl4agents.envs.host`). Training picks the backend from the entry, so a host
environment is selected by `env.name` like any other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rl4agents.registry import Registry

BACKENDS = ("jax", "host")
ENVIRONMENTS = Registry(
    "environment", section="env", keyword_only=False, skip=("tokenizer",), plural="environments"
)
_REGISTRY = ENVIRONMENTS._fns  # name -> constructor (tests patch entries in for one test)


def register(name: str, *, backend: str = "jax", minimal_vocab: bool = True):
    """Decorator registering an environment constructor under `name` (duplicates raise).

    Args:
      name: the `env.name` that selects it.
      backend: "jax" or "host" (see the module docstring).
      minimal_vocab: the environment's text comes from fixed fragments, so `env.vocab=
        "minimal"` can build a tokenizer of only its words (`text.minimal_tokenizer`);
        False for open-ended text.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} for environment {name!r}; allowed: {BACKENDS}")
    return ENVIRONMENTS.register(name, backend=backend, minimal_vocab=minimal_vocab)


def names(backend: str | None = "jax") -> list[str]:
    """Sorted names of the registered environments of rollout backend `backend`: "jax" (the
    default: the jitted environments, which the environment contract covers), "host", or
    None for every environment (what `env.name` allows)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {BACKENDS} or None")
    return [n for n in ENVIRONMENTS.names() if backend is None or _backend(n) == backend]


def _backend(name: str) -> str:
    return ENVIRONMENTS.attr(name, "backend", "jax")


def get(name: str) -> Callable[..., Any]:
    """The constructor of environment `name`; unknown names raise with the known ones."""
    return ENVIRONMENTS.get(name)


def backend(name: str) -> str:
    """The rollout backend of environment `name`: "jax" or "host"."""
    get(name)  # unknown names raise with the known ones
    return _backend(name)


def make(name: str, **kwargs) -> Any:
    """Build environment `name`; unknown names raise with the list of known ones."""
    return get(name)(**kwargs)


def defaults(name: str) -> dict[str, Any]:
    """Constructor defaults of environment `name` (its config section; tokenizer excluded)."""
    return ENVIRONMENTS.defaults(name)


def validate(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check constructor kwargs of `name`: its defaults (`defaults`) updated by `kwargs`.

    A keyword parameter without a simple default (a host environment's factory `args`) is
    accepted too; it has no config field of its own type.

    Raises:
      KeyError: unknown `name`.
      ValueError: a field the constructor does not take, naming the allowed ones.
    """
    params = inspect.signature(get(name)).parameters.values()
    takes = {
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in ("self", "tokenizer")
    }
    allowed = defaults(name)
    unknown = sorted(set(kwargs) - takes)
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for environment {name!r}; allowed: {sorted(allowed)}"
        )
    return {**allowed, **kwargs}
