"""Helpers that build config sections from registries and validate a config at start-up.

Every registered variant (environment, credit estimator, policy loss) gets a config section
whose fields are the keyword defaults of its function, so the registry is the only list of
names and the only source of defaults.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import ml_collections
from absl import flags

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


def fail(message: str) -> NoReturn:
    """A script's refusal of bad input: one line, `error: {message}`, on stderr; exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a bad argument refused in one line (`fail`), no usage text."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def check_output_file(flag: str, path: str) -> None:
    """Refuses (`fail`) an output `path` that is a directory, or whose nearest existing folder
    is a file: a file path whose missing folders can be created is allowed."""
    existing = os.path.dirname(os.path.abspath(path))  # the part of its folder that exists
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(path) or not os.path.isdir(existing):
        fail(f"{flag}={path!r}; allowed: a file path (its missing folders are created)")


def _flags_error_line(e: Exception) -> str:
    """absl's multi-line flag error (a wrong type, an unknown or missing flag, a config file
    whose `get_config` raised) as one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
    if "Error whilst parsing config file" in lines[0]:  # get_config() raised: keep its message
        lines = [lines[0].split(" Error whilst")[0] + " " + lines[-1]]
    return "; ".join(line.removeprefix("flag ") for line in lines)


def parse_plain_flags(argv: list[str]) -> list[str]:
    """absl flag parsing for `app.run(main, flags_parser=parse_plain_flags)`: a flag error is
    one line and exit status 2 (`fail`), not absl's FATAL message and help hint."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(_flags_error_line(e))


def _config_spec(argv: list[str], flag: str) -> str | None:
    """The FILE[:ARG] of `--flag=FILE[:ARG]` or `--flag FILE[:ARG]` (the last one given)."""
    spec = None
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith(f"--{flag}="):
            spec = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(argv):
            spec = argv[i + 1]
    return spec


def parse_flags(argv: list[str], flag: str = "config") -> list[str]:
    """absl flag parsing for a script with a config flag: `app.run(main,
    flags_parser=parse_flags)`.

    Every bad command line is refused in one line with exit status 2 (`fail`):
    - a `--config=FILE[:ARG]` whose FILE does not exist (checked before absl loads it);
    - a `--config.KEY=VALUE` override naming no field of the config (ml_collections raises
      from inside absl's parser, with chained tracebacks): the line names the override, the
      close known keys and the keys allowed where it points;
    - absl's own flag errors (a value of the wrong type, an unknown or missing flag, a config
      file whose `get_config` raises).

    Args:
      argv: the command line (argv[0] is the program).
      flag: the config flag's name.

    Returns:
      The arguments absl leaves for `main`.
    """
    spec = _config_spec(argv, flag)
    if spec is not None:
        path = spec.split(":", 1)[0]
        if not os.path.isfile(path):
            fail(
                f"--{flag}={spec!r}: no config file {path!r}; allowed: a file such as "
                "configs/frozen_lake.py, with an optional ':ARG'"
            )
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        fail(_unknown_override(argv, flag) or str(e))
    except flags.Error as e:
        fail(_flags_error_line(e))


def _unknown_override(argv: list[str], flag: str) -> str | None:
    """The message for the first `--flag.KEY=...` whose KEY is no field of the `--flag=SPEC`
    config (loaded and matched as `scripts/sweep.py` does), or None if none is found."""
    from rl4agents import sweep  # its config loader and key suggestions; imports this module

    spec = _config_spec(argv, flag)
    try:
        leaves = sweep.flatten(sweep.load_config(spec))
    except Exception:  # no spec, or a file that does not load: absl's own message stands
        return None
    prefix = f"--{flag}."
    for arg in argv[1:]:
        key = arg.split("=", 1)[0][len(prefix) :] if arg.startswith(prefix) else None
        if key is None or key in leaves:
            continue
        parts = key.split(".")
        depth = 0  # the deepest section of the config that the key's path reaches
        while depth < len(parts) - 1 and any(
            k.startswith(".".join(parts[: depth + 1]) + ".") for k in leaves
        ):
            depth += 1
        section = ".".join(parts[:depth])
        inside = [k[len(section) + 1 :] for k in leaves if k.startswith(section + ".")]
        allowed = sorted({k.split(".")[0] for k in (inside if section else leaves)})
        close = sweep.suggest(key, leaves)
        msg = f"unknown config key {key!r} (from {arg})"
        if close:
            msg += f"; did you mean {' or '.join(map(repr, close))}?"
        return msg + f" allowed in {section or 'the config'!r}: {allowed}"
    return None
