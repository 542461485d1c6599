"""Checkpoints: a thin wrapper over Orbax's `CheckpointManager` plus the run's config.

Layout of a checkpoint directory:

    directory/config.json      the resolved config of the first run that saved a step
    directory/<step>/...        one Orbax checkpoint per saved step (atomic: temp dir + rename)

Saves are asynchronous: `save` returns once the arrays are copied off the device, and
`wait()` blocks until the files are committed. Restores always go through an abstract target
(shapes, dtypes, shardings), so namedtuples (optax states) and `flax.struct` dataclasses come
back with their Python types and each array lands on the sharding asked for.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

_MISSING = object()
CONFIG_NAME = "config.json"
_MAX_LINES = 12  # per list in an error message


def _lookup(config: dict, dotted: str) -> Any:
    """Returns `config["a"]["b"]` for "a.b", or `_MISSING`."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


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
        run that failed before its first save) binds nothing and is replaced.
      compat_defaults: for compat keys added after a run was saved, the value its stored
        config is taken to have (the one that keeps the behaviour it ran with), so that the
        run still resumes and evaluates: {"loss.kl_ctrl": "fixed"}.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int = 3,
        config_json: str,
        compat_keys: tuple[str, ...],
        compat_defaults: Mapping[str, Any] | None = None,
    ):
        self.directory = os.path.abspath(os.fspath(directory))
        self.compat_keys = tuple(compat_keys)
        self.compat_defaults = dict(compat_defaults or {})
        self._config = json.loads(config_json)
        self.check_compatible(config_json)
        os.makedirs(self.directory, exist_ok=True)
        self._write_config(config_json, replace=not saved_steps(self.directory))
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
        diffs = []
        for key in self.compat_keys:
            old_value, new_value = _lookup(stored, key), _lookup(new, key)
            if old_value != new_value:
                diffs.append(f"  {key}: stored {_show(old_value)}, new {_show(new_value)}")
        if diffs:
            raise ValueError(
                f"Workdir {self.directory} holds a checkpoint from an incompatible config "
                f"(stored in {self.config_path}); differing fields:\n"
                + "\n".join(diffs)
                + "\nUse a new workdir, or restore the original values of these fields."
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
        """
        return self._manager.save(int(step), args=ocp.args.StandardSave(state), force=force)

    def wait(self) -> None:
        """Blocks until pending saves are committed to disk."""
        self._manager.wait_until_finished()

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
          ValueError: the target's structure or shapes differ from the checkpoint; the
            message names each mismatching leaf path.
        """
        self.wait()  # Orbax lists an in-flight step before its directory exists.
        step = self.latest_step() if step is None else int(step)
        if step is None or step not in self._manager.all_steps():
            raise FileNotFoundError(f"No checkpoint at step {step} in {self.directory}.")
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        self._check_target(step, target)
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:
            error = self._damaged(step, e)
        _collect_quietly()
        raise error

    def _damaged(self, step: int, e: BaseException) -> ValueError:
        """The one-line error for a step whose files do not read back (removed or truncated
        by something other than this program: Orbax commits each step atomically)."""
        earlier = [s for s in self.all_steps() if s < step]
        where = os.path.join(self.directory, str(step))
        if earlier:
            hint = f"to resume from step {earlier[-1]}, move {where} out of the directory"
        else:
            hint = "no earlier step is saved; use a new workdir"
        return ValueError(
            f"Checkpoint step {step} in {self.directory} is damaged and does not restore "
            f"({_first_line(e)}); {hint}"
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
        stored = _flatten(stored)
        new = _flatten(self._config)
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
            f"({self.config_path}):\n"
            + "\n".join(_clip_lines(diff))
            + "\nUse a new workdir, or restore the stored values of these fields."
        )

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
