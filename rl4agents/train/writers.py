"""Metric logging: JSON lines plus TensorBoard, curve plots, and text tables.

`workdir/metrics.jsonl` holds one row per `MetricWriter.write` call:

    {"step": 100, "wall_time": 12.3, "train/reward": 0.41, "train/loss": 1.7}

On resume, rows at or after the resume step are dropped first, so a run restarted from a
checkpoint does not log the same steps twice.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"  # written by rl4agents/train/loop.py at the end of a run
TB_DIR = "tb"


def read_summary(workdir: str | os.PathLike) -> dict | None:
    """The run's summary.json, or None if absent or unreadable."""
    try:
        with open(os.path.join(workdir, SUMMARY_NAME)) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Reads a metrics JSONL file into a list of row dicts.

    Blank lines and an undecodable final line (a write cut short by a crash) are skipped.

    Args:
      path: the `metrics.jsonl` file.

    Returns:
      The rows in file order; empty if the file does not exist.
    """
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return rows


class MetricWriter:
    """Writes scalar metrics to `workdir/metrics.jsonl` and TensorBoard (`workdir/tb`).

    Args:
      workdir: the run directory (created if absent).
      enabled: if False (say, on non-zero processes) every method is a no-op.
      resume_step: if set, rows with `step >= resume_step` are first dropped from an existing
        `metrics.jsonl`, and TensorBoard is told to discard its events from that step on.
        Pass 0 to start a fresh run in a workdir that has old metrics.
    """

    def __init__(
        self, workdir: str | os.PathLike, *, enabled: bool = True, resume_step: int | None = None
    ):
        self.workdir = os.fspath(workdir)
        self.path = os.path.join(self.workdir, METRICS_NAME)
        self.enabled = enabled
        self._start = time.time()
        self._file = None
        self._tb = None
        if not enabled:
            return
        os.makedirs(self.workdir, exist_ok=True)
        if resume_step is not None:
            self.truncate_after(resume_step)
        self._file = open(self.path, "a")
        from tensorboardX import SummaryWriter  # Imported here: slow, and unused when disabled.

        self._tb = SummaryWriter(os.path.join(self.workdir, TB_DIR), purge_step=resume_step)

    def truncate_after(self, step: int) -> int:
        """Drops rows with `row["step"] >= step` from `metrics.jsonl`, atomically.

        Args:
          step: the first step to drop (the step a resumed run continues from).

        Returns:
          The number of rows dropped.
        """
        if not self.enabled or not os.path.exists(self.path):
            return 0
        rows = read_metrics(self.path)
        kept = [row for row in rows if row.get("step", -1) < step]
        if len(kept) == len(rows):
            return 0
        if self._file is not None:
            self._file.close()
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._file is not None:
            self._file = open(self.path, "a")
        return len(rows) - len(kept)

    def write(
        self,
        step: int,
        metrics: Mapping[str, Any],
        prefix: str = "train",
        *,
        wall_time: float | None = None,
    ) -> dict:
        """Logs one row of scalars.

        Args:
          step: the training step (x axis).
          metrics: name to scalar (float, int, or 0-d array); names get `prefix + "/"`.
          prefix: "train", "eval", ...; empty for no prefix.
          wall_time: seconds since the run started; measured from construction if None.

        Returns:
          The row as written.
        """
        if wall_time is None:
            wall_time = time.time() - self._start
        row = {"step": int(step), "wall_time": float(wall_time)}
        for name, value in metrics.items():
            row[f"{prefix}/{name}" if prefix else name] = float(value)
        if not self.enabled:
            return row
        # json writes nan/inf as NaN/Infinity, which Python's json reads back.
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for name, value in row.items():
            if name not in ("step", "wall_time"):
                self._tb.add_scalar(name, value, global_step=row["step"])
        self._tb.flush()
        return row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def relative_paths(tree: Any, workdir: str | os.PathLike) -> Any:
    """`tree` with every string that names a path inside `workdir` made relative to it.

    A run's summary records where its curves and checkpoints lie, as the workdir was given; a
    results folder that keeps the summary should not record the machine's folders.

    Args:
      tree: nested dicts, lists and leaves (a loaded JSON document).
      workdir: the run's folder, absolute or relative to the current directory.

    Returns:
      The same structure; absolute strings under `workdir`, and relative ones starting with
      `workdir` and a separator, become paths relative to `workdir`. Other leaves are unchanged.
    """
    given = os.fspath(workdir)
    root = os.path.abspath(given)

    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str) and (os.path.isabs(x) or x.startswith(given + os.sep)):
            path = os.path.abspath(x)
            if os.path.commonpath([root, path]) == root:
                return os.path.relpath(path, root)
        return x

    return walk(tree)


def _series_names(key: str, columns: Iterable[str]) -> list[str]:
    """The columns to plot for `key`: itself if present, else every "<prefix>/key"."""
    columns = set(columns)
    if key in columns:
        return [key]
    return sorted(c for c in columns if c.rsplit("/", 1)[-1] == key and "/" in c)


def plot_curves(
    jsonl_path: str | os.PathLike,
    png_path: str | os.PathLike,
    keys: Sequence[str],
    x: str = "step",
    title: str | None = None,
) -> str:
    """Plots metric curves from a metrics JSONL file into a PNG, one subplot per key.

    Args:
      jsonl_path: the `metrics.jsonl` file.
      png_path: where to write the PNG (parent directories are created).
      keys: metric names: "reward" plots every "<prefix>/reward" series present (train and
        eval); a full name such as "eval/reward" plots just that one.
      x: the x axis, "step" or "wall_time".
      title: the figure title.

    Returns:
      `png_path` as a string.
    """
    # Figure + Agg canvas, not pyplot: no global backend switch, no GUI, thread-safe enough.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not keys:
        raise ValueError("plot_curves needs at least one key.")
    rows = read_metrics(jsonl_path)
    columns = {name for row in rows for name in row}
    fig = Figure(figsize=(6, 2.6 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys, strict=True):
        for name in _series_names(key, columns):
            points = [
                (row[x], row[name])
                for row in rows
                if x in row and name in row and math.isfinite(row[name])
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=name)
        ax.set_title(key)
        ax.set_xlabel("wall time (s)" if x == "wall_time" else x)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    png_path = os.fspath(png_path)
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    fig.savefig(png_path, dpi=100)
    return png_path


def _scalar(value: Any) -> Any:
    """0-d NumPy/JAX arrays to Python scalars; anything else unchanged."""
    return value.item() if getattr(value, "ndim", None) == 0 else value


def _cell(value: Any) -> str:
    value = _scalar(value)
    if value is None:
        return "-"
    if isinstance(value, numbers.Integral):
        return str(int(value)) if not isinstance(value, bool) else str(value)
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Formats rows as an aligned Markdown table (numbers right-aligned, text left-aligned).

    Args:
      rows: one dict per table row; missing values print as "-".
      columns: the columns in order; None takes every key, in first-seen order.

    Returns:
      The table, one line per row plus a header and a separator line.
    """
    if columns is None:
        columns = list(dict.fromkeys(name for row in rows for name in row))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    numeric = [
        all(isinstance(_scalar(row.get(c)), numbers.Real | None) for row in rows) for c in columns
    ]
    widths = [max([3, len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    separator = [
        "-" * (w - 1) + ":" if num else "-" * w for w, num in zip(widths, numeric, strict=True)
    ]
    return "\n".join([line(list(columns)), line(separator)] + [line(r) for r in cells])
