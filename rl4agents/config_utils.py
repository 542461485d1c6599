"""Helpers that build config sections from registries and validate a config at start-up.

Every registered variant (environment, credit estimator, policy loss) gets a config section
whose fields are the keyword defaults of its function, so the registry is the only list of
names and the only source of defaults.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import ml_collections

_SIMPLE = (bool, int, float, str, type(None))


def signature_defaults(fn: Callable[..., Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """Keyword parameters of `fn` with simple defaults (bool/int/float/str/None)."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.default is inspect.Parameter.empty:
            continue
        if p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        if isinstance(p.default, _SIMPLE):
            out[p.name] = p.default
    return out


def sections(names: Iterable[str], defaults_fn: Callable[[str], dict]) -> ml_collections.ConfigDict:
    """One sub-dict of defaults per registered name."""
    return ml_collections.ConfigDict({name: defaults_fn(name) for name in names})


def check_choice(field: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; allowed: {allowed}")


def to_dict(section: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    return section.to_dict() if isinstance(section, ml_collections.ConfigDict) else dict(section)
