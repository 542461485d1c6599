"""Metric logging: JSON lines plus TensorBoard, curve plots, and text tables.

`workdir/metrics.jsonl` holds one row per `MetricWriter.write` call:

    {"step": 100, "wall_time": 12.3, "train/reward": 0.41, "train/loss": 1.7}

On resume, rows at or after the resume step are dropped first, so a run restarted from a
checkpoint does not log the same steps twice.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
import resource
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"  # written by rl4agents/train/loop.py at the end of a run
TB_DIR = "tb"
COMMAND_NAME = "command.txt"  # the command lines that wrote a results folder


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


USAGE_NAME = "usage.json"


class Usage:
    """A run's CPU time and peak memory over every process that trained or evaluated it.

    A resumed run is several processes; `write` counts all of them (CPU seconds, user + system,
    every thread, since each process's `cpu0`; the largest resident memory of any of them), so
    a study's CPU-hours do not depend on where it was stopped. The run rewrites
    workdir/usage.json as it goes (every step), so a process killed without notice loses at
    most the count since its last write; work redone after a resume counts again, as it was
    spent again. A run written before usage.json existed resumes from its summary.json's count
    (its last process alone).
    """

    def __init__(self, workdir: str, cpu0: float, *, resumed: bool, main: bool = True):
        """`cpu0`: `time.process_time()` when this process's part of the run began;
        `resumed`: the run goes on from a checkpoint (else an old usage.json is ignored);
        `main`: this process writes the file (process 0)."""
        self.path = os.path.join(workdir, USAGE_NAME)
        self.cpu0, self.main = cpu0, main
        self.prior_cpu_s, self.prior_peak_gb = _prior_usage(workdir) if resumed else (0.0, 0.0)

    def write(self) -> tuple[float, float]:
        """(CPU seconds, peak GiB) so far, also written to usage.json by the main process."""
        cpu = round(self.prior_cpu_s + time.process_time() - self.cpu0, 1)
        # Linux reports ru_maxrss in KiB.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        peak = round(max(self.prior_peak_gb, peak), 3)
        if self.main:
            write_text(self.path, json.dumps({"cpu_s": cpu, "peak_rss_gb": peak}) + "\n")
        return cpu, peak


def _prior_usage(workdir: str) -> tuple[float, float]:
    for name, cpu_key in ((USAGE_NAME, "cpu_s"), ("summary.json", "process_cpu_s")):
        try:
            with open(os.path.join(workdir, name)) as f:
                row = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(row, dict):
            return float(row.get(cpu_key) or 0.0), float(row.get("peak_rss_gb") or 0.0)
    return 0.0, 0.0


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename, so a reader never sees a
    half-written file and an interrupted write leaves the old one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_csv(
    path: str | os.PathLike,
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    ignore_extra: bool = False,
) -> None:
    """Writes `rows` as a CSV with a header, replacing `path` whole (as `write_text`).

    Args:
      path: the CSV file.
      rows: one mapping per row.
      columns: the header, in order; default the first row's keys.
      ignore_extra: drop keys that are not in `columns`; otherwise such a key raises
        ValueError (csv.DictWriter's check).
    """
    columns = list(columns if columns is not None else (rows[0] if rows else ()))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore" if ignore_extra else "raise")
    w.writeheader()
    w.writerows(rows)
    write_text(path, buf.getvalue())


def append_command(
    folder: str | os.PathLike, script: str, argv: Sequence[str], env: Sequence[str] = ()
) -> None:
    """Appends the command line that wrote a results folder to its command.txt.

    The line is `NAME=value ... python <script> <argv>`, shell-quoted, with the current value of
    each environment variable named in `env` (XLA_FLAGS, say), so the line re-runs as it ran.
    """
    prefix = "".join(f"{name}={shlex.quote(os.environ.get(name, ''))} " for name in env)
    with open(os.path.join(folder, COMMAND_NAME), "a") as f:
        f.write(f"{prefix}python {script} {shlex.join(argv)}\n")


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


Z_95 = 1.959964  # the standard normal's 97.5% quantile: two-sided 95% intervals


def wilson_interval(p: Any, n: int, z: float = Z_95) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of a success rate measured on `n` independent tasks.

    Better than the normal approximation near 0 and 1, where evaluations of a good policy
    sit: 256 of 256 tasks solved gives [0.985, 1], not the normal approximation's [1, 1].

    Args:
      p: f[...] observed success rates in [0, 1] (a float or an array).
      n: the number of tasks each rate was measured on (>= 1).
      z: the normal quantile; the default gives a 95% interval.

    Returns:
      (lo, hi): f64[...] arrays shaped like `p`, with 0 <= lo <= p <= hi <= 1.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"wilson_interval: n={n!r}; allowed: an int >= 1 (tasks evaluated)")
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * np.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return np.clip(center - half, 0.0, 1.0), np.clip(center + half, 0.0, 1.0)


def _series_names(key: str, columns: Iterable[str]) -> list[str]:
    """The columns to plot for `key`: itself if present, else every "<prefix>/key". An
    evaluation column ("eval_test/greedy_success") comes first, then the other splits'
    ("eval_ood/greedy_success")."""
    columns = set(columns)
    if key.startswith("eval_") and "/" in key:
        metric = key.split("/", 1)[1]
        splits = {c for c in columns if c.startswith("eval_") and c.endswith("/" + metric)}
        return sorted(splits, key=lambda c: (c != key, c))
    if key in columns:
        return [key]
    return sorted(c for c in columns if c.rsplit("/", 1)[-1] == key and "/" in c)


def _is_success(name: str) -> bool:
    """A success rate (drawn on a fixed [0, 1] axis): "train/success", "eval_ood/greedy_success"."""
    return name.rsplit("/", 1)[-1].endswith("success")


def plot_curves(
    jsonl_path: str | os.PathLike,
    png_path: str | os.PathLike,
    keys: Sequence[str],
    x: str = "step",
    title: str | None = None,
    *,
    eval_tasks: int | None = None,
    sft_metrics: str | os.PathLike | None = None,
    sft_wall_counted: bool = False,
) -> str:
    """Plots metric curves from a metrics JSONL file into a PNG, one subplot per key.

    Success rates (names ending in "success") are drawn on a fixed [0, 1] axis, so that the
    sampling noise of an evaluation does not look like a trend. An evaluation key
    ("eval_test/greedy_success") draws every split's curve in its panel: the held-out test
    tasks and, where logged, the out-of-distribution ones ("eval_ood/greedy_success").
    With `eval_tasks`, each evaluated success rate gets its binomial 95% band (the Wilson
    interval over `eval_tasks` tasks, `wilson_interval`).

    With `sft_metrics` (the metrics.jsonl of the scripts/sft.py run this run started from),
    the SFT phase comes first, shaded: on the step axis its steps are drawn as logged and
    RL step s at (SFT's last step) + s, so the SFT's closing evaluation is where RL starts;
    on the wall-time axis RL's times are shifted by the SFT's last logged time unless
    `sft_wall_counted` (RL's times already include it: `init.count_wall`). SFT rows are
    drawn in the same panels as the run's own (its "sft/nll" for a key "nll" or "sft/nll",
    its closing "eval_test/..." as the first point of the run's curve).

    Args:
      jsonl_path: the `metrics.jsonl` file.
      png_path: where to write the PNG (parent directories are created).
      keys: metric names: "reward" plots every "<prefix>/reward" series present (train and
        eval); a full name such as "train/reward" plots just that one, and one such as
        "eval_test/greedy_success" that metric on every evaluated split.
      x: the x axis, "step" or "wall_time".
      title: the figure title.
      eval_tasks: tasks per evaluation (`train.eval_tasks`), for the 95% bands; None: none.
      sft_metrics: an SFT run's metrics.jsonl, drawn as the phase before RL; None: none.
      sft_wall_counted: whether the run's wall times already count the SFT's (x="wall_time").

    Returns:
      `png_path` as a string.
    """
    # Figure + Agg canvas, not pyplot: no global backend switch, no GUI, thread-safe enough.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not keys:
        raise ValueError("plot_curves needs at least one key.")
    if x not in ("step", "wall_time"):
        raise ValueError(f"plot_curves: x={x!r}; allowed: 'step' or 'wall_time'")
    if eval_tasks is not None:
        wilson_interval(0.5, eval_tasks)  # the one-line error for a bad count
    rows = read_metrics(jsonl_path)
    sft_end = None
    if sft_metrics is not None:
        if not os.path.isfile(sft_metrics):
            raise ValueError(
                f"plot_curves: sft_metrics={os.fspath(sft_metrics)!r} is not a file; allowed: "
                "the metrics.jsonl of a scripts/sft.py workdir, or None"
            )
        sft_rows = [r for r in read_metrics(sft_metrics) if x in r]
        sft_end = max((r[x] for r in sft_rows), default=0.0)
        shift = 0.0 if x == "wall_time" and sft_wall_counted else sft_end
        rows = sft_rows + [{**r, x: r[x] + shift} for r in rows if x in r]
    columns = {name for row in rows for name in row}
    fig = Figure(figsize=(6, 2.6 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys, strict=True):
        if sft_end:
            ax.axvspan(0, sft_end, color="tab:gray", alpha=0.15, lw=0, label="SFT")
        names = _series_names(key, columns)
        for name in names:
            points = [
                (row[x], row[name])
                for row in rows
                if x in row and name in row and math.isfinite(row[name])
            ]
            if not points:
                continue
            xs, ys = (np.asarray(v, np.float64) for v in zip(*points, strict=True))
            (line,) = ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=name)
            if eval_tasks and name.startswith("eval_") and _is_success(name):
                lo, hi = wilson_interval(ys, eval_tasks)
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        if names and all(_is_success(name) for name in names):
            ax.set_ylim(-0.02, 1.02)
            ax.set_yticks(np.linspace(0, 1, 6))
        banded = eval_tasks and any(n.startswith("eval_") and _is_success(n) for n in names)
        ax.set_title(f"{key} (bands: 95%, {eval_tasks} tasks)" if banded else key)
        label = "wall time (s)" if x == "wall_time" else x
        if sft_end:
            label += f" (SFT, then RL from {sft_end:g})" if x == "step" else " (SFT, then RL)"
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        if ax.get_lines():
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
