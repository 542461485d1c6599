"""Host-environment factories by name, so a config can select a Python text environment.

A factory is `fn(split, **kwargs) -> (task -> TextEnv) | None`: given a split ("train",
"test" or "ood") and its keyword arguments from the config (`env.host.args`), it returns the
per-episode constructor a `HostPool` takes, or None when it has no such split. Registered
factories are selected by name (`--config.env.host.factory=textarena`); any importable
function can be selected by its path, "package.module:function", without registering it.
Held-out splits reset their games from seeds training never uses (`split_seeds`); whether
that makes the tasks new depends on the game (a game with few instances repeats them).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from rl4agents.registry import Registry

SPLITS = ("train", "test", "ood")
FACTORIES = Registry("host factory")


def register(name: str):
    """Decorator: register a factory `fn(split, **kwargs)` under `name`."""

    def wrap(fn):
        if next(iter(inspect.signature(fn).parameters), None) != "split":
            raise ValueError(f"host factory {name!r}: the first parameter must be `split`")
        return FACTORIES.register(name)(fn)

    return wrap


def names() -> list[str]:
    """Sorted names of the registered factories."""
    return FACTORIES.names()


def resolve(name: str) -> Callable[..., Any]:
    """The factory registered as `name`, or the function at "module:attr".

    Raises:
      ValueError: an unknown name (listing the registered ones) or a path that does not import.
    """
    if name in FACTORIES:
        return FACTORIES.get(name)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"env.host.factory={name!r} does not import: {e}") from e
        if not callable(fn):
            raise ValueError(f"env.host.factory={name!r} is not callable")
        return fn
    raise ValueError(
        f"env.host.factory={name!r} is unknown; allowed: one of {names()} or "
        "'package.module:function'"
    )


def validate(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The factory's keyword arguments: its defaults updated by `kwargs`.

    Raises:
      ValueError: a field the factory does not take (naming the ones it does).
    """
    params = list(inspect.signature(resolve(name)).parameters.values())[1:]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    allowed = {
        p.name: p.default
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
    }
    required = [p.name for p in params if p.kind is not p.VAR_KEYWORD and p.default is p.empty]
    unknown = sorted(set(kwargs) - set(allowed) - set(required))
    if unknown and not takes_any:
        raise ValueError(
            f"unknown field(s) {unknown} in env.host.args for factory {name!r}; "
            f"allowed: {sorted(set(allowed) | set(required))}"
        )
    missing = [r for r in required if r not in kwargs]
    if missing:
        raise ValueError(f"env.host.args is missing {missing} for factory {name!r}")
    return {**allowed, **kwargs}


def make_factory(name: str, split: str, kwargs: dict[str, Any]):
    """`resolve(name)(split, **validate(name, kwargs))`: a `task -> TextEnv` or None."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; allowed: {list(SPLITS)}")
    return resolve(name)(split, **validate(name, kwargs))


def split_seeds(seeds: np.ndarray, split: str) -> np.ndarray:
    """Reset seeds of `split`: even for training, odd for the held-out splits (disjoint).

    Args:
      seeds: int64[N] non-negative seeds (e.g. `host.task_seeds`).
      split: "train", "test" or "ood".

    Returns:
      int64[N]: 2 * (seeds // 2) for "train", that + 1 otherwise.
    """
    base = (np.asarray(seeds, np.int64) // 2) * 2
    return base if split == "train" else base + 1
