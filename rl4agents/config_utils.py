"""Configs and command lines: config sections from registries, config files, overrides,
the checks every field gets at start-up, and the scripts' flag parsing and `--help`.

Every registered variant (environment, credit estimator, policy loss) gets a config section
whose fields are the keyword defaults of its function, so the registry is the only list of
names and the only source of defaults. This module knows no component: the registries of the
variant sections are found through `registry.for_section`, and the code that resolves a field
from a table of its own declares the field's choices (`declare_choices`). Building a run from
a config is `train.resolve`; expanding a study into runs is `sweep`.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib.util
import inspect
import os
import re
import sys
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import ml_collections
from absl import flags
from ml_collections import config_flags

from rl4agents import checks
from rl4agents.registry import for_section, signature_defaults  # noqa: F401 (signature_defaults)


def section(registry: Any, name: str) -> ml_collections.ConfigDict:
    """The config section of variant `name` of a registry (`envs.registry`, `credit`,
    `losses`: each has `get(name)` and `defaults(name)`): its defaults, by field.

    A default of None becomes a placeholder typed by the function's annotation (`float |
    None` -> float): ml_collections' command-line parser refuses to override a field whose
    type is NoneType, so `--config.loss.ppo_clip.agg_scale=4` needs the type. Its value stays
    None.
    """
    hints = _type_hints(registry.get(name))
    out = ml_collections.ConfigDict()
    for field, value in registry.defaults(name).items():
        kind = _optional_type(hints.get(field)) if value is None else None
        out[field] = ml_collections.config_dict.placeholder(kind) if kind else value
    return out


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    fn = getattr(fn, "func", fn)  # functools.partial
    try:
        return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except Exception:  # an annotation that does not resolve: no types, no placeholders
        return {}


def _optional_type(hint: Any) -> type | None:
    """`T` of an annotation `T | None` with T in bool/int/float/str, else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and args[0] in (bool, int, float, str):
        return args[0]
    return None


def split_none_overrides(argv: list[str], flag: str = "config") -> tuple[list[str], list[str]]:
    """Takes the `--{flag}.KEY=None` (or `--{flag}.KEY None`) overrides out of a command line.

    ml_collections parses no None from the command line, so a field whose "off" value is
    None (`loss.value_clip`, `loss.ppo_clip.dual_clip_c`) could not be turned off there. The
    caller parses the rest and then sets these KEYs to None (`set_none`). As with any
    override, the last one of a key wins: a None followed by another override of its key is
    dropped; other overrides are left for absl, which applies them before the None.
    Arguments after "--" are not flags.

    Returns:
      (argv without the None overrides, the KEYs whose last override is None).
    """
    prefix = f"--{flag}."
    spans = []  # (start, end, key, is None) of each override
    i = 1
    while i < len(argv) and argv[i] != "--":
        key, eq, value = argv[i][len(prefix) :].partition("=")
        if argv[i].startswith(prefix):
            two_token = not eq and i + 1 < len(argv) and argv[i + 1] == "None"
            spans.append((i, i + 1 + two_token, key, two_token or value == "None"))
            i += two_token
        i += 1
    last = {key: none for _, _, key, none in spans}
    drop = {j for start, end, _, none in spans if none for j in range(start, end)}
    return [a for j, a in enumerate(argv) if j not in drop], [k for k, none in last.items() if none]


# Fields of configs/base.py whose "off" value is None (the range table `RANGES` allows None
# for exactly these).
NULLABLE_FIELDS = ("loss.value_clip",)


def nullable(key: str) -> bool:
    """Whether the dotted config field `key` takes None: one of `NULLABLE_FIELDS`, or a
    parameter of a registered environment, credit estimator or policy loss annotated
    `T | None` (`env.sokoban.carve_steps`, `loss.ppo_clip.dual_clip_c`)."""
    if key in NULLABLE_FIELDS:
        return True
    parts = key.split(".")
    if len(parts) != 3:
        return False
    section, name, field = parts
    registry = for_section(section)
    if registry is None or name not in registry:
        return False
    hint = _type_hints(registry.get(name)).get(field)
    return type(None) in typing.get_args(hint)


def set_none(config: ml_collections.ConfigDict, keys: Iterable[str]) -> None:
    """Sets each dotted KEY of `config` to None (`split_none_overrides`).

    Raises:
      KeyError: a KEY that is no field of `config`.
      ValueError: a field that does not take None (`nullable`).
    """
    for key in keys:
        *path, field = key.split(".")
        node = config
        for part in path:
            node = node[part]
        if not isinstance(node, ml_collections.ConfigDict) or field not in node:
            raise KeyError(key)
        if isinstance(node[field], ml_collections.ConfigDict):
            raise ValueError(f"--config.{key}=None: {key!r} is a config section, not a field")
        if not nullable(key):
            raise ValueError(
                f"--config.{key}=None: {key} does not take None; allowed: a value of its type "
                f"({type(node[field]).__name__}, default {node[field]!r})"
            )
        node[field] = None


INT32_MAX = 2**31 - 1  # step counters, sizes and other integers are int32 on the device
SEED_MAX = 2**32 - 1  # a PRNG seed is 32 bits: a larger one would silently wrap
# Upper bounds of the model's size fields: far above any model this project can train (the
# largest open models have ~126 layers and a width of 16384), so that an absurd value is
# refused at once rather than after minutes of building a model the memory check refuses.
SIZE_LIMITS = {
    "model.num_layers": 1024,
    "model.d_model": 1 << 17,
    "model.d_ff": 1 << 20,
    "model.num_heads": 1024,
    "model.num_kv_heads": 1024,
    "model.head_dim": 4096,
}


def leaves(config: ml_collections.ConfigDict | Mapping) -> dict[str, tuple[Any, type | None]]:
    """Dotted key -> (value, declared type) of every field of a (nested) config.

    The type is the field's own in a ConfigDict (float for a None placeholder of a float
    field), else the value's type (None for a None value in a plain dict).
    """
    out = {}
    for k, v in config.items():
        if isinstance(v, ml_collections.ConfigDict | Mapping):
            out.update({f"{k}.{kk}": vv for kk, vv in leaves(v).items()})
            continue
        kind = type(v) if v is not None else None
        if isinstance(config, ml_collections.ConfigDict) and v is None:
            try:  # a None placeholder keeps its type; a field set to None has none
                kind = config.get_ref(k).get_type()
            except ValueError:
                kind = None
        out[str(k)] = (v, kind)
    return out


def is_seed(key: str) -> bool:
    """Whether the dotted field `key` is a PRNG seed (`seed`, `train.eval_seed`)."""
    return "seed" in key.rsplit(".", 1)[-1]


def check_value(key: str, value: Any) -> None:
    """The checks every field gets, whatever its section (`check_values`), of one value:
    a float is finite; a seed is in [0, 2**32 - 1]; any other integer fits int32 and a model
    size is at most its `SIZE_LIMITS` entry. Tuples and lists are checked entry by entry.

    Raises:
      ValueError: one line, "{key}={value!r}; allowed: ...".
    """
    if isinstance(value, tuple | list):
        for v in value:
            try:
                check_value(key, v)
            except ValueError as e:
                allowed = str(e).split("; allowed: ", 1)[-1]
                raise ValueError(f"{key}={value!r}; allowed: entries each {allowed}") from None
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float):
        checks.check_range(key, value)  # "allowed: a finite number"
    elif is_seed(key):
        checks.check_range(key, value, 0, SEED_MAX, note="(a 32-bit seed)")
    elif key in SIZE_LIMITS:
        checks.check_range(key, value, high=SIZE_LIMITS[key], note="(a model size)")
    elif value > INT32_MAX:  # one bound in words: the field's own range is its caller's
        checks.check_range(key, value, high=INT32_MAX, note="(a 32-bit integer)")
    else:
        checks.check_range(key, value, low=-INT32_MAX - 1, note="(a 32-bit integer)")


def check_values(config: ml_collections.ConfigDict) -> None:
    """The checks every field of a config gets, whatever its section: base sections, the
    variant sections made from signatures (`section`) and environment arguments alike.

    Each leaf goes through `check_value` (floats finite, seeds 32 bits, integers int32, model
    sizes bounded); then the optimizer's step count, train.num_steps x train.epochs x
    train.minibatches, must fit int32 (its schedule counts in int32). Field-specific ranges are
    the callers' (`experiment.check_ranges`, the registries' `validate`).

    Raises:
      ValueError: one line naming the field, its value and what is allowed.
    """
    for key, (value, _) in leaves(config).items():
        check_value(key, value)
    train = config.get("train", {})
    if all(k in train for k in ("num_steps", "epochs", "minibatches")):
        total = train.num_steps * train.epochs * train.minibatches
        if total > INT32_MAX:
            raise ValueError(
                f"train.num_steps={train.num_steps} x train.epochs={train.epochs} x "
                f"train.minibatches={train.minibatches} = {total} optimizer steps; allowed: "
                f"at most {INT32_MAX} (the step counter is int32)"
            )


def check_choice(field: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; allowed: {allowed}")


def to_dict(section: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    return section.to_dict() if isinstance(section, ml_collections.ConfigDict) else dict(section)


# Ranges of the scalar fields of the base config (`checks.check_range` arguments after the
# value): each is checked at start-up, before anything is built or written.
RANGES: dict[str, dict[str, Any]] = {
    "train.num_steps": dict(low=1),
    "train.epochs": dict(low=1),
    "train.minibatches": dict(low=1),
    "train.grad_accum": dict(low=1),
    "train.eval_every": dict(low=1),
    "train.eval_tasks": dict(low=1),
    "train.final_eval_tasks": dict(low=0, note="(0 = train.eval_tasks)"),
    "train.max_minutes": dict(low=0, note="(0 = no limit)"),
    "train.ood_max_turns": dict(low=0, note="(0 = rollout.max_turns)"),
    "checkpoint.every": dict(low=1),
    "checkpoint.max_to_keep": dict(low=1),
    "log.every": dict(low=1),
    "optim.lr": dict(low=0, low_open=True),
    "optim.b1": dict(low=0, high=1, high_open=True),
    "optim.b2": dict(low=0, high=1, high_open=True),
    "optim.grad_clip": dict(low=0, note="(0 = off)"),
    "optim.weight_decay": dict(low=0),
    "optim.warmup_steps": dict(low=0),
    "model.d_model": dict(low=0, note="(0 = the preset's)"),
    "model.num_layers": dict(low=0, note="(0 = the preset's)"),
    "model.d_ff": dict(low=0, note="(0 = the preset's)"),
    "model.num_heads": dict(low=0, note="(0 = the preset's)"),
    "model.num_kv_heads": dict(low=0, note="(0 = the preset's)"),
    "model.head_dim": dict(low=0, note="(0 = the preset's)"),
    "rollout.num_tasks": dict(low=1),
    "rollout.group_size": dict(low=1),
    "rollout.max_turns": dict(low=1),
    "rollout.max_action_len": dict(low=1),
    "rollout.temperature": dict(low=0, low_open=True),
    "rollout.turn_groups": dict(low=1),
    "rollout.max_episode_tokens": dict(low=0, note="(0 = none)"),
    "rollout.top_k": dict(low=0, note="(0 = off)"),
    "rollout.top_p": dict(low=0, high=1, low_open=True),
    "rollout.max_context_len": dict(low=0, note="(0 = fit all K turns)"),
    "loss.value_coef": dict(low=0),
    # 0 would clip V to V_old: the critic could not learn. None turns the clipping off.
    "loss.value_clip": dict(low=0, low_open=True, allow_none=True, note="(None = no clipping)"),
    "loss.kl_coef": dict(low=0),
    "loss.entropy_coef": dict(low=0),
    "loss.echo_coef": dict(low=0),
    "loss.tis_cap": dict(low=0, note="(0 = off, else >= 1)"),
    "loss.kl_target": dict(low=0, low_open=True),
    "loss.kl_horizon": dict(low=0, low_open=True),
    "shaping.overlong_buffer": dict(low=0, note="(0 = off)"),
    "shaping.overlong_factor": dict(low=0),
    "sampling.max_gen_batches": dict(low=1),
    "mesh.device_memory_gb": dict(low=0, note="(0 = what the runtime reports)"),
}


def check_ranges(c: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first field of `RANGES` outside its range, then the
    first field anywhere that fails the checks of every field (`config_utils.check_values`:
    finite floats, 32-bit seeds, int32 integers, bounded model sizes)."""
    for dotted, bounds in RANGES.items():
        section, field = dotted.split(".")
        if section in c and field in c[section]:
            checks.check_range(dotted, c[section][field], **bounds)
    check_values(c)


def split_spec(spec: str) -> tuple[str, str | None]:
    """ "FILE[:ARG]" -> (FILE, ARG or None), as ml_collections' config_flags splits it."""
    path, _, arg = spec.partition(":")
    return path, (arg or None)


def load_module(path: str, prefix: str):
    """Import the Python file at `path` as a module named after `prefix` and its path."""
    name = f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', os.path.abspath(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as `import` does; dataclasses in the file need it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_error(e: BaseException, path: str) -> str:
    """An exception raised by a user's file (a study or config) as one line: its type and
    message; for a syntax error the line (and the file, when it is not `path`)."""
    if isinstance(e, SyntaxError):
        where = f"line {e.lineno}"
        if e.filename and os.path.abspath(e.filename) != os.path.abspath(path):
            where = f"{e.filename}, {where}"
        return f"{type(e).__name__}: {e.msg} ({where})"
    text = one_line(str(e))
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Calls `get_config(ARG)` (or `get_config()`) of the file in "FILE[:ARG]"."""
    path, arg = split_spec(spec)
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} (from {spec!r}) does not exist")
    try:
        module = load_module(path, "rl4agents_config")
        config = module.get_config(arg) if arg is not None else module.get_config()
    except Exception as e:  # the config file's own code
        raise ValueError(f"config file {path!r} (from {spec!r}): {describe_error(e, path)}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"{spec}: get_config() returned {type(config).__name__}, not ConfigDict")
    config.lock()
    return config


def flatten(config: ml_collections.ConfigDict | Mapping, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value of a (nested) config or dict."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, ml_collections.ConfigDict | Mapping):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def suggest(key: str, known: Iterable[str]) -> list[str]:
    """Up to 5 known dotted keys close to `key` (whole key or last component)."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.8)
    last = key.rsplit(".", 1)[-1]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in known}
    tails = difflib.get_close_matches(last, list(by_leaf), n=3, cutoff=0.75)
    close += [k for k in known if k.rsplit(".", 1)[-1] in tails]
    return list(dict.fromkeys(close))[:5]


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted overrides applied, each key and type checked.

    Raises:
      ValueError: an unknown key (with close known keys), a section set to a value, or a value
        whose type does not fit the field (bools only for bool fields, int only widens to
        float, sequences only for tuple fields).
    """
    config = copy.deepcopy(config)  # keeps the lock
    leaves = flatten(config)
    for key, value in overrides.items():
        if key not in leaves:
            if any(k.startswith(key + ".") for k in leaves):
                fields = sorted(k for k in leaves if k.startswith(key + "."))[:5]
                raise ValueError(f"{key!r} is a config section, not a field; e.g. {fields}")
            close = suggest(key, leaves)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"unknown config key {key!r}{hint}")
        old = leaves[key]
        if value is None and not nullable(key):
            raise ValueError(f"{key}=None: the field does not take None (default {old!r})")
        if value is not None and not _fits(old, value):
            raise ValueError(
                f"{key}={value!r} has type {type(value).__name__}; the field's type is "
                f"{type(old).__name__} (default {old!r})"
            )
        *path, field = key.split(".")
        node = config
        for p in path:
            node = node[p]
        try:
            node[field] = tuple(value) if isinstance(value, list) else value
        except TypeError as e:
            raise ValueError(f"{key}={value!r}: {e}") from None
    return config


def _fits(old: Any, value: Any) -> bool:
    if old is None:
        return True
    if isinstance(old, bool) or isinstance(value, bool):
        return isinstance(old, bool) and isinstance(value, bool)
    if isinstance(old, float):
        return isinstance(value, int | float)
    if isinstance(old, tuple):
        return isinstance(value, tuple | list)
    return isinstance(value, type(old))


def format_value(value: Any) -> str:
    """A value as `--config.KEY=VALUE` text that ml_collections' config_flags parses back."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple | list):
        return repr(tuple(value))
    return str(value)


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """["--config.KEY=VALUE", ...] for train.py."""
    return [f"--config.{k}={format_value(v)}" for k, v in overrides.items()]


def parse_command_config(spec: str, args: Sequence[str]) -> ml_collections.ConfigDict:
    """The config train.py builds from `--config=spec` and override `args`, via config_flags."""
    argv, none_keys = split_none_overrides(["train.py", f"--config={spec}", *args])
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file(
        "config", None, flag_values=values, lock_config=True, sys_argv=argv
    )
    with warnings.catch_warnings():  # config_flags loads the file with the deprecated API
        warnings.simplefilter("ignore", DeprecationWarning)
        values(argv)
    set_none(holder.value, none_keys)
    return holder.value


def fail(message: str) -> NoReturn:
    """A script's refusal of bad input: one line, `error: {message}`, on stderr; exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a bad argument refused in one line (`fail`), no usage text."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def one_line(text: str) -> str:
    """A multi-line message as one line: its non-blank lines, stripped, joined by "; "."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _nearest_existing(path: str) -> str:
    """The longest prefix of the absolute `path` that exists."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return existing


def check_output_file(flag: str, path: str) -> None:
    """Refuses (`fail`) an output `path` that is empty, a directory, or whose nearest existing
    folder is a file: a file path whose missing folders can be created is allowed."""
    existing = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not path or os.path.isdir(path) or not os.path.isdir(existing):
        fail(f"{flag}={path!r}; allowed: a file path (its missing folders are created)")


def check_workdir(flag: str, path: str) -> None:
    """Refuses (`fail`) a run folder `path` that is empty, a file, under a file, or whose
    nearest existing folder this process cannot write: a folder that exists or can be made."""
    existing = _nearest_existing(path)
    allowed = "allowed: a folder that exists or can be created, writable by this process"
    if not path:
        fail(f"{flag}=''; {allowed}")
    if not os.path.isdir(existing):
        what = (
            "is a file" if existing == os.path.abspath(path) else f"is under the file {existing!r}"
        )
        fail(f"{flag}={path!r} {what}; {allowed}")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"{flag}={path!r}: {existing!r} is not writable; {allowed}")


def _flags_error_line(e: Exception) -> str:
    """absl's multi-line flag error (a wrong type, an unknown or missing flag, a config file
    whose `get_config` raised) as one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
    if "Error whilst parsing config file" in lines[0]:  # get_config() raised: keep its message
        lines = [lines[0].split(" Error whilst")[0] + " " + lines[-1]]
    return "; ".join(line.removeprefix("flag ").removeprefix("ERROR:: ") for line in lines)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = "configs/base.py"  # the config `--help` lists when no --config is given
HELP_FLAGS = ("-h", "-?", "-help", "--help", "--helpshort", "--helpfull")


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """The config of `--config=FILE[:ARG]`, made as ml_collections' config flag makes it
    (FILE imported, then `get_config(ARG)`, or `get_config()` without ":ARG").

    Raises:
      ValueError: one line naming the file and what went wrong: "config file 'x.py' failed to
        import: SyntaxError: expected ':' (line 3)"; "config file 'x.py': get_config('a')
        raised RuntimeError: ..."; "... get_config() returned None; allowed: ...".
    """
    path, *arg = spec.split(":", 1)
    try:
        module = load_module(path, "rl4agents_config")
    except Exception as e:  # the config file's own code
        raise ValueError(f"config file {path!r} failed to import: {describe_error(e, path)}") from e
    allowed = "allowed: a file whose get_config(arg=None) returns an ml_collections.ConfigDict"
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"config file {path!r} defines no get_config; {allowed}")
    call = f"get_config({arg[0]!r})" if arg else "get_config()"
    try:
        config = module.get_config(*arg)
    except Exception as e:
        raise ValueError(f"config file {path!r}: {call} raised {describe_error(e, path)}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"config file {path!r}: {call} returned {_kind(config)}; {allowed}")
    return config


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _wants_help(argv: list[str]) -> bool:
    args = argv[1:]
    return any(a in HELP_FLAGS for a in args[: args.index("--") if "--" in args else None])


def _flag_lines(config_flag: str | None) -> list[str]:
    """One line per flag of the running script (its own, the config flag, --flagfile)."""
    fv = flags.FLAGS
    own = list(fv.get_key_flags_for_module(sys.argv[0]))
    if config_flag and config_flag in fv and fv[config_flag] not in own:
        own.insert(0, fv[config_flag])
    lines = []
    for f in own:
        if f.name == config_flag:
            text = (
                f"--{f.name}=FILE[:ARG]: {f.help} A file such as configs/frozen_lake.py; ARG "
                f"is passed to its get_config. --{f.name}.KEY=VALUE overrides one key (below)."
            )
        else:
            text = f"--{f.name}: {f.help}"
            values = getattr(f.parser, "enum_values", None)
            if values:
                text += f" One of {list(values)}."
            required = any("other than None" in getattr(v, "message", "") for v in f.validators)
            text += " (required)" if required else f" (default: {f.default_as_str or 'none'})"
        lines.append("  " + text)
    lines.append("  --flagfile=FILE: read flags (one per line) from FILE, in place")
    lines.append("  --help: this help, then exit")
    return lines


# Allowed values of the config's fields that name a choice. The variant fields (env.name,
# credit.name, loss.policy) list their registry's names (`registry.for_section`); the code that
# resolves another field with a table of its own declares it (`declare_choices`).
_CHOICES: dict[str, list[Any]] = {
    "env.vocab": ["builtin", "minimal"],
    "model.value_head": ["none", "shared", "separate"],
    "model.dtype": ["float32", "bfloat16"],
    "model.param_dtype": ["float32", "bfloat16"],
    "rollout.context": ["full", "window"],
    "loss.kl_ctrl": ["fixed", "adaptive"],
    "loss.tis_mode": ["token", "sequence"],
    "shaping.overlong_per": ["turn", "episode"],
    "optim.schedule": ["constant", "cosine"],
    "mesh.axis_types": ["auto", "explicit"],
    "sft.keep": ["success", "all"],
    "init.critic": ["fresh", "policy"],
    "model.chat": ["auto", "on", "off"],
}
_VARIANT_FIELDS = {"env.name": "env", "credit.name": "credit", "loss.policy": "loss"}


def declare_choices(key: str, values: Iterable[Any]) -> None:
    """Declare the allowed values of the dotted field `key` (for `choices` and --help)."""
    _CHOICES[key] = list(values)


def choices() -> dict[str, list[Any]]:
    """The allowed values of the config's fields that name a choice (the registries' names
    for the variant fields), as start-up checks them (`resolve`, scripts/sft.py)."""
    out = {}
    for key, section in _VARIANT_FIELDS.items():
        registry = for_section(section)
        if registry is not None:
            out[key] = registry.names()
    return {**out, **_CHOICES}


def describe_allowed(key: str, value: Any, kind: type | None) -> str:
    """What the field `key` (of type `kind`, holding `value`) allows, in words, for --help:
    its choices, its range (`experiment.check_ranges`, `check_values`) or its type."""
    if key in choices():
        return f"one of {choices()[key]}"
    bounds = dict(RANGES.get(key, {}))
    note, allow_none = bounds.pop("note", ""), bounds.pop("allow_none", False)
    if kind in (list, tuple):
        text = "a tuple" if kind is tuple else "a list"
    elif kind is bool:
        text = "True or False"
    elif kind is str:
        text = "a string"
    elif is_seed(key):
        text, note = f"an integer {checks.describe_range(0, SEED_MAX)}", "(a 32-bit seed)"
    elif kind is int:
        bounds.setdefault("high", SIZE_LIMITS.get(key, INT32_MAX))
        text = "an integer " + checks.describe_range(**bounds)
    elif kind is float:
        text = "a finite number" + (f" {checks.describe_range(**bounds)}" if bounds else "")
    else:
        text = f"a {type(value).__name__}"
    if allow_none or nullable(key):
        text += " or None"
    return f"{text} {note}".strip()


def help_text(spec: str | None, config_flag: str | None = "config") -> str:
    """The `--help` of the running script: its docstring, its flags and, for a script with a
    config flag, every config key of `spec` (FILE[:ARG]; `DEFAULT_CONFIG` if None) with its
    default and what it allows.

    Raises:
      ValueError: the config file does not load (`load_config_file`).
    """
    doc = (getattr(sys.modules.get("__main__"), "__doc__", None) or "").strip("\n")
    out = (
        [doc, "", "flags:", *_flag_lines(config_flag)]
        if doc
        else ["flags:", *_flag_lines(config_flag)]
    )
    if config_flag is None:
        return "\n".join(out)
    if spec is None:
        path = os.path.join(_ROOT, DEFAULT_CONFIG)
        if not os.path.isfile(path):
            return "\n".join(out)
        config, spec = load_config_file(path), DEFAULT_CONFIG
    else:
        config = load_config_file(spec)
    out += [
        "",
        f"config keys of {spec} (--{config_flag}=FILE[:ARG] --help lists that file's): "
        f"KEY = default  (allowed); override with --{config_flag}.KEY=VALUE",
    ]
    for key, (value, kind) in leaves(config).items():
        out.append(f"  {key} = {value!r}  ({describe_allowed(key, value, kind)})")
    return "\n".join(out)


def _print_help(spec: str | None, config_flag: str | None) -> NoReturn:
    try:
        text = help_text(spec, config_flag)
    except ValueError as e:
        fail(str(e))
    print(text)
    sys.exit(0)


def parse_plain_flags(argv: list[str]) -> list[str]:
    """absl flag parsing for `app.run(main, flags_parser=parse_plain_flags)`: a flag error is
    one line and exit status 2 (`fail`), not absl's FATAL message and help hint."""
    if _wants_help(argv):
        _print_help(None, None)
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


def define_config_flag(
    help_text: str = "Config file.", name: str = "config", lock_config: bool = True
) -> flags.FlagHolder:
    """`config_flags.DEFINE_config_file(name, None, help_text, lock_config)`, for a script
    parsed by `parse_flags`.

    ml_collections reads the command line's flag files when the flag is defined, at import:
    a `--flagfile` that does not open is refused there in one line (`fail`) rather than with
    absl's traceback.
    """
    try:
        flags.FLAGS.read_flags_from_files(sys.argv[1:], force_gnu=False)
    except flags.Error as e:
        fail(_flags_error_line(e))
    return config_flags.DEFINE_config_file(name, None, help_text, lock_config=lock_config)


def parse_flags(argv: list[str], flag: str = "config") -> list[str]:
    """absl flag parsing for a script with a config flag: `app.run(main,
    flags_parser=parse_flags)`.

    Every bad command line is refused in one line with exit status 2 (`fail`):
    - a `--config=FILE[:ARG]` whose FILE does not exist (checked before absl loads it);
    - a `--config.KEY=VALUE` override naming no field of the config (ml_collections raises
      from inside absl's parser, with chained tracebacks): the line names the override, the
      close known keys and the keys allowed where it points;
    - absl's own flag errors (a value of the wrong type, an unknown or missing flag, a config
      file whose `get_config` raises);
    - a `--config.KEY=None` for a field that does not take None (`nullable`); where it does,
      the field is set to None after absl's parse (`split_none_overrides`).
    `--flagfile=F` arguments are expanded in place first, so all of this holds for the lines
    of a flag file too.

    Args:
      argv: the command line (argv[0] is the program).
      flag: the config flag's name.

    Returns:
      The arguments absl leaves for `main`.
    """
    try:  # flag files first, so their overrides are seen as the command line's own
        argv = [*argv[:1], *flags.FLAGS.read_flags_from_files(argv[1:], force_gnu=False)]
    except flags.Error as e:
        fail(_flags_error_line(e))
    spec = _config_spec(argv, flag)
    if spec is not None:
        path = spec.split(":", 1)[0]
        if not os.path.isfile(path):
            fail(
                f"--{flag}={spec!r}: no config file {path!r}; allowed: a file such as "
                "configs/frozen_lake.py, with an optional ':ARG'"
            )
        try:  # the file's own failures in one line, before absl loads it (with a traceback)
            load_config_file(spec)
        except ValueError as e:
            fail(str(e))
    if _wants_help(argv):
        _print_help(spec, flag)
    rest, none_keys = split_none_overrides(argv, flag)
    try:
        remaining = flags.FLAGS(rest)
        set_none(flags.FLAGS[flag].value, none_keys)
    except (AttributeError, KeyError) as e:
        fail(_unknown_override(argv, flag) or str(e))
    except ValueError as e:  # set_none: a field that does not take None
        fail(str(e))
    except flags.Error as e:
        fail(_flags_error_line(e))
    try:  # the checks of every field, before the script does any work
        check_ranges(flags.FLAGS[flag].value)
    except ValueError as e:
        fail(str(e))
    return remaining


def _unknown_override(argv: list[str], flag: str) -> str | None:
    """The message for the first `--flag.KEY=...` whose KEY is no field of the `--flag=SPEC`
    config (loaded and matched as `scripts/sweep.py` does), or None if none is found."""
    spec = _config_spec(argv, flag)
    try:
        leaves = flatten(load_config(spec))
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
        close = suggest(key, leaves)
        msg = f"unknown config key {key!r} (from {arg})"
        if close:
            msg += f"; did you mean {' or '.join(map(repr, close))}?"
        return msg + f" allowed in {section or 'the config'!r}: {allowed}"
    return None
