"""Experiment sweeps: build a study's runs, resolve their configs, read back their results.

A study file `experiments/<study>.py` names a base config and a sweep:

    from rl4agents import sweep

    BASE = "configs/frozen_lake.py"  # a config file, optionally "FILE:ARG", as train.py takes it

    def get_sweep():
        return sweep.product(
            sweep.fixed({"train.num_steps": 300}),
            sweep.sweep_values("credit.name", ["grpo", "rloo"]),
            sweep.seeds(3),
        )

A sweep is a list of `Point`s: a base config spec (or None for the study's `BASE`) and dotted
overrides. `product`, `zip_` and list concatenation (`+`) combine sweeps; `configs` lets each
point carry its own base config file, so one study can span several environments. `expand`
turns a sweep into named `Run`s; `resolve` loads a run's config, checks every override (the key
exists, the type fits) and checks that the command line `train.py` will get yields the same
config; `check_config` runs train.py's start-up checks of the values that need no device,
model or compile, so a sweep refuses a bad run before any run starts. Reading results back
(run status, mean/std over seeds, learning curves) is `rl4agents.results`; loading config
files and parsing overrides is `rl4agents.config_utils`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ml_collections

from rl4agents import config_utils
from rl4agents.config_utils import (  # noqa: F401 (a study's configs and overrides)
    apply_overrides,
    flatten,
    format_value,
    load_config,
    override_args,
    parse_command_config,
    split_spec,
    suggest,
)
from rl4agents.results import (  # noqa: F401 (the files of a run and of a study)
    COMMAND_NAME,
    CONFIG_NAME,
    LOG_NAME,
    METRICS_NAME,
    PLAN_NAME,
    SUMMARY_NAME,
)
from rl4agents.train import experiment

SEED_KEY = "seed"

_VALUE_TYPES = (bool, int, float, str, tuple, list, type(None))
_MAX_DIRNAME = 200


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a sweep under construction.

    Attributes:
      config: base config spec "FILE[:ARG]", or None for the study's `BASE`.
      overrides: dotted config key -> value, in order.
      named: the override keys that appear in the run name (and so in its variant).
    """

    config: str | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    named: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep.

    Attributes:
      name: readable unique name, e.g. "frozen_lake/credit.name=rloo/seed=1".
      config: base config spec "FILE[:ARG]".
      overrides: dotted config key -> value, applied in order.
      named: the override keys in the name.
    """

    name: str
    config: str
    overrides: Mapping[str, Any]
    named: tuple[str, ...]

    @property
    def dirname(self) -> str:
        """The name as one directory name."""
        return dirname(self.name)

    @property
    def seed(self) -> Any:
        return self.overrides.get(SEED_KEY)

    @property
    def variant(self) -> tuple[str, ...]:
        """What the run varies apart from the seed: the config's argument and named overrides."""
        arg = split_spec(self.config)[1]
        parts = [arg] if arg else []
        return tuple(
            parts + [f"{k}={_show(self.overrides[k])}" for k in self.named if k != SEED_KEY]
        )


def sweep_values(key: str, values: Iterable[Any], *, in_name: bool = True) -> list[Point]:
    """One point per value of the dotted config key `key`.

    Args:
      key: a dotted config key, e.g. "credit.name".
      values: the values, in order.
      in_name: whether the key appears in run names (and so separates table rows). Set False
        for a key zipped with a named one that already tells the runs apart.

    Returns:
      The sweep.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(
            f"sweep_values({key!r}, ...): the key {key!r} has type {type(key).__name__}; "
            "allowed: a dotted config key string such as 'credit.name'"
        )
    values = list(values)
    if not values:
        raise ValueError(f"sweep_values({key!r}, ...) got no values")
    return [Point(overrides={key: v}, named=(key,) if in_name else ()) for v in values]


def seeds(num: int, start: int = 0) -> list[Point]:
    """`num` points setting `seed` to start, start + 1, ..."""
    if num < 1:
        raise ValueError(f"seeds(num={num}): allowed: num >= 1")
    return sweep_values(SEED_KEY, range(start, start + num))


def fixed(overrides: Mapping[str, Any]) -> list[Point]:
    """One point with overrides shared by the runs it is combined with; not in run names."""
    return [Point(overrides=dict(overrides))]


def configs(specs: Iterable[str]) -> list[Point]:
    """One point per base config spec "FILE[:ARG]" (the file's stem and ARG name the run)."""
    specs = list(specs)
    if not specs:
        raise ValueError("configs([]) got no config specs")
    return [Point(config=s) for s in specs]


def product(*sweeps: Sequence[Point]) -> list[Point]:
    """Every combination of one point from each sweep; the last sweep varies fastest."""
    return [_merge(points) for points in itertools.product(*sweeps)]


def zip_(*sweeps: Sequence[Point]) -> list[Point]:
    """The i-th points of the sweeps merged; the sweeps must have the same length."""
    lengths = [len(s) for s in sweeps]
    if len(set(lengths)) > 1:
        raise ValueError(f"zip_ needs sweeps of equal length, got lengths {lengths}")
    return [_merge(points) for points in zip(*sweeps)]


def _merge(points: Sequence[Point]) -> Point:
    config, overrides, named = None, {}, ()
    for p in points:
        if not isinstance(p, Point):
            raise TypeError(f"a sweep is a list of sweep.Point, got an element {p!r}")
        if not isinstance(p.overrides, Mapping):
            raise TypeError(
                f"a Point's overrides are a mapping of dotted keys to values, got {p.overrides!r}"
            )
        if p.config is not None:
            if config is not None:
                raise ValueError(f"base config set twice in one run: {config!r} and {p.config!r}")
            config = p.config
        for k, v in p.overrides.items():
            if k in overrides:
                raise ValueError(f"{k!r} set twice in one run: {overrides[k]!r} and {v!r}")
            overrides[k] = v
        named += p.named
    return Point(config, overrides, named)


def _show(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(_show(v) for v in value)
    return str(value)


def run_name(config: str, overrides: Mapping[str, Any], named: Sequence[str]) -> str:
    """ "<config stem>[:ARG]/<key>=<value>/..." for the named overrides, in order."""
    path, arg = split_spec(config)
    head = os.path.splitext(os.path.basename(path))[0] + (f":{arg}" if arg else "")
    return "/".join([head] + [f"{k}={_show(overrides[k])}" for k in named])


def dirname(name: str) -> str:
    """A run name as one directory name: "/" -> "__", ":" -> "-", other odd characters -> "_".

    Names longer than 200 characters are cut and end with a hash of the full name.
    """
    out = re.sub(r"[^A-Za-z0-9._=,+-]", "_", name.replace("/", "__").replace(":", "-"))
    out = out.lstrip(".") or "_"
    if len(out) > _MAX_DIRNAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        out = f"{out[: _MAX_DIRNAME - 11]}-{digest}"
    return out


def expand(sweep: Sequence[Point], base: str | None = None) -> list[Run]:
    """Named runs from a sweep.

    Args:
      sweep: the points.
      base: the base config spec for points that set none.

    Returns:
      One run per point, in order.

    Raises:
      ValueError: a point without a base config, an override value of an unsupported type,
        or two runs with the same name (they differ only in unnamed overrides).
    """
    if not sweep:
        raise ValueError("the sweep has no runs")
    runs = []
    for p in sweep:
        p = _merge([p])  # checks the element's type
        config = p.config or base
        if not config:
            raise ValueError(
                f"a run with overrides {dict(p.overrides)} has no base config; set BASE in the "
                "study file or add sweep.configs([...]) to the sweep"
            )
        for k, v in p.overrides.items():
            if not isinstance(k, str) or not k:
                raise ValueError(
                    f"override key {k!r} ({type(k).__name__}); allowed: a dotted config key "
                    "string such as 'credit.name'"
                )
            if not isinstance(v, _VALUE_TYPES):
                raise ValueError(
                    f"{k}={v!r}: unsupported value type {type(v).__name__}; allowed: "
                    "bool, int, float, str, tuple, list, None"
                )
        name = run_name(config, p.overrides, p.named)
        runs.append(Run(name, config, dict(p.overrides), tuple(p.named)))
    _check_unique(runs)
    return runs


def _check_unique(runs: Sequence[Run]) -> None:
    seen: dict[str, Run] = {}
    for r in runs:
        other = seen.get(r.dirname)
        if other is not None:
            raise ValueError(
                f"two runs are both named {r.name!r} (directory {r.dirname!r}): overrides "
                f"{dict(other.overrides)} and {dict(r.overrides)}; put the keys that differ in "
                "the name (sweep_values(..., in_name=True)) or drop the duplicate"
            )
        seen[r.dirname] = r


@dataclasses.dataclass(frozen=True)
class Study:
    """A loaded study file: its name (the file's stem), path, base config spec and runs."""

    name: str
    path: str
    base: str | None
    runs: list[Run]


def load_study(path: str) -> Study:
    """Loads `experiments/<study>.py`: `BASE` (optional) and `get_sweep()`.

    If the study has no `BASE` but defines `get_config`, the study file itself is the base.

    Args:
      path: the study file.

    Returns:
      The study with its expanded runs.

    Raises:
      ValueError: a study file that is missing, does not load (a syntax error, an import that
        fails, any exception while it runs), has no `get_sweep()`, or whose `get_sweep()`
        raises or returns something other than a list of `Point`s that `expand` accepts. The
        message names the file and the problem, on one line.
    """
    if not os.path.isfile(path):
        raise ValueError(f"study file {path!r} does not exist")
    try:
        module = config_utils.load_module(path, "rl4agents_study")
    except Exception as e:  # the study's own code: any error is the study's
        raise ValueError(
            f"study file {path!r} does not load: {config_utils.describe_error(e, path)}"
        ) from e
    if not callable(getattr(module, "get_sweep", None)):
        raise ValueError(f"study file {path!r} defines no get_sweep() function")
    base = getattr(module, "BASE", None)
    if base is None and callable(getattr(module, "get_config", None)):
        base = path
    if base is not None and not isinstance(base, str):
        raise ValueError(f"{path}: BASE={base!r} must be a config spec string 'FILE[:ARG]'")
    try:
        points = module.get_sweep()
    except Exception as e:  # the study's own code, or a sweep helper refusing its arguments
        raise ValueError(
            f"study file {path!r}: get_sweep() raised {config_utils.describe_error(e, path)}"
        ) from e
    if not isinstance(points, list | tuple):
        raise ValueError(
            f"study file {path!r}: get_sweep() returned a {type(points).__name__}; allowed: a "
            "list of sweep.Point, as sweep.product, sweep.zip_, sweep.seeds, ... return"
        )
    bad = next((p for p in points if not isinstance(p, Point)), None)
    if bad is not None:
        raise ValueError(
            f"study file {path!r}: get_sweep() returned a {type(points).__name__} with an "
            f"element {config_utils.short(bad)} ({type(bad).__name__}); allowed: sweep.Point "
            "elements only (combine sweeps with sweep.product, sweep.zip_ or +)"
        )
    try:
        runs = expand(points, base)
    except (ValueError, TypeError) as e:
        raise ValueError(f"study file {path!r}: {config_utils.one_line(str(e))}") from e
    return Study(os.path.splitext(os.path.basename(path))[0], path, base, runs)


def resolve(spec: str, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """The full config of a run: the base config with checked overrides.

    Also parses the run's command-line overrides the way train.py does and checks that they
    give the same config, so the resolved config is the one the run trains with.

    Args:
      spec: base config spec "FILE[:ARG]".
      overrides: dotted key -> value.

    Returns:
      The locked config.
    """
    config = apply_overrides(load_config(spec), overrides)
    try:
        via_flags = parse_command_config(spec, override_args(overrides))
    except Exception as e:  # absl wraps parse errors in several types
        raise ValueError(
            f"{spec} with {override_args(overrides)} does not parse on the command line: {e}"
        ) from None
    diff = config_diff(config.to_dict(), via_flags.to_dict())
    if diff:
        raise ValueError(f"{spec}: overrides do not survive the command line; differences: {diff}")
    return config


def check_config(config: ml_collections.ConfigDict) -> None:
    """train.py's start-up checks of a resolved config that need no device, model or compile
    (`experiment.build(config, check_only=True)`), so a sweep can check every run before any
    starts.

    Left to the run itself: what depends on the devices it gets (the mesh size against the
    device count, the batch split over a data axis of -1, the memory estimate) and on the
    process count of multi-process runs.

    Raises:
      ValueError, KeyError: the message `experiment.build` gives, naming the field and what
        is allowed.
    """
    experiment.build(config, check_only=True)


def config_json(config: ml_collections.ConfigDict) -> str:
    """The config as sorted, indented JSON (tuples become lists)."""
    return json.dumps(json.loads(config.to_json()), indent=2, sort_keys=True)


def config_diff(a: Mapping, b: Mapping, ignore: Iterable[str] = ()) -> list[str]:
    """["key: A -> B", ...] for dotted keys whose values differ (tuples equal lists)."""
    fa, fb = flatten(a), flatten(b)
    ignore = set(ignore)
    out = []
    for k in sorted(set(fa) | set(fb)):
        if k in ignore:
            continue
        va, vb = _plain(fa.get(k, "<missing>")), _plain(fb.get(k, "<missing>"))
        if va != vb:
            out.append(f"{k}: {va!r} -> {vb!r}")
    return out


def same_value(a: Any, b: Any) -> bool:
    """Whether two config values are equal as `config_diff` compares them (tuples equal lists)."""
    return _plain(a) == _plain(b)


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value
