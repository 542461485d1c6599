"""Reading runs back: a run's status from `summary.json`, mean/std over seeds, and
mean/min/max learning curves from `metrics.jsonl`, for `scripts/make_table.py` and
`scripts/sweep.py`. Also the names of the files a run and a study write.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rl4agents.train import writers

CONFIG_NAME = "config.json"  # the resolved config, written by scripts/sweep.py
COMMAND_NAME = "command.txt"
LOG_NAME = "log.txt"
SUMMARY_NAME = writers.SUMMARY_NAME
read_summary = writers.read_summary  # the run's summary.json, or None
METRICS_NAME = "metrics.jsonl"
PLAN_NAME = "sweep.json"  # the expanded study, in the sweep's output directory


def is_complete(workdir: str) -> bool:
    """Whether the run finished: summary.json says `"finished": true`."""
    summary = read_summary(workdir)
    return bool(summary) and summary.get("finished") is True


def run_status(workdir: str) -> tuple[str, str]:
    """("complete" | "incomplete" | "missing", a short explanation) for a run directory."""
    if not os.path.isdir(workdir):
        return "missing", "never started"
    summary = read_summary(workdir)
    if summary is None:
        return "incomplete", "no summary.json (running, killed or crashed)"
    if summary.get("finished") is not True:
        return "incomplete", f"stopped at step {summary.get('steps')} before finishing"
    return "complete", f"finished at step {summary.get('steps')}"


def get_dotted(tree: Mapping, key: str) -> Any:
    """tree["a"]["b"] for key "a.b"; None if any part is missing."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def parse_metric(spec: str) -> tuple[str, str]:
    """ "KEY[:max|:min]" -> (KEY, "max" | "min"); which direction is better (default max)."""
    key, _, goal = spec.partition(":")
    goal = goal or "max"
    if not key or goal not in ("max", "min"):
        raise ValueError(f"metric {spec!r}: allowed: 'KEY', 'KEY:max' or 'KEY:min'")
    return key, goal


@dataclasses.dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (ddof=1; None for one value) of `n` values."""

    mean: float
    std: float | None
    n: int


def mean_std(values: Sequence[float]) -> Stat | None:
    """The statistics of the finite values; None if there are none."""
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return None
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return Stat(mean, std, n)


def short_labels(variants: Sequence[Sequence[str]]) -> list[str]:
    """Row labels: each variant's parts minus those every variant shares; "base" if empty."""
    common = set(variants[0]).intersection(*map(set, variants[1:])) if variants else set()
    return [", ".join(p for p in v if p not in common) or "base" for v in variants]


def curve_stats(
    series: Sequence[Sequence[tuple[float, float]]],
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """Mean, min and max over runs at every x that some run logged.

    Args:
      series: per run, (x, y) points.

    Returns:
      xs, mean, min, max, and the number of runs at each x.
    """
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            if y is not None and math.isfinite(y):
                by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    ys = [by_x[x] for x in xs]
    return (
        xs,
        [sum(v) / len(v) for v in ys],
        [min(v) for v in ys],
        [max(v) for v in ys],
        [len(v) for v in ys],
    )
