"""One registry type for every extension point: environments, credit estimators, policy
losses, loss aggregation modes, host-environment factories and rollout backends.

A `Registry` maps a name to a function (or a class) and to facts declared with it
(`register(name, needs_values=True)`; read back with `attr`). A variant's hyperparameters
are read off its signature, so the registered function is the single source of truth for its
config section: keyword-only parameters for functions whose positional parameters are data
(`traj, values`), or every keyword parameter with a simple default for constructors
(`keyword_only=False`, e.g. environments). Duplicate names raise ValueError; unknown names
raise KeyError listing the known ones.

A registry that owns a config section (`section="credit"`: the fields `credit.<name>.*`) is
listed by `for_section`, so code that reads a config can ask which registry a section's
variants come from without importing the package that fills it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

_SIMPLE = (bool, int, float, str, type(None))
_BY_SECTION: dict[str, Registry] = {}


def signature_defaults(fn: Callable[..., Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """Keyword parameters of `fn` with simple defaults (bool/int/float/str/None)."""
    skip = set(skip)
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.default is inspect.Parameter.empty:
            continue
        if p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        if isinstance(p.default, _SIMPLE):
            out[p.name] = p.default
    return out


class Registry:
    """Name -> function table with declared facts per name.

    Args:
      kind: what is registered, in words ("credit function"), for error messages.
      section: the config section whose `<section>.<name>` sub-sections hold the variants'
        hyperparameters ("env", "credit", "loss"), or None.
      keyword_only: hyperparameters are the keyword-only parameters (True), or every
        parameter with a simple default (False: constructors).
      skip: parameter names that are never hyperparameters (e.g. "tokenizer").
      plural: the word for several of them in the unknown-name message ("known
        environments: [...]"); by default the message says "known: [...]".
    """

    def __init__(
        self,
        kind: str,
        *,
        section: str | None = None,
        keyword_only: bool = True,
        skip: Iterable[str] = (),
        plural: str | None = None,
    ):
        self.kind = kind
        self.plural = plural
        self.keyword_only = keyword_only
        self.skip = tuple(skip)
        self._fns: dict[str, Callable[..., Any]] = {}
        self._attrs: dict[str, dict[str, Any]] = {}
        if section is not None:
            if section in _BY_SECTION:
                raise ValueError(f"config section {section!r} already has a registry")
            _BY_SECTION[section] = self

    def register(self, name: str, **attrs: Any) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` under `name`; `attrs` are its declared facts (also set
        as attributes of a function: `credit.get("ppo_gae").needs_values`)."""

        def wrap(fn):
            self.add(name, fn, **attrs)
            return fn

        return wrap

    def add(self, name: str, fn: Callable[..., Any], **attrs: Any) -> None:
        """Register `fn` under `name` with the facts `attrs` (a duplicate name raises)."""
        if name in self._fns:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._fns[name] = fn
        self._attrs[name] = dict(attrs)
        if not inspect.isclass(fn):
            for key, value in attrs.items():
                setattr(fn, key, value)

    def declare(self, name: str, **attrs: Any) -> None:
        """Add the facts `attrs` to the registered `name` (unknown names raise KeyError)."""
        self.get(name)
        self._attrs.setdefault(name, {}).update(attrs)

    def __contains__(self, name: str) -> bool:
        return name in self._fns

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._fns)

    def get(self, name: str) -> Callable[..., Any]:
        """The function registered as `name`; unknown names raise KeyError listing names()."""
        if name not in self._fns:
            known = f"known {self.plural}" if self.plural else "known"
            raise KeyError(f"unknown {self.kind} {name!r}; {known}: {self.names()}")
        return self._fns[name]

    def attr(self, name: str, key: str, default: Any = None) -> Any:
        """The fact `key` declared with `name` at registration, else `default`."""
        self.get(name)
        return self._attrs.get(name, {}).get(key, default)

    def fields(self, name: str) -> list[str]:
        """Names of the hyperparameters of variant `name`."""
        if not self.keyword_only:
            return list(self.defaults(name))
        params = inspect.signature(self.get(name)).parameters.values()
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def defaults(self, name: str) -> dict[str, Any]:
        """The reference defaults of variant `name` (its config section)."""
        if not self.keyword_only:
            return signature_defaults(self.get(name), skip=("self", *self.skip))
        params = inspect.signature(self.get(name)).parameters
        return {k: params[k].default for k in self.fields(name) if k not in self.skip}

    def validate(self, name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check `hparams` against the fields of `name`; return them merged with the defaults.

        Raises:
          KeyError: unknown `name`.
          ValueError: a field that is not a hyperparameter of `name` (the message lists the
            allowed fields), or a required one that is missing.
        """
        allowed = self.fields(name)
        hparams = dict(hparams or {})
        unknown = sorted(set(hparams) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown} for {self.kind} {name!r}; allowed fields: {allowed}"
            )
        if not self.keyword_only:
            return {**self.defaults(name), **hparams}
        sig = inspect.signature(self.get(name))
        # Keep only the keyword-only parameters so the data inputs need not be supplied.
        kw_sig = sig.replace(parameters=[sig.parameters[k] for k in allowed])
        bound = kw_sig.bind(**hparams)
        bound.apply_defaults()
        return dict(bound.arguments)


def for_section(section: str) -> Registry | None:
    """The registry whose variants fill config section `section` ("env", "credit", "loss"),
    or None (none registered yet, or a section without variants)."""
    return _BY_SECTION.get(section)
