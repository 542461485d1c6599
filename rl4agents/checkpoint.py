"""Checkpoints: a thin wrapper over Orbax's `CheckpointManager` plus the run's config.

Layout of a checkpoint directory:

    directory/config.json      the resolved config of the first run that saved a step
    directory/<step>/...        one Orbax checkpoint per saved step (atomic: temp dir + rename)
    directory/<step>/checksums.sha256   the sha256 of every other file of the step

Saves are asynchronous: `save` returns once the arrays are copied off the device, and
`wait()` blocks until the files are committed. A save that fails in the background (a full
disk, an unwritable folder) raises `CheckpointError` from the next `save`, `wait` or `close`.
Restores always go through an abstract target (shapes, dtypes, shardings), so namedtuples
(optax states) and `flax.struct` dataclasses come back with their Python types and each array
lands on the sharding asked for.

Integrity: once a step's save is committed (at the next `save`, `wait` or `close`), the sha256
of each of its files is written to `<step>/checksums.sha256` (the `sha256sum` format, written
atomically; Orbax lists steps by folder and ignores it). `restore` verifies it first and
refuses a step whose files changed. A step without the file (saved before checksums existed,
or by a run killed between the commit and the checksum) restores unverified.

Failures are one line each: from the first `Checkpointer` on, Orbax's ERROR log records and
the "Event loop is closed" reports of TensorStore callbacks that outlive a failed operation
are dropped process-wide (`_mute_orbax_noise`); each such failure reaches the caller as an
exception.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

_MISSING = object()
CONFIG_NAME = "config.json"
# A top-level key of a stored config: {dotted compat key: [accepted values]}. A run is
# compatible on such a key when its value is one of the list (a multi-task checkpoint
# accepts each environment it was trained on), instead of equal to the stored value.
COMPAT_CHOICES = "compat_choices"
CHECKSUMS_NAME = "checksums.sha256"  # inside each step folder
_MAX_LINES = 12  # per list in an error message
_ORBAX_DIR = os.path.dirname(ocp.__file__)


class CheckpointError(ValueError):
    """A checkpoint save failed (a full disk, an unwritable folder). Its message is one line
    naming the step, the cause and the last good checkpoint, which stays on disk:

        checkpoint save of step 8 failed: [Errno 28] No space left on device; last good
        checkpoint: step 6 (/run/checkpoints/6)
    """


def _lookup(config: dict, dotted: str) -> Any:
    """Returns `config["a"]["b"]` for "a.b", or `_MISSING`."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def params_digest(params: Any) -> str:
    """A short fingerprint of a parameter tree's values: the first 16 hex digits of the sha256
    over its leaves in path order (each leaf's path, dtype, shape and bytes).

    Two trees get the same digest only when every array is bit for bit the same, so it tells
    two builds of one recipe apart (the same command on two processors gives different weights)
    where the checkpoint's path cannot.
    """
    digest = hashlib.sha256()
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        array = np.asarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def with_compat_choices(config_json: str, choices: Mapping[str, list]) -> str:
    """`config_json` with `COMPAT_CHOICES` set: for each dotted key, the values a later run
    may have on it (`Checkpointer.check_compatible` accepts any of them).

    Args:
      config_json: a resolved config as a JSON object string.
      choices: {dotted key: non-empty list of JSON values}, e.g. {"env.name": ["maze",
        "wordle"]}.

    Returns:
      The config as a JSON string (sorted keys, indented) with the choices added.
    """
    config = json.loads(config_json)
    for key, values in choices.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"compat choices for {key!r}: {values!r}; allowed: a non-empty list")
    config[COMPAT_CHOICES] = {key: list(values) for key, values in choices.items()}
    return json.dumps(config, sort_keys=True, indent=2)


def saved_steps(directory: str | os.PathLike) -> list[int]:
    """The committed steps in a checkpoint `directory`, ascending, without starting Orbax
    (an absent directory has none). Orbax commits a step by renaming its temporary folder to
    the step number, so the integer-named folders are exactly the committed steps."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n))
    )


def _first_line(e: BaseException, limit: int = 240) -> str:
    """An exception as one short line (Orbax and TensorStore errors run to dozens of lines)."""
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), repr(e))
    text = text.split(" See full TensorStore details")[0]
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _collect_quietly() -> None:
    """Collects garbage with Python's "Exception ignored in" reports muted: a restore that
    fails on one array leaves Orbax's coroutines for the others unfinished, and their
    collection would print a traceback after the error."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


class _MuteOrbaxErrors(logging.Filter):
    """Drops Orbax's ERROR records (tracebacks of a failed save or restore, dozens of lines
    each, logged from its threads, some after the failure was raised): the failure reaches
    the caller as an exception, which this module turns into one line. Other libraries'
    records and Orbax's warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not record.pathname.startswith(_ORBAX_DIR)


def _closed_loop_report(unraisable: Any) -> bool:
    """Whether an unraisable exception is asyncio's "Event loop is closed": a TensorStore
    read or write still in flight when Orbax's operation failed completes after Orbax closed
    its event loop, and its callback has nowhere to go (nothing is lost: the operation
    already failed)."""
    e = unraisable.exc_value
    return isinstance(e, RuntimeError) and str(e) == "Event loop is closed"


def _mute_orbax_noise() -> None:
    """Installs, once per process, the `_MuteOrbaxErrors` filter on absl's logger (Orbax
    logs through absl) and an unraisable-exception hook dropping `_closed_loop_report`s.
    Process-wide and kept: the reports arrive from Orbax's and TensorStore's threads, also
    after the failing call returned."""
    absl_logger = logging.getLogger("absl")
    if any(isinstance(f, _MuteOrbaxErrors) for f in absl_logger.filters):
        return
    absl_logger.addFilter(_MuteOrbaxErrors())
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _closed_loop_report(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook


def _cause(e: BaseException) -> str:
    """An OS error (raised by Python, or reported by TensorStore as "... [os_error_code=28]")
    as "[Errno 28] No space left on device"; anything else as `_first_line`."""
    for x in (e, e.__cause__, e.__context__):
        if isinstance(x, OSError) and x.errno is not None and x.strerror:
            return f"[Errno {x.errno}] {x.strerror}"
    code = re.search(r"os_error_code='?(\d+)", str(e))
    if code:
        return f"[Errno {code[1]}] {os.strerror(int(code[1]))}"
    return _first_line(e)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _step_files(step_dir: str) -> list[str]:
    """Every file under `step_dir` but the checksum file (and its temporary copies), as
    sorted "/"-separated paths relative to `step_dir`."""
    out = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_dir).replace(os.sep, "/")
            if not rel.startswith(CHECKSUMS_NAME):
                out.append(rel)
    return sorted(out)


def write_checksums(step_dir: str | os.PathLike) -> str:
    """Writes `step_dir/checksums.sha256`: one "<sha256 hex>  <relative path>" line per file
    of a committed step (the `sha256sum` format, so `sha256sum -c` checks it too), atomically
    (a temporary file, fsync, rename).

    Returns:
      The checksum file's path.
    """
    step_dir = os.fspath(step_dir)
    lines = [f"{_sha256(os.path.join(step_dir, rel))}  {rel}\n" for rel in _step_files(step_dir)]
    path = os.path.join(step_dir, CHECKSUMS_NAME)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)
    return path


def verify_checksums(step_dir: str | os.PathLike) -> str | None:
    """Checks the files of a step against its `checksums.sha256`.

    Returns:
      None if every listed file has its recorded sha256, or if the step has no checksum
      file (saved before checksums existed: unverified); else a short description of the
      first problem ("sha256 of default/d/ab12 differs from checksums.sha256").
    """
    step_dir = os.fspath(step_dir)
    path = os.path.join(step_dir, CHECKSUMS_NAME)
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        expected, sep, rel = line.partition("  ")
        if not sep or len(expected) != 64:
            return f"{CHECKSUMS_NAME} has a malformed line {line[:80]!r}"
        file = os.path.join(step_dir, *rel.split("/"))
        if not os.path.isfile(file):
            return f"{rel} listed in {CHECKSUMS_NAME} is missing"
        if _sha256(file) != expected:
            return f"sha256 of {rel} differs from {CHECKSUMS_NAME}"
    return None


def _clip_lines(lines: list[str]) -> list[str]:
    if len(lines) <= _MAX_LINES:
        return lines
    return lines[:_MAX_LINES] + [f"  ... {len(lines) - _MAX_LINES} more"]


def _show(value: Any) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value)


def _path_str(path: tuple) -> str:
    """A key path as Orbax names it: "opt_state.0.mu.w" (namedtuple fields become names)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def _tree_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_path_str(path): _shape(leaf) for path, leaf in leaves}


class Checkpointer:
    """Saves and restores a training-state pytree, and guards against config drift.

    Args:
      directory: where checkpoints and `config.json` live (created if absent).
      max_to_keep: how many most recent checkpoints to keep on disk.
      config_json: the resolved run config as a JSON string.
      compat_keys: dotted config fields ("model.d_model", "env.name") that must match the
        config stored in `directory` by a run that saved a step; a mismatch raises
        `ValueError` before anything is written. A stored config without any saved step (a
        run that failed before its first save) binds nothing and is replaced. A key listed
        in the stored config's `COMPAT_CHOICES` (`with_compat_choices`) matches any of its
        values instead.
      compat_defaults: for compat keys added after a run was saved, the value its stored
        config is taken to have (the one that keeps the behaviour it ran with), so that the
        run still resumes and evaluates: {"loss.kl_ctrl": "fixed"}.
      remedy: the last line of an incompatibility error: what the user can do about it.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int = 3,
        config_json: str,
        compat_keys: tuple[str, ...],
        compat_defaults: Mapping[str, Any] | None = None,
        remedy: str = "Use a new workdir, or restore the stored values of these fields.",
    ):
        self.directory = os.path.abspath(os.fspath(directory))
        self.remedy = remedy
        self.compat_keys = tuple(compat_keys)
        self.compat_defaults = dict(compat_defaults or {})
        self._config = json.loads(config_json)
        self.check_compatible(config_json)
        os.makedirs(self.directory, exist_ok=True)
        self._write_config(config_json, replace=not saved_steps(self.directory))
        self._pending: int | None = None  # the step saved last, not yet checksummed
        _mute_orbax_noise()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
            # An explicit handler lets `item_metadata` read shapes without a target.
            item_handlers=ocp.StandardCheckpointHandler(),
        )

    @property
    def config_path(self) -> str:
        return os.path.join(self.directory, CONFIG_NAME)

    def check_compatible(self, config_json: str) -> None:
        """Raises `ValueError` if `directory` holds a config differing on any `compat_keys`.

        Args:
          config_json: the new run's resolved config as a JSON string.
        """
        if not saved_steps(self.directory):
            return
        stored = self._stored_config()
        if stored is None:
            return
        new = json.loads(config_json)
        choices = stored.get(COMPAT_CHOICES)
        choices = choices if isinstance(choices, dict) else {}
        diffs = []
        for key in self.compat_keys:
            old_value, new_value = _lookup(stored, key), _lookup(new, key)
            if isinstance(choices.get(key), list):
                if new_value not in choices[key]:
                    diffs.append(
                        f"  {key}: stored one of {_show(choices[key])}, new {_show(new_value)}"
                    )
            elif old_value != new_value:
                diffs.append(f"  {key}: stored {_show(old_value)}, new {_show(new_value)}")
        if diffs:
            raise ValueError(
                f"Workdir {self.directory} holds a checkpoint from an incompatible config "
                f"(stored in {self.config_path}); differing fields:\n"
                + "\n".join(diffs)
                + "\n"
                + self.remedy
            )

    def _stored_config(self) -> dict | None:
        """The stored config.json (None if absent), with `compat_defaults` for keys it lacks."""
        if not os.path.exists(self.config_path):
            return None
        try:
            with open(self.config_path) as f:
                stored = json.load(f)
        except ValueError as e:
            raise ValueError(
                f"{self.config_path} is not a JSON config ({e}); it is written by the run that "
                "saved the checkpoints beside it: restore it, or use a new workdir"
            ) from None
        if not isinstance(stored, dict):
            raise ValueError(
                f"{self.config_path} holds no config (a JSON object); found {stored!r:.80}"
            )
        for dotted, value in self.compat_defaults.items():
            *parents, leaf = dotted.split(".")
            node = stored
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    break
            else:
                node.setdefault(leaf, value)
        return stored

    def _write_config(self, config_json: str, replace: bool) -> None:
        """Writes config.json atomically, unless one exists and not `replace` (the config of
        the first run that saved a step wins)."""
        if os.path.exists(self.config_path) and not replace:
            return
        tmp = f"{self.config_path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(json.loads(config_json), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.config_path)

    def latest_step(self) -> int | None:
        """The newest committed step, or None if there is no checkpoint."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All committed steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Starts an asynchronous save of `state` at `step`.

        The caller decides the save interval; every call saves. Returns once arrays are on
        the host, so the device buffers may be donated afterwards.

        Args:
          step: the training step; must exceed every saved step (Orbax otherwise skips the
            save and returns False).
          state: a pytree of arrays (dicts, `flax.struct` dataclasses, optax states).
          force: passed to Orbax; saves even where its policies would skip.

        Returns:
          Whether a save was started.

        Raises:
          CheckpointError: this save, or the previous (asynchronous) one, failed.
        """
        self._finalize()
        step = int(step)
        try:
            started = self._manager.save(step, args=ocp.args.StandardSave(state), force=force)
        except Exception as e:
            raise self._save_failed(step, e) from e
        if started:
            self._pending = step
        return started

    def wait(self) -> None:
        """Blocks until pending saves are committed to disk, and checksums them.

        Raises:
          CheckpointError: the pending save failed.
        """
        self._finalize()

    def _finalize(self) -> None:
        """Waits for the pending save; writes its checksums once it is committed (process 0
        only: Orbax writes every file from there)."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._save_failed(step, e) from e
        if step is None or jax.process_index() != 0:
            return
        step_dir = os.path.join(self.directory, str(step))
        # The newest step: never removed by max_to_keep. Orbax skips committing a step
        # whose items failed, and may only log it.
        if not os.path.isdir(step_dir):
            raise self._save_failed(step, RuntimeError(f"{step_dir} was not committed"))
        try:
            write_checksums(step_dir)
        except OSError as e:
            raise self._save_failed(step, e) from e

    def _save_failed(self, step: int | None, e: BaseException) -> CheckpointError:
        """The one-line error for a failed save; the committed steps before it stay."""
        good = [s for s in saved_steps(self.directory) if step is None or s < step]
        if good:
            last = f"step {good[-1]} ({os.path.join(self.directory, str(good[-1]))})"
        else:
            last = f"none in {self.directory}"
        return CheckpointError(
            f"checkpoint save of step {step} failed: {_cause(e)}; last good checkpoint: {last}"
        )

    def restore(self, step: int | None, abstract_state: Any) -> Any:
        """Restores the checkpoint at `step` onto the shapes and shardings of a target.

        Args:
          step: the step to restore, or None for `latest_step()`.
          abstract_state: the target pytree: `jax.ShapeDtypeStruct`s with `.sharding` (for
            example `jax.eval_shape(init_fn)` with shardings attached) or concrete arrays,
            whose shapes, dtypes and shardings are taken. Python types (namedtuples,
            dataclasses) come from here.

        Returns:
          A pytree like `abstract_state` holding the stored values.

        Raises:
          FileNotFoundError: no checkpoint at `step`.
          ValueError: the target's structure or shapes differ from the checkpoint (the
            message names each mismatching leaf path), or the step's files are damaged (they
            differ from its checksums, or do not read back; one line naming the earlier step
            to resume from).
          CheckpointError: a pending save failed.
        """
        self.wait()  # Orbax lists an in-flight step before its directory exists.
        step = self.latest_step() if step is None else int(step)
        if step is None or step not in self._manager.all_steps():
            raise FileNotFoundError(f"No checkpoint at step {step} in {self.directory}.")
        problem = verify_checksums(os.path.join(self.directory, str(step)))
        if problem is not None:
            raise self._damaged(step, problem)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        self._check_target(step, target)
        newer = self._fields_newer_than(step, target)
        try:
            if not newer:
                return self._manager.restore(step, args=ocp.args.StandardRestore(target))
            kept = {
                f.name: getattr(target, f.name)
                for f in dataclasses.fields(target)
                if f.name not in newer
            }
            restored = self._manager.restore(step, args=ocp.args.StandardRestore(kept))
            return target.replace(**restored)
        except Exception as e:
            error = self._damaged(step, e)
        _collect_quietly()
        raise error

    def _fields_newer_than(self, step: int, target: Any) -> set[str]:
        """Fields of a dataclass `target` (a TrainState) that the checkpoint at `step` does
        not store and that are None in `target`: state added after the run saved (an option
        it did not use), restored as None. Empty for any other target."""
        if not dataclasses.is_dataclass(target) or not hasattr(target, "replace"):
            return set()
        try:
            metadata = self._manager.item_metadata(step)
        except Exception:
            return set()
        stored = getattr(metadata, "tree", metadata)
        if not isinstance(stored, Mapping):
            return set()
        return {
            f.name
            for f in dataclasses.fields(target)
            if f.name not in stored and getattr(target, f.name) is None
        }

    def _damaged(self, step: int, e: BaseException | str) -> ValueError:
        """The one-line error for a step whose files do not read back or differ from their
        checksums (changed by something other than this program: Orbax commits each step
        atomically). `e` is the exception, or a description of the problem."""
        earlier = [s for s in self.all_steps() if s < step]
        where = os.path.join(self.directory, str(step))
        if earlier:
            hint = f"to resume from step {earlier[-1]}, move {where} out of the directory"
        else:
            hint = "no earlier step is saved; use a new workdir"
        return ValueError(
            f"Checkpoint step {step} in {self.directory} is damaged and does not restore "
            f"({e if isinstance(e, str) else _first_line(e)}); {hint}"
        )

    def _check_target(self, step: int, target: Any) -> None:
        """Compares leaf paths and shapes against the stored metadata, before Orbax reads.

        Orbax's own shape error names no leaf and leaves asyncio noise on stderr.
        """
        try:
            metadata = self._manager.item_metadata(step)
            stored = _tree_shapes(getattr(metadata, "tree", metadata))
        except Exception as e:
            raise self._damaged(step, e) from e
        if not stored or set(stored) == {""}:  # its metadata file is gone or empty
            raise self._damaged(step, ValueError("the checkpoint's tree metadata is missing"))
        wanted = _tree_shapes(target)
        problems = []
        for path in sorted(stored.keys() | wanted.keys()):
            old, new = stored.get(path), wanted.get(path)
            if old is None:
                problems.append(f"  {path}: not in checkpoint (target shape {new})")
            elif new is None:
                problems.append(f"  {path}: not in target (stored shape {old})")
            elif tuple(old) != tuple(new):
                problems.append(f"  {path}: stored shape {tuple(old)}, target shape {new}")
        if problems:
            raise ValueError(
                f"Checkpoint step {step} in {self.directory} does not match the restore "
                "target."
                + self._explain_shapes()
                + "\nTensors that differ:\n"
                + "\n".join(_clip_lines(problems))
            )

    def config_diff(self) -> list[str]:
        """Fields where this run's config differs from the stored `config.json`, as
        "  key: stored X, new Y" lines; environment and model fields first."""
        stored = self._stored_config()
        if stored is None:
            return []
        stored = flatten(stored)
        new = flatten(self._config)
        keys = [
            k for k in stored.keys() | new.keys() if stored.get(k, _MISSING) != new.get(k, _MISSING)
        ]
        keys.sort(key=lambda k: (not k.startswith(("env.", "model.")), k))
        return [
            f"  {k}: stored {_show(stored.get(k, _MISSING))}, new {_show(new.get(k, _MISSING))}"
            for k in keys
        ]

    def _explain_shapes(self) -> str:
        """Names the config fields that changed: the shapes follow from them (a vocabulary
        follows from the environment's fields, e.g. `env.frozen_lake.compact`)."""
        diff = self.config_diff()
        if not diff:
            return ""
        return (
            " The shapes follow from the config; fields that differ from the stored run's "
            f"({self.config_path}):\n" + "\n".join(_clip_lines(diff)) + "\n" + self.remedy
        )

    def close(self) -> None:
        """Waits for pending saves (writing their checksums) and releases Orbax's resources
        (its threads and event loops), also when that save failed.

        Raises:
          CheckpointError: the pending save failed.
        """
        try:
            self._finalize()
        except CheckpointError:
            try:
                self._manager.close()
            except Exception:  # the same failed save, raised again
                pass
            raise
        else:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
