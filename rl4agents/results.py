"""Reading runs back: a run's status from `summary.json`, mean/std over seeds, and
mean/min/max learning curves from `metrics.jsonl`, for `scripts/make_table.py` and
`scripts/sweep.py`. Also the names of the files a run and a study write, and the statistics
of `make_table.py`: t intervals over seeds, paired tests, areas under learning curves and a
paired bootstrap over seeds and tasks.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl4agents.train import writers

CONFIG_NAME = "config.json"  # the resolved config, written by scripts/sweep.py
COMMAND_NAME = writers.COMMAND_NAME
LOG_NAME = "log.txt"
SUMMARY_NAME = writers.SUMMARY_NAME
read_summary = writers.read_summary  # the run's summary.json, or None
METRICS_NAME = "metrics.jsonl"
PLAN_NAME = "sweep.json"  # the expanded study, in the sweep's output directory
PER_TASK_NAME = "per_task.csv"  # scripts/paired_eval.py's raw outcomes, one row per task
LR_SWEEP_NAME = "lr_sweep.csv"  # scripts/make_table.py's learning rates and the chosen one
# The first columns of a learning table (scripts/paired_eval.py, scripts/learning_table.py):
# the change in held-out greedy success from the start policy, with its 95% interval.
LEARNING_COLUMNS = (
    "env",
    "base_test",
    "rl_test",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "seeds",
    "eval_tasks",
    "minutes",
)


# Columns that hold text even where it reads as a number (a hex digest such as "0696e122").
TEXT_COLUMNS = ("base_digest",)


def read_csv(path: str, text: Sequence[str] = TEXT_COLUMNS) -> list[dict]:
    """The rows of a CSV this project wrote ([] when the file is absent): column -> value, an
    int or a float where the text is one, else the text ("" stays ""); the `text` columns
    stay text."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [
            {k: v if k in text else _number(v) for k, v in row.items()} for row in csv.DictReader(f)
        ]


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_lr_choice(path: str) -> dict[tuple[str, str], str]:
    """(variant, env) -> the learning rate (as its run names write it, "0.0003") that
    `scripts/make_table.py` selected in the lr_sweep.csv at `path`.

    Raises:
      ValueError: the file is missing, is not an lr_sweep.csv, selects no rate, or two for
        one variant and environment.
    """
    if not os.path.exists(path):
        raise ValueError(f"{path!r} does not exist; allowed: an lr_sweep.csv of make_table.py")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    needed = {"env", "variant", "lr", "selected"}
    if not rows or not needed <= set(rows[0]):
        raise ValueError(f"{path!r} lacks the columns {sorted(needed)} of an lr_sweep.csv")
    chosen: dict[tuple[str, str], str] = {}
    for r in rows:
        if r["selected"] != "1":
            continue
        key = (r["variant"], r["env"])
        if chosen.get(key, r["lr"]) != r["lr"]:
            raise ValueError(
                f"{path!r} selects two learning rates for {key}: {chosen[key]} and {r['lr']}; "
                "allowed: one per variant and environment"
            )
        chosen[key] = r["lr"]
    if not chosen:
        raise ValueError(f"{path!r} selects no learning rate (no row with selected=1)")
    return chosen


def read_plan(sweep_dir: str) -> list[dict]:
    """The runs of a sweep folder's plan (its PLAN_NAME: an --out of scripts/sweep.py, or a
    make_table --raw copy); a ValueError naming the folder when it has none."""
    path = os.path.join(sweep_dir, PLAN_NAME)
    if not os.path.exists(path):
        raise ValueError(
            f"--sweep={sweep_dir!r} holds no {PLAN_NAME}; allowed: an --out of "
            "scripts/sweep.py or its make_table --raw copy"
        )
    with open(path) as f:
        return json.load(f)["runs"]


def is_complete(workdir: str) -> bool:
    """Whether the run finished: summary.json says `"finished": true`."""
    summary = read_summary(workdir)
    return bool(summary) and summary.get("finished") is True


_INTERPRETER = re.compile(r"\S*/bin/python[0-9.]*(?=\s)")


def portable_command(text: str) -> str:
    """A run's command.txt without what names the machine it ran on: the working-directory
    comment goes (commands run from the repository root) and an interpreter path becomes
    `python`."""
    lines = [line for line in text.splitlines() if not line.startswith("# cwd:")]
    return "".join(_INTERPRETER.sub("python", line) + "\n" for line in lines)


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


def _values_by_x(series: Sequence[Sequence[tuple[float, float]]]) -> dict[float, list[float]]:
    """{x: the finite y values the runs logged at x} (None and non-finite values left out)."""
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            if y is not None and math.isfinite(y):
                by_x.setdefault(x, []).append(y)
    return by_x


def curve_stats(
    series: Sequence[Sequence[tuple[float, float]]],
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """Mean, min and max over runs at every x that some run logged.

    Args:
      series: per run, (x, y) points.

    Returns:
      xs, mean, min, max, and the number of runs at each x.
    """
    by_x = _values_by_x(series)
    xs = sorted(by_x)
    ys = [by_x[x] for x in xs]
    return (
        xs,
        [sum(v) / len(v) for v in ys],
        [min(v) for v in ys],
        [max(v) for v in ys],
        [len(v) for v in ys],
    )


# Statistics over seeds: t intervals, paired tests, sample efficiency, a paired bootstrap.
#
# The unit of every interval and test here is the seed (one training run): a run's value (say
# its final held-out success, itself a mean over a fixed set of evaluation tasks) is one
# observation, and the interval covers the spread between training runs, not the sampling of
# the evaluation tasks. `paired_bootstrap_ci` also resamples the tasks when per-task outcomes
# are at hand.


def t_two_sided(t: float, df: int) -> float:
    """P(|T| <= |t|) for Student's t with `df` degrees of freedom (an integer >= 1).

    The finite series of Abramowitz & Stegun 26.7.3-26.7.4 with theta = atan(|t| / sqrt(df)):
    df odd:  2/pi (theta + sin(theta) (cos(theta) + 2/3 cos^3(theta) + ... + (2*4*...*(df-3))
             / (1*3*...*(df-2)) cos^(df-2)(theta))), just 2 theta / pi for df = 1;
    df even: sin(theta) (1 + 1/2 cos^2(theta) + ... + (1*3*...*(df-3)) / (2*4*...*(df-2))
             cos^(df-2)(theta)), e.g. |t| / sqrt(2 + t^2) for df = 2.
    """
    if isinstance(df, bool) or int(df) != df or df < 1:
        raise ValueError(f"df={df!r}; allowed: an integer >= 1")
    df = int(df)
    if math.isnan(t):
        raise ValueError(f"t={t!r}; allowed: a number")
    if math.isinf(t):
        return 1.0
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        return min(1.0, 2.0 / math.pi * (theta + sin * total))
    term = total = 1.0
    for k in range(1, df // 2):
        term *= cos2 * (2 * k - 1) / (2 * k)
        total += term
    return min(1.0, sin * total)


def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value: t > 0 with P(|T| <= t) = `level` (0.95 -> the 0.975
    quantile; 4.303 for df = 2, 12.706 for df = 1), by bisection on `t_two_sided`."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r}; allowed: 0 < level < 1")
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < level:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided(mid, df) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean over `n` seeds with its two-sided interval (None for n < 2)."""

    mean: float
    low: float | None
    high: float | None
    n: int


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval | None:
    """mean +- t_{(1+level)/2, n-1} * s / sqrt(n) over the finite values, with s the sample
    standard deviation (ddof=1); the unit is one value (a seed). None without values.

    Intervals and tests over a few seeds as in Colas et al., "How Many Random Seeds?"
    (arXiv:1806.08295)."""
    stat = mean_std(_finite(values))
    if stat is None:
        return None
    if stat.std is None:
        return Interval(stat.mean, None, None, 1)
    half = t_quantile(level, stat.n - 1) * stat.std / math.sqrt(stat.n)
    return Interval(stat.mean, stat.mean - half, stat.mean + half, stat.n)


def paired_t_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test that the mean of the per-seed differences is 0:
    t = mean / (s / sqrt(n)) on n - 1 degrees of freedom; None for n < 2. When every
    difference is the same, s = 0: p = 1 if they are all 0, else 0."""
    stat = mean_std(_finite(diffs))
    if stat is None or stat.std is None:
        return None
    if stat.std == 0.0:
        return 1.0 if stat.mean == 0.0 else 0.0
    t = stat.mean / (stat.std / math.sqrt(stat.n))
    return max(0.0, 1.0 - t_two_sided(t, stat.n - 1))


SIGN_FLIP_EXACT = 16  # seeds up to which sign_flip_p enumerates every sign pattern


def sign_flip_p(diffs: Sequence[float], draws: int = 1 << 16, seed: int = 0) -> float | None:
    """Two-sided p-value of the sign-flip permutation test of the per-seed differences.

    Under the null hypothesis each difference is as likely negative as positive, so every
    pattern of signs is equally likely: p = the fraction of the 2^n patterns whose |mean| is at
    least the observed |mean| (the observed pattern included, so p >= 2 / 2^n: 0.25 for 3
    seeds). Exact up to `SIGN_FLIP_EXACT` seeds; above, `draws` random patterns (numpy
    generator `seed`) and p = (1 + hits) / (1 + draws). None without differences.
    """
    d = np.asarray(_finite(diffs), np.float64)
    n = d.size
    if n == 0:
        return None
    if n <= SIGN_FLIP_EXACT:
        codes = np.arange(2**n)[:, None] >> np.arange(n)[None, :]
        signs = 1.0 - 2.0 * (codes & 1)
        extra, total = 0, 0
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, n))
        extra, total = 1, 1
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    hits = int(np.sum(np.abs(signs @ d) / n >= observed - tol))
    return (hits + extra) / (signs.shape[0] + total)


def detectable_difference(
    low: float | None,
    high: float | None,
    *,
    df: int | None = None,
    level: float = 0.95,
    power: float = 0.8,
) -> float | None:
    """The smallest true difference that a study would detect with probability `power`.

    From a two-sided `level` interval [low, high] of an estimate, the standard error is
    se = (high - low) / (2 q), q = the interval's critical value (Student's t on `df` degrees
    of freedom, as `t_interval`'s, or the standard normal for `df` None, as an approximation for
    a bootstrap interval). A two-sided test at 1 - level rejects "no difference" with
    probability about `power` when the true difference is

        (q + q_power) se,

    q_power the `power` quantile of the same distribution (the usual sample-size formula; for
    the t-test it slightly understates the difference the noncentral t gives, most at few
    degrees of freedom). A null whose interval is wide says little: this is the size of effect
    it could have ruled out. None when either bound is None.

    Args:
      low, high: the interval's bounds (high >= low).
      df: degrees of freedom of a t interval (seeds - 1), or None for a normal interval.
      level: the interval's coverage, 0 < level < 1.
      power: the detection probability, 0.5 < power < 1.
    """
    if low is None or high is None:
        return None
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r}; allowed: 0 < level < 1")
    if not 0.5 < power < 1.0:
        raise ValueError(f"power={power!r}; allowed: 0.5 < power < 1")
    if not high >= low:
        raise ValueError(f"interval [{low}, {high}]; allowed: high >= low")
    if df is None:
        normal = statistics.NormalDist()
        q, q_power = normal.inv_cdf((1.0 + level) / 2.0), normal.inv_cdf(power)
    else:
        # t_quantile is two-sided: P(|T| <= t) = 2 p - 1 gives the one-sided p quantile.
        q, q_power = t_quantile(level, df), t_quantile(2.0 * power - 1.0, df)
    return (q + q_power) * (high - low) / (2.0 * q)


def curve_auc(points: Sequence[tuple[float, float]], budget: float) -> float | None:
    """Area under a learning curve over [0, budget], divided by `budget`.

    The curve joins the (x, y) evaluation points with straight lines and holds the first and
    the last value flat before the first and after the last point (as `numpy.interp`), so a
    run at success y throughout scores y. Points past `budget` are dropped. x and `budget`
    share a unit (episodes, or steps); None without points.
    """
    if not budget > 0:
        raise ValueError(f"budget={budget!r}; allowed: > 0")
    pts = sorted((float(x), float(y)) for x, y in points if y is not None and math.isfinite(y))
    pts = [(x, y) for x, y in pts if 0.0 <= x <= budget]
    if not pts:
        return None
    xs = [0.0] + [x for x, _ in pts] + [float(budget)]
    ys = [pts[0][1]] + [y for _, y in pts] + [pts[-1][1]]
    area = sum((xs[i + 1] - xs[i]) * (ys[i + 1] + ys[i]) / 2.0 for i in range(len(xs) - 1))
    return area / budget


def first_reach(
    points: Sequence[tuple[float, float]], level: float, goal: str = "max"
) -> float | None:
    """The smallest x whose y is >= `level` (<= for goal "min"); None if never reached."""
    ok = [
        x
        for x, y in points
        if y is not None and math.isfinite(y) and (y >= level if goal == "max" else y <= level)
    ]
    return min(ok) if ok else None


def curve_bands(
    series: Sequence[Sequence[tuple[float, float]]], level: float = 0.95
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """Mean over runs at every x that some run logged, with its t interval (`t_interval`;
    the band is the mean itself where one run has the x).

    Returns:
      xs, mean, low, high, and the number of runs at each x.
    """
    by_x = _values_by_x(series)
    xs = sorted(by_x)
    stats = [t_interval(by_x[x], level) for x in xs]
    return (
        xs,
        [s.mean for s in stats],
        [s.mean if s.low is None else s.low for s in stats],
        [s.mean if s.high is None else s.high for s in stats],
        [s.n for s in stats],
    )


def paired_bootstrap_ci(
    a: np.ndarray,
    b: np.ndarray,
    *,
    samples: int = 10000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Mean difference a - b of two policies evaluated on the same N tasks, with a two-level
    (seeds, tasks) percentile bootstrap interval.

    Args:
      a: f[S, N] per-task outcomes of policy A's S seeds (training runs).
      b: f[N] per-task outcomes of one policy B (a fixed reference, the base policy say), or
        f[S, N] of B's S seeds, seed s of B paired with seed s of A.
      samples: bootstrap replicates.
      seed: numpy generator seed.
      level: coverage of the interval.

    Returns:
      (mean of d, low, high), d = a - b (f[S, N]); low and high are the (1 - level) / 2 and
      (1 + level) / 2 quantiles of the replicates.

    Each replicate draws S seed indices with replacement and, independently, N task indices
    with replacement; every drawn seed is evaluated on the same drawn tasks, since the real
    seeds shared their tasks (a crossed design: drawing tasks anew per seed would average the
    task effect away), and a drawn seed index takes its row of a and, for f[S, N], of b. The
    replicate is the mean of d over the drawn seeds and tasks, counts_s^T d counts_t / (S N)
    with the multinomial counts of each index. Percentile intervals: Efron & Tibshirani (1993);
    resampling runs and tasks together for RL results: Agarwal et al., "Deep Reinforcement
    Learning at the Edge of the Statistical Precipice" (arXiv:2108.13264).
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"a has shape {a.shape}; allowed: f[S, N] with S, N >= 1")
    if b.shape not in ((a.shape[1],), a.shape):
        raise ValueError(f"b has shape {b.shape}; allowed: ({a.shape[1]},) or {a.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a or b has a non-finite outcome; allowed: finite outcomes")
    if isinstance(samples, bool) or int(samples) != samples or samples < 1:
        raise ValueError(f"samples={samples!r}; allowed: an integer >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r}; allowed: 0 < level < 1")
    d = a - (b[None, :] if b.ndim == 1 else b)
    num_seeds, num_tasks = d.shape
    rng = np.random.default_rng(seed)
    block = max(1, min(int(samples), 4_000_000 // num_tasks))
    reps = []
    for start in range(0, int(samples), block):
        size = min(block, int(samples) - start)
        cs = rng.multinomial(num_seeds, np.full(num_seeds, 1.0 / num_seeds), size=size)
        ct = rng.multinomial(num_tasks, np.full(num_tasks, 1.0 / num_tasks), size=size)
        reps.append(np.einsum("rs,sn,rn->r", cs, d, ct) / (num_seeds * num_tasks))
    reps = np.concatenate(reps)
    low, high = np.quantile(reps, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(d.mean()), float(low), float(high)
