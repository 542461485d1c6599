"""Tables and learning curves from a sweep made by scripts/sweep.py.

  python scripts/make_table.py --sweep=runs/sweeps/example_sweep \
      --out=experiments/results/example_sweep
  python scripts/make_table.py --sweep=runs/sweeps/s --out=experiments/results/s \
      --metric=eval_test.greedy_success,eval_ood.greedy_success,wall_s:min \
      --curve_key=eval_test/greedy_success,train/success

Rows are variants (what a run sets apart from its seed), columns are environment x metric,
cells are `mean ± std (n=seeds)` over the complete runs, with the sample standard deviation
(ddof=1) and the best mean per column in bold. A metric is a dotted key into each run's
summary.json (`eval_test.greedy_success`, `wall_s`); `KEY:min` marks lower as better. Writes
into --out: table.md, table.csv (one row per cell), table.tex (booktabs), runs.csv (one row per
run, with its status) and curves_<env>.png (per variant the mean over seeds of each curve key
from metrics.jsonl against the step, with a min-max band over seeds). Runs that are missing or
incomplete are listed in table.md and on stdout, never silently dropped.

`--raw` also writes `raw/` into --out: a sweep directory of its own with what the tables and
curves are made of (sweep.json, and per run its summary.json, config.json, provenance.json,
command.txt without machine paths, and metrics.jsonl cut to `step`, `wall_time`, the
held-out evaluations, the curve keys and the learning-rate key), so that
`make_table.py --sweep=<out>/raw` remakes them from committed files once the runs are gone.

Provenance: each run's provenance.json (rl4agents.provenance, written by train.py) gives its
git commit, uncommitted changes, JAX version and devices; table.md ends with them (one line
when every run agrees, else one line per kind with its runs). The table refuses, in one
`error:` line naming two runs and what differs, to pool complete runs made at different
commits, or runs of one base config and environment whose configs differ beyond the seed and
the keys the sweep sets per run (its variants); `--allow_mixed` pools them anyway and lists
the differences in table.md. Runs without provenance.json (made before it was recorded) count
as "unknown": a warning on stderr, no refusal; a table of such runs only is as before.

Statistics (table.csv, one row per environment x variant x metric, and its Markdown twin, the
"Statistics" section of table.md):

  python scripts/make_table.py --sweep=runs/sweeps/s --out=experiments/results/s \
      --baseline=grpo [--p_test=t|sign_flip] [--reach=0.3] [--lr_key=optim.lr] \
      [--lr_select=train/success] [--lr_from=STAGE1/lr_sweep.csv]

- The unit is the seed: each complete run gives one value of a metric (its final
  eval_test.greedy_success, say, a mean over the run's fixed evaluation tasks). `seeds`, `mean`,
  `std` and `ci_low`/`ci_high`: the 95% t interval mean +- t_{0.975, n-1} s / sqrt(n) over the
  seeds; it covers the spread between training runs, not the choice of evaluation tasks
  (rl4agents.results.paired_bootstrap_ci resamples those too when per-task outcomes exist).
- `--baseline=NAME` (a row label, or the value of one of its parts: grpo for
  credit.name=grpo): `diff_vs_NAME`, `diff_ci_low`, `diff_ci_high`: per seed the row's value
  minus the baseline's on the same seed (paired runs must share train.eval_seed,
  train.eval_tasks and train.final_eval_tasks, i.e. the same evaluation tasks), mean and 95% t
  interval over the paired seeds (`diff_seeds`); `diff_p`: the two-sided p-value of the paired
  t-test (`--p_test=t`, the default) or of the exact sign-flip permutation test over seeds
  (`--p_test=sign_flip`; at least 2 / 2^n, 0.25 with 3 seeds). table.md names the test it shows.
  `diff_mde80`: the smallest true difference the paired comparison would detect with 80%
  probability at the 5% level, (t_{0.975, n-1} + t_{0.8, n-1}) x the difference's standard
  error (`rl4agents.results.detectable_difference`): the power of a null; empty under
  `--p_test=sign_flip` (with fewer than 6 seeds it can never reach p < 0.05).
- Sample efficiency, from the metric's learning curve in metrics.jsonl (eval_test.greedy_success
  -> eval_test/greedy_success; empty for a metric without one, wall_s): `auc` (with
  `auc_ci_low`/`auc_ci_high`), the area under the curve over the steps the run trained,
  divided by them (straight lines between evaluations, the first value held back to step 0,
  the last to the end), mean over seeds: the same normalised by the episode budget, since
  episodes = steps x rollout.num_tasks x rollout.group_size. `steps_to_reach` and
  `episodes_to_reach`: the median over seeds of the first evaluation at or past `--reach` (at
  or below for a :min metric), "never" unless more than half the seeds get there; `reached`: how
  many seeds did. `episodes_to_reach` is empty when a run's config.json lacks its batch size.
- Learning-rate sweeps (row labels naming `--lr_key`): each variant x environment keeps the
  learning rate whose runs score best, averaged over seeds, on `--lr_select` (a metrics.jsonl
  key: the mean of its last quarter of rows; or a summary.json key; `KEY:min` for lower is
  better). A key of the held-out splits (eval_test, eval_ood) is refused, so the choice never
  sees the numbers it reports. table.csv gets an `lr` column; lr_sweep.csv (and a section of
  table.md) lists every learning rate with its score, `selected`, and mean and interval.
  In a staged study (a few seeds per rate, then more seeds at the chosen rate only),
  `--lr_from` keeps the rates an earlier stage's lr_sweep.csv selected, so that the seeds added
  to the chosen rate cannot change the choice.
- learning_curves.png: one panel per environment, per variant the mean over seeds of the first
  --curve_key against the episodes (the steps when the batch is unknown), band = 95% t interval.
- `n` and `best` (the best mean per environment x metric) keep table.csv readable by the
  readers of its older form (variant, env, metric, goal, mean, std, n, best).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents import config_utils, provenance, results  # noqa: E402
from rl4agents import sweep as sweep_lib  # noqa: E402
from rl4agents.train import writers  # noqa: E402

DEFAULT_METRICS = "eval_test.greedy_success,eval_ood.greedy_success,wall_s:min"
DEFAULT_CURVES = "eval_test/greedy_success"
STD_NOTE = "sample standard deviation (ddof=1) over seeds; no std when n=1"
MIXED_HINT = "allowed: runs of one commit and config, or --allow_mixed to pool them anyway"
_NAMED = 5  # runs named per provenance line
CURVES_PNG = "learning_curves.png"  # one panel per environment, 95% bands
LR_SWEEP_CSV = results.LR_SWEEP_NAME


@dataclasses.dataclass
class Entry:
    """One run of the sweep plan with its status and, when complete, its results."""

    name: str
    workdir: str
    label: str  # the table row
    env: str
    seed: object
    status: str
    detail: str
    summary: dict | None = None
    config: dict | None = None
    spec: str | None = None  # the base config spec "FILE[:ARG]" of sweep.json
    provenance: dict | None = None  # provenance.json, None when absent


@dataclasses.dataclass
class Table:
    rows: list[str]
    envs: list[str]
    metrics: list[tuple[str, str]]  # (key, "max" | "min")
    cells: dict  # (row, env, metric key) -> results.Stat
    best: set  # (row, env, metric key) in bold


def load_entries(
    sweep_dir: str, strip: str = "", only: str | None = None, exclude: str | None = None
) -> list[Entry]:
    """Every run of `<sweep_dir>/sweep.json` with its status, summary and config.

    `strip`: a regular expression removed from every row label, e.g. the environment part of
    a config argument ("frozen_lake8,grpo" -> "grpo") so that one row spans the environments.
    `only`: keep the runs whose name contains it (as `scripts/sweep.py --only`).
    `exclude`: drop the runs whose name matches this regular expression (`seed=0$`: a staged
    study's tuning seed).
    """
    path = os.path.join(sweep_dir, results.PLAN_NAME)
    if not os.path.exists(path):
        raise ValueError(
            f"--sweep={sweep_dir!r} is not a sweep directory (no {results.PLAN_NAME}); "
            "allowed: an --out of scripts/sweep.py"
        )
    with open(path) as f:
        plan = json.load(f)["runs"]
    labels = results.short_labels([tuple(r["variant"]) for r in plan])
    if strip:
        labels = [re.sub(strip, "", label) or "base" for label in labels]
    entries = []
    for r, label in zip(plan, labels, strict=True):
        if only is not None and only not in r["name"]:
            continue
        if exclude is not None and re.search(exclude, r["name"]):
            continue
        workdir = os.path.join(sweep_dir, r["dir"])
        status, detail = results.run_status(workdir)
        e = Entry(r["name"], workdir, label, r["env"], r["seed"], status, detail)
        e.spec = r.get("config")
        config_path = os.path.join(workdir, results.CONFIG_NAME)
        if status == "complete":
            e.summary = results.read_summary(workdir)
            e.provenance = provenance.read(workdir)
            if os.path.exists(config_path):
                with open(config_path) as f:
                    e.config = json.load(f)
        entries.append(e)
    return entries


RAW_DIR = "raw"
RAW_RUN_FILES = (results.SUMMARY_NAME, results.CONFIG_NAME, provenance.FILENAME)


def save_raw(sweep_dir: str, entries: list[Entry], keep: set[str], out: str) -> str:
    """Copies `sweep_dir`'s plan and its runs' files into `out`/raw/ (replacing an earlier
    copy), a sweep directory that make_table reads as it reads `sweep_dir`: the RAW_RUN_FILES,
    command.txt made `results.portable_command`, and metrics.jsonl rows cut to `step`,
    `wall_time`, the `eval_*` keys and `keep` (rows left with nothing else are dropped).
    Returns the folder."""
    dest = os.path.join(out, RAW_DIR)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    for name in (results.PLAN_NAME, provenance.FILENAME):
        if os.path.exists(os.path.join(sweep_dir, name)):
            shutil.copyfile(os.path.join(sweep_dir, name), os.path.join(dest, name))
    for e in entries:
        if not os.path.isdir(e.workdir):
            continue
        run = os.path.join(dest, os.path.relpath(e.workdir, sweep_dir))
        os.makedirs(run)
        for name in RAW_RUN_FILES:
            if os.path.exists(os.path.join(e.workdir, name)):
                shutil.copyfile(os.path.join(e.workdir, name), os.path.join(run, name))
        command = os.path.join(e.workdir, results.COMMAND_NAME)
        if os.path.exists(command):
            with open(command) as f, open(os.path.join(run, results.COMMAND_NAME), "w") as g:
                g.write(results.portable_command(f.read()))
        metrics = os.path.join(e.workdir, results.METRICS_NAME)
        if not os.path.exists(metrics):
            continue
        with open(metrics) as f, open(os.path.join(run, results.METRICS_NAME), "w") as g:
            for line in f:
                row = json.loads(line)
                cut = {
                    k: v
                    for k, v in row.items()
                    if k in keep or k.startswith("eval_") or k in ("step", "wall_time")
                }
                if set(cut) - {"step", "wall_time"}:
                    g.write(json.dumps(cut) + "\n")
    return dest


def check_cells(entries: list[Entry]) -> None:
    """Runs in one table cell must differ only in their seed."""
    first: dict[tuple[str, str], Entry] = {}
    for e in entries:
        if e.config is None:  # not made by scripts/sweep.py; nothing to compare
            continue
        other = first.setdefault((e.label, e.env), e)
        diff = sweep_lib.config_diff(other.config, e.config, ignore=[sweep_lib.SEED_KEY])
        if diff:
            raise ValueError(
                f"runs {other.name!r} and {e.name!r} share the row {e.label!r} and the "
                f"environment {e.env!r} but their configs differ beyond the seed: {diff[:5]}; "
                "name the keys that differ (sweep_values) or use distinct config arguments "
                "(or --allow_mixed)"
            )


def varied_keys(plan: list[dict]) -> set[str]:
    """The config keys a sweep sets per run: named in a variant ("key=value"), or overridden
    with values that differ between the runs of `plan` (sweep.json's "runs")."""
    keys = {part.split("=", 1)[0] for r in plan for part in r.get("variant", ()) if "=" in part}
    overrides = [r.get("overrides", {}) for r in plan]
    for key in {k for o in overrides for k in o}:
        values = {json.dumps(o.get(key, "<unset>"), sort_keys=True) for o in overrides}
        if len(values) > 1:
            keys.add(key)
    return keys


def _commit(e: Entry) -> str | None:
    return ((e.provenance or {}).get("git") or {}).get("commit")


def pooling_problems(entries: list[Entry], varied: set[str]) -> list[str]:
    """Why the complete runs should not share a table, one line each (empty: they may).

    Runs made at different commits (unknown commits aside); runs of one base config spec and
    environment whose configs differ beyond the seed and the `varied` keys."""
    done = [e for e in entries if e.status == "complete"]
    problems = []
    commits: dict[str, Entry] = {}
    for e in done:
        if _commit(e) is not None:
            commits.setdefault(_commit(e), e)
    if len(commits) > 1:
        (a, ea), (b, eb) = list(commits.items())[:2]
        more = f" ({len(commits)} commits in all)" if len(commits) > 2 else ""
        problems.append(
            f"runs {ea.name!r} and {eb.name!r} were made at different commits "
            f"({a[:7]} and {b[:7]}){more}"
        )
    ignore = {sweep_lib.SEED_KEY, *varied}
    first: dict[tuple, Entry] = {}
    for e in done:
        if e.config is None:
            continue
        other = first.setdefault((e.spec, e.env), e)
        diff = sweep_lib.config_diff(other.config, e.config, ignore=ignore)
        if diff:
            problems.append(
                f"runs {other.name!r} and {e.name!r} (config {e.spec!r}) have configs that "
                f"differ beyond the seed and the keys the sweep varies: {'; '.join(diff[:3])}"
                + (f" ({len(diff)} keys in all)" if len(diff) > 3 else "")
            )
    return problems


def aggregate(
    entries: list[Entry],
    metrics: list[tuple[str, str]],
    varied: set[str] = frozenset(),
    allow_mixed: bool = False,
) -> Table:
    """Mean/std/n per variant x environment x metric over the complete runs, best marked.

    Raises:
      ValueError: runs that may not be pooled (`pooling_problems`; a cell's runs differing
        beyond the seed), unless `allow_mixed`.
    """
    done = [e for e in entries if e.status == "complete"]
    if not allow_mixed:
        check_cells(done)
        problems = pooling_problems(entries, set(varied))
        if problems:
            raise ValueError(f"{problems[0]}; {MIXED_HINT}")
    rows = list(dict.fromkeys(e.label for e in entries))
    envs = list(dict.fromkeys(e.env for e in entries))
    cells = {}
    for row in rows:
        for env in envs:
            runs = [e for e in done if e.label == row and e.env == env]
            for key, _ in metrics:
                stat = results.mean_std([results.get_dotted(e.summary, key) for e in runs])
                if stat is not None:
                    cells[(row, env, key)] = stat
    best = set()
    for env in envs:
        for key, goal in metrics:
            column = {r: _num(cells[(r, env, key)].mean) for r in rows if (r, env, key) in cells}
            if len(column) > 1:
                target = (max if goal == "max" else min)(float(v) for v in column.values())
                best |= {(r, env, key) for r, v in column.items() if float(v) == target}
    return Table(rows, envs, metrics, cells, best)


def _decimals(x: float) -> int:
    return 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 3


def _num(x: float, like: float | None = None) -> str:
    return f"{x:.{_decimals(x if like is None else like)}f}"


def cell_text(stat: results.Stat, pm: str = "±") -> str:
    """ "0.710 ± 0.030" (no std when n = 1)."""
    if stat.std is None:
        return _num(stat.mean)
    return f"{_num(stat.mean)} {pm} {_num(stat.std, like=stat.mean)}"


def _arrow(goal: str) -> str:
    return "↑" if goal == "max" else "↓"


def to_markdown(
    table: Table,
    title: str,
    entries: list[Entry],
    pngs: list[str],
    mixed: list[str] = (),
    stats_lines: list[str] = (),
) -> str:
    header = ["variant"] + [
        f"{env}: {k} {_arrow(g)}" for env in table.envs for k, g in table.metrics
    ]
    lines = [
        f"# {title}",
        "",
        f"Cells: mean ± {STD_NOTE}; n = seeds. **Bold**: best mean per column "
        "(↑ higher is better, ↓ lower is better).",
        "",
        "| " + " | ".join(header) + " |",
        "|---" + "|---:" * (len(header) - 1) + "|",
    ]
    for row in table.rows:
        cells = [row]
        for env in table.envs:
            for key, _ in table.metrics:
                stat = table.cells.get((row, env, key))
                if stat is None:
                    cells.append("-")
                    continue
                text = cell_text(stat)
                text = f"**{text}**" if (row, env, key) in table.best else text
                cells.append(f"{text} (n={stat.n})")
        lines.append("| " + " | ".join(cells) + " |")
    complete = sum(e.status == "complete" for e in entries)
    lines += ["", f"{complete} of {len(entries)} runs complete."]
    lines += _missing_lines(entries, bullet="- ")
    lines += provenance_lines(entries, mixed)
    lines += stats_lines
    for png in pngs:
        lines += ["", f"![{os.path.splitext(png)[0]}]({png})"]
    return "\n".join(lines) + "\n"


def describe_provenance(record: dict | None) -> str:
    """ "commit 1a2b3c4 (clean), jax 0.10.2, 8 cpu devices", or "unknown (no provenance.json)"."""
    if record is None:
        return "unknown (no provenance.json)"
    git = record.get("git") or {}
    commit = git.get("commit")
    dirty = {True: "uncommitted changes", False: "clean", None: "changes unknown"}[git.get("dirty")]
    jax = (record.get("packages") or {}).get("jax") or "unknown"
    devices = record.get("devices")
    where = f"{devices['count']} {devices['platform']} devices" if devices else "devices unknown"
    text = f"commit {commit[:7]} ({dirty})" if commit else "commit unknown (not a git checkout)"
    return f"{text}, jax {jax}, {where}"


def provenance_lines(entries: list[Entry], mixed: list[str] = ()) -> list[str]:
    """table.md's provenance footer: one line when the complete runs agree, else one line per
    kind naming its runs; then what --allow_mixed pooled. No provenance line when no run has
    provenance.json (a table made before provenance was recorded reads as it did)."""
    done = [e for e in entries if e.status == "complete"]
    kinds: dict[str, list[Entry]] = {}
    for e in done:
        kinds.setdefault(describe_provenance(e.provenance), []).append(e)
    lines = []
    if not any(e.provenance for e in done):
        pass
    elif len(kinds) == 1:
        lines = ["", f"Provenance: {next(iter(kinds))} ({len(done)} runs)."]
    else:
        lines = ["", f"Provenance ({len(kinds)} kinds):"]
        for text, runs in kinds.items():
            names = ", ".join(f"`{e.name}`" for e in runs[:_NAMED])
            names += f", ... ({len(runs)} runs)" if runs[_NAMED:] else ""
            lines.append(f"- {text}: {names}")
    if mixed:
        lines += ["", "Pooled with --allow_mixed:"] + [f"- {p}" for p in mixed]
    return lines


def _missing_lines(entries: list[Entry], bullet: str) -> list[str]:
    missing = [e for e in entries if e.status != "complete"]
    if not missing:
        return []
    out = ["", f"Not included ({len(missing)} runs):"]
    return out + [f"{bullet}`{e.name}`: {e.status}, {e.detail}" for e in missing]


def runs_csv(entries: list[Entry], metrics: list[tuple[str, str]], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "variant", "env", "seed", "status", "detail"] + [k for k, _ in metrics])
        for e in entries:
            values = [results.get_dotted(e.summary or {}, k) for k, _ in metrics]
            values = ["" if v is None else v for v in values]
            w.writerow([e.name, e.label, e.env, e.seed, e.status, e.detail] + values)


# Statistics: intervals over seeds, paired differences, sample efficiency, lr selection.

LEVEL = 0.95  # coverage of every interval
P_TESTS = ("t", "sign_flip")
P_NAMES = {"t": "paired t-test", "sign_flip": "exact sign-flip permutation test"}
DEFAULT_LR_KEY = "optim.lr"
DEFAULT_LR_SELECT = "train/success"
_SELECT_TAIL = 0.25  # the last quarter of a run's logged rows of --lr_select scores it
_PEEKING = ("eval_test", "eval_ood")  # held-out splits a learning rate may not be chosen on


@dataclasses.dataclass
class Stats:
    """table.csv and lr_sweep.csv as rows of column -> value (None: empty)."""

    rows: list[dict]
    lr_rows: list[dict]  # empty without a learning-rate sweep
    used: list[Entry]  # the complete runs behind `rows`: the chosen learning rate's
    columns: list[str]
    baseline: str | None  # the baseline's row label
    p_test: str
    reach: float
    unit: str  # "episodes" when every used run's config gives its batch, else "steps"
    lr_fixed: bool = False  # the learning rates came from an earlier stage (--lr_from)


def split_lr(label: str, lr_key: str = DEFAULT_LR_KEY) -> tuple[str, str | None]:
    """("grpo", "0.001") for the row label "grpo, optim.lr=0.001": the label without its
    learning-rate part ("base" if nothing is left) and the learning rate; (label, None) when
    the label names none."""
    parts = label.split(", ")
    lrs = [p.split("=", 1)[1] for p in parts if p.startswith(f"{lr_key}=")]
    rest = [p for p in parts if not p.startswith(f"{lr_key}=")]
    return ", ".join(rest) or "base", (lrs[0] if lrs else None)


def resolve_baseline(name: str, rows: list[str]) -> str:
    """The row `--baseline` names: the row label itself, else the one row with a part
    `KEY=name` or `name` ("grpo" finds "credit.name=grpo")."""
    if name in rows:
        return name
    found = [r for r in rows if any(p.split("=", 1)[-1] == name for p in r.split(", ") if p)]
    if len(found) == 1:
        return found[0]
    why = "names several rows" if found else "names no row"
    raise ValueError(f"--baseline={name!r} {why}; allowed: one of {rows}")


def episodes_per_step(e: Entry) -> int | None:
    """rollout.num_tasks x rollout.group_size of the run's config.json (the episodes one step
    trains on); None when the config does not say."""
    config = e.config or {}
    tasks = results.get_dotted(config, "rollout.num_tasks")
    group = results.get_dotted(config, "rollout.group_size")
    if isinstance(tasks, int) and isinstance(group, int) and tasks > 0 and group > 0:
        return tasks * group
    return None


def _metrics_rows(e: Entry, cache: dict) -> list[dict]:
    if e.workdir not in cache:
        cache[e.workdir] = writers.read_metrics(os.path.join(e.workdir, results.METRICS_NAME))
    return cache[e.workdir]


def _budget_steps(e: Entry, points: list[tuple[float, float]]) -> float | None:
    """The steps the run trained (summary.json), else train.num_steps, else its last row."""
    for steps in (
        (e.summary or {}).get("steps"),
        results.get_dotted(e.config or {}, "train.num_steps"),
    ):
        if isinstance(steps, int | float) and not isinstance(steps, bool) and steps > 0:
            return float(steps)
    return max((x for x, _ in points), default=None) or None


def curve_key_of(metric: str) -> str:
    """The metrics.jsonl key of a summary.json key: eval_test.greedy_success ->
    eval_test/greedy_success (the final value of that learning curve)."""
    return metric.replace(".", "/", 1)


def run_efficiency(e: Entry, key: str, goal: str, reach: float, cache: dict) -> dict | None:
    """Area under the run's `key` curve (`results.curve_auc`, over the steps it trained) and
    the steps and episodes at which it first reached `reach`; None without the curve."""
    points = [(r["step"], r[key]) for r in _metrics_rows(e, cache) if key in r and "step" in r]
    budget = _budget_steps(e, points)
    if not points or budget is None:
        return None
    steps = results.first_reach(points, reach, goal)
    per_step = episodes_per_step(e)
    return {
        "auc": results.curve_auc(points, budget),
        "steps": math.inf if steps is None else steps,
        "episodes": None if per_step is None else (math.inf if steps is None else steps * per_step),
    }


def select_score(e: Entry, key: str, cache: dict) -> float | None:
    """A run's score for choosing its learning rate: the mean of a metrics.jsonl key (with a
    "/") over the last quarter of the run's rows that log it, or a summary.json key."""
    if "/" in key:
        values = [r[key] for r in _metrics_rows(e, cache) if key in r]
        values = [v for v in values if v is not None and math.isfinite(v)]
        if not values:
            return None
        tail = values[-max(1, math.ceil(_SELECT_TAIL * len(values))) :]
        return sum(tail) / len(tail)
    value = results.get_dotted(e.summary or {}, key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def _values(runs: list[Entry], key: str) -> list[tuple[object, float]]:
    """(seed, value) of the runs whose summary.json has a finite `key`."""
    out = []
    for e in runs:
        v = results.get_dotted(e.summary or {}, key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append((e.seed, float(v)))
    return out


def _same_tasks(a: Entry, b: Entry) -> None:
    for key in ("train.eval_seed", "train.eval_tasks", "train.final_eval_tasks"):
        va, vb = (results.get_dotted(e.config or {}, key) for e in (a, b))
        if va is not None and vb is not None and va != vb:
            raise ValueError(
                f"runs {a.name!r} and {b.name!r} are paired by seed but evaluate different "
                f"tasks ({key}: {va} vs {vb}); allowed: paired runs with the same evaluation tasks"
            )


def paired_diff(
    runs: list[Entry], base: list[Entry], key: str, p_test: str, level: float = LEVEL
) -> dict:
    """Per seed, run minus baseline run of that seed on `key`; the mean, its t interval, the
    p-value of `p_test` (`results.paired_t_p` or `results.sign_flip_p`) and, for the t-test,
    the difference it detects with 80% probability (`results.detectable_difference`; None under
    the sign-flip test, whose smallest p-value with n seeds is 2 / 2^n). Seeds either side
    lacks are left out."""
    mine, theirs = dict(_values(runs, key)), dict(_values(base, key))
    for group in (runs, base):
        seeds = [e.seed for e in group]
        twice = {s for s in seeds if seeds.count(s) > 1}
        if twice:
            raise ValueError(
                f"row {group[0].label!r} on {group[0].env!r} has several runs of seed "
                f"{sorted(twice, key=str)[0]!r}; allowed: one run per seed for --baseline"
            )
    by_seed = {e.seed: e for e in base}
    for e in runs:
        if e.seed in by_seed:
            _same_tasks(e, by_seed[e.seed])
    seeds = [s for s in mine if s in theirs]
    diffs = [mine[s] - theirs[s] for s in seeds]
    iv = results.t_interval(diffs, level)
    p_fn = results.paired_t_p if p_test == "t" else results.sign_flip_p
    return {
        "diff": None if iv is None else iv.mean,
        "low": None if iv is None else iv.low,
        "high": None if iv is None else iv.high,
        "p": p_fn(diffs) if diffs else None,
        "pairs": len(diffs),
        "mde80": None
        if p_test != "t" or iv is None or iv.low is None
        else results.detectable_difference(iv.low, iv.high, df=iv.n - 1, level=level),
    }


def stat_columns(has_lr: bool, baseline: str | None) -> list[str]:
    """table.csv's columns; the diff columns carry the --baseline name."""
    cols = ["env", "variant"] + (["lr"] if has_lr else [])
    cols += ["metric", "goal", "seeds", "mean", "std", "ci_low", "ci_high"]
    if baseline is not None:
        cols += [f"diff_vs_{baseline}", "diff_ci_low", "diff_ci_high", "diff_p", "diff_seeds"]
        cols += ["diff_mde80"]
    cols += ["auc", "auc_ci_low", "auc_ci_high", "steps_to_reach", "episodes_to_reach"]
    return cols + ["reached", "n", "best"]


LR_COLUMNS = [
    "env", "variant", "lr", "metric", "goal", "seeds", "mean", "ci_low", "ci_high",
    "select_key", "select_score", "selected",
]  # fmt: skip


def statistics(
    entries: list[Entry],
    metrics: list[tuple[str, str]],
    *,
    baseline: str | None = None,
    p_test: str = "t",
    reach: float = 0.3,
    lr_key: str = DEFAULT_LR_KEY,
    lr_select: str = DEFAULT_LR_SELECT,
    lr_fixed: dict[tuple[str, str], str] | None = None,
    level: float = LEVEL,
) -> Stats:
    """table.csv (and lr_sweep.csv) over the complete runs: per environment x row x metric,
    the mean over seeds with its t interval, the paired difference to `baseline`, and the
    area under and time to `reach` of the metric's learning curve.

    With a learning-rate sweep (row labels naming `lr_key`), each row x environment keeps the
    learning rate whose runs score best on `lr_select` (`select_score`, averaged over seeds;
    a training or validation key: the held-out splits are refused), and every learning rate
    goes to the lr rows. `lr_fixed` ((row, env) -> learning rate, from an earlier stage's
    lr_sweep.csv: `results.read_lr_choice`) fixes the choice instead; the scores are still
    reported.

    Raises:
      ValueError: an unknown baseline, a --lr_select on a held-out split or that no run has,
        runs paired by seed that evaluated different tasks, an `lr_fixed` that names no rate
        for a row or a rate no run of the row has.
    """
    if p_test not in P_TESTS:
        raise ValueError(f"--p_test={p_test!r}; allowed: {list(P_TESTS)}")
    if not math.isfinite(reach):
        raise ValueError(f"--reach={reach!r}; allowed: a finite number")
    done = [e for e in entries if e.status == "complete"]
    parts = {id(e): split_lr(e.label, lr_key) for e in done}
    has_lr = any(lr is not None for _, lr in parts.values())
    cache: dict = {}
    lr_rows = []
    chosen: dict[tuple[str, str], str | None] = {}
    if has_lr:
        select_key, select_goal = results.parse_metric(lr_select)
        if select_key.split("/")[0].split(".")[0] in _PEEKING:
            raise ValueError(
                f"--lr_select={lr_select!r} reads a held-out split; allowed: a metrics.jsonl "
                "or summary.json key of training or a validation split (train/success)"
            )
        cells: dict[tuple[str, str], dict[str | None, list[Entry]]] = {}
        for e in done:
            group, lr = parts[id(e)]
            cells.setdefault((group, e.env), {}).setdefault(lr, []).append(e)
        for (group, env), by_lr in cells.items():
            scores = {}
            for lr, runs in by_lr.items():
                mine = [select_score(e, select_key, cache) for e in runs]
                stat = results.mean_std([s for s in mine if s is not None])
                scores[lr] = None if stat is None else stat.mean
            known = [s for s in scores.values() if s is not None]
            if not known:
                raise ValueError(
                    f"--lr_select={lr_select!r}: no run of row {group!r} on {env!r} has it; "
                    "allowed: a metrics.jsonl key or summary.json key the runs write"
                )
            if lr_fixed is None:
                target = (max if select_goal == "max" else min)(known)
                chosen[(group, env)] = next(lr for lr, s in scores.items() if s == target)
            elif lr_fixed.get((group, env)) in by_lr:
                chosen[(group, env)] = lr_fixed[(group, env)]
            else:
                raise ValueError(
                    f"--lr_from fixes the learning rate of row {group!r} on {env!r} at "
                    f"{lr_fixed.get((group, env))!r}; allowed: one of the rates its runs have, "
                    f"{sorted(by_lr)}"
                )
            for lr, runs in by_lr.items():
                for key, goal in metrics:
                    iv = results.t_interval([v for _, v in _values(runs, key)], level)
                    lr_rows.append(
                        {
                            "env": env,
                            "variant": group,
                            "lr": lr,
                            "metric": key,
                            "goal": goal,
                            "seeds": None if iv is None else iv.n,
                            "mean": None if iv is None else iv.mean,
                            "ci_low": None if iv is None else iv.low,
                            "ci_high": None if iv is None else iv.high,
                            "select_key": lr_select,
                            "select_score": scores[lr],
                            "selected": int(lr == chosen[(group, env)]),
                        }
                    )
        used = [e for e in done if parts[id(e)][1] == chosen[(parts[id(e)][0], e.env)]]
    else:
        used = done
    groups = list(dict.fromkeys(parts[id(e)][0] for e in used))
    envs = list(dict.fromkeys(e.env for e in used))
    base = None if baseline is None else resolve_baseline(baseline, groups)
    unit = "episodes" if all(episodes_per_step(e) for e in used) else "steps"
    rows = []
    for env in envs:
        for group in groups:
            runs = [e for e in used if e.env == env and parts[id(e)][0] == group]
            base_runs = [e for e in used if e.env == env and parts[id(e)][0] == base]
            for key, goal in metrics:
                values = [v for _, v in _values(runs, key)]
                iv = results.t_interval(values, level)
                if iv is None:
                    continue
                std = results.mean_std(values).std
                row = {"env": env, "variant": group, "lr": chosen.get((group, env))}
                row.update(metric=key, goal=goal, seeds=iv.n, mean=iv.mean, std=std)
                row.update(ci_low=iv.low, ci_high=iv.high, n=iv.n)
                if base is not None and group != base and base_runs:
                    d = paired_diff(runs, base_runs, key, p_test, level)
                    row[f"diff_vs_{baseline}"] = d["diff"]
                    row.update(diff_ci_low=d["low"], diff_ci_high=d["high"], diff_p=d["p"])
                    row["diff_seeds"] = d["pairs"]
                    row["diff_mde80"] = d["mde80"]
                effs = [run_efficiency(e, curve_key_of(key), goal, reach, cache) for e in runs]
                effs = [x for x in effs if x is not None]
                if effs:
                    auc = results.t_interval([x["auc"] for x in effs if x["auc"] is not None])
                    if auc is not None:
                        row.update(auc=auc.mean, auc_ci_low=auc.low, auc_ci_high=auc.high)
                    row["steps_to_reach"] = _median([x["steps"] for x in effs])
                    if all(x["episodes"] is not None for x in effs):
                        row["episodes_to_reach"] = _median([x["episodes"] for x in effs])
                    hits = sum(math.isfinite(x["steps"]) for x in effs)
                    row["reached"] = f"{hits}/{len(effs)}"
                rows.append(row)
    for env in envs:
        for key, goal in metrics:
            column = [r for r in rows if r["env"] == env and r["metric"] == key]
            target = (max if goal == "max" else min)((r["mean"] for r in column), default=None)
            for r in column:
                r["best"] = int(len(column) > 1 and r["mean"] == target)
    columns = stat_columns(has_lr, baseline if base is not None else None)
    return Stats(rows, lr_rows, used, columns, base, p_test, reach, unit, lr_fixed is not None)


def _cell(value) -> str:
    """A table.csv field: floats in full (repr), inf as "never", None as empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "never" if math.isinf(value) else repr(value)
    return str(value)


def write_stats_csv(rows: list[dict], columns: list[str], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([_cell(row.get(c)) for c in columns])


def _ci_text(mean: float | None, low: float | None, high: float | None) -> str:
    if mean is None:
        return "-"
    if low is None:
        return _num(mean)
    return f"{_num(mean)} [{_num(low, like=mean)}, {_num(high, like=mean)}]"


def _p_text(p: float | None) -> str:
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def _reach_text(row: dict, unit: str) -> str:
    key = "episodes_to_reach" if unit == "episodes" else "steps_to_reach"
    value = row.get(key)
    if value is None:
        return "-"
    text = "never" if math.isinf(value) else f"{value:g}"
    return f"{text} ({row['reached']})"


def stats_markdown(stats: Stats, baseline: str | None) -> list[str]:
    """table.md's Statistics section (the twin of table.csv) and its learning-rate sweep."""
    if not stats.rows:
        return []
    has_lr = bool(stats.lr_rows)
    pct = f"{LEVEL:.0%}"
    header = ["env", "variant"] + (["lr"] if has_lr else []) + ["metric", "seeds"]
    header.append(f"mean [{pct} CI]")
    if stats.baseline is not None:
        header += [f"diff vs {stats.baseline} [{pct} CI]", "p", "detectable (80%)"]
    header += ["AUC", f"{stats.unit} to {stats.reach:g}"]
    lines = [
        "",
        "## Statistics",
        "",
        f"Unit: one seed (training run) = one value. Mean over seeds with its {pct} t interval "
        "(mean ± t · s / √n, s the sample standard deviation, n - 1 degrees of freedom; "
        "no interval for one seed).",
    ]
    if stats.baseline is not None:
        lines.append(
            f"Diff: per seed, the row minus `{stats.baseline}` on the same seed, then mean and "
            f"{pct} t interval over those seeds; p: {P_NAMES[stats.p_test]} (two-sided) that "
            "the mean difference is 0; detectable: the smallest true difference this comparison "
            "would detect with 80% probability at the 5% level, (t_0.975 + t_0.8) x its "
            "standard error."
        )
    lines.append(
        "AUC: area under the metric's learning curve (metrics.jsonl) from the start to the "
        "end of the run's budget, divided by the budget (straight lines between evaluations, "
        "the first value held back to the start), mean over seeds. "
        f"{stats.unit.capitalize()} to {stats.reach:g}: median "
        f"over seeds of the first evaluation at or past {stats.reach:g} (reached / seeds)."
    )
    if has_lr and stats.lr_fixed:
        lines.append(
            "lr: per row and environment, the learning rate an earlier stage chose (--lr_from); "
            f"the scores below (`{stats.lr_rows[0]['select_key']}`) are recomputed over every "
            "run now at each rate, so the chosen rate, which has more seeds, need not score "
            "best here."
        )
    elif has_lr:
        lines.append(
            f"lr: per row and environment, the learning rate whose runs score best on "
            f"`{stats.lr_rows[0]['select_key']}` (never a held-out split); every learning "
            "rate is in lr_sweep.csv and below."
        )
    lines += ["", "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for r in stats.rows:
        cells = [r["env"], r["variant"]] + ([r["lr"] or "default"] if has_lr else [])
        cells += [f"{r['metric']} {_arrow(r['goal'])}", str(r["seeds"])]
        mean = _ci_text(r["mean"], r["ci_low"], r["ci_high"])
        cells.append(f"**{mean}**" if r["best"] else mean)
        if stats.baseline is not None:
            diff = f"diff_vs_{baseline}"
            if r["variant"] == stats.baseline:
                cells += ["(baseline)", "-", "-"]
            else:
                cells.append(_ci_text(r.get(diff), r.get("diff_ci_low"), r.get("diff_ci_high")))
                cells.append(_p_text(r.get("diff_p")))
                mde = r.get("diff_mde80")
                cells.append("-" if mde is None else _num(mde, like=r.get(diff)))
        cells.append(_ci_text(r.get("auc"), r.get("auc_ci_low"), r.get("auc_ci_high")))
        cells.append(_reach_text(r, stats.unit))
        lines.append("| " + " | ".join(cells) + " |")
    if has_lr:
        metrics = list(dict.fromkeys((r["metric"], r["goal"]) for r in stats.lr_rows))
        header = ["env", "variant", "lr", "score", "seeds"] + [
            f"{k} {_arrow(g)} [{pct} CI]" for k, g in metrics
        ]
        lines += [
            "",
            "## Learning-rate sweep",
            "",
            f"Score: `{stats.lr_rows[0]['select_key']}` (mean over seeds); **bold**: the "
            "learning rate each row keeps.",
            "",
            "| " + " | ".join(header) + " |",
            "|---" + "|---:" * (len(header) - 1) + "|",
        ]
        by_lr: dict[tuple, dict] = {}
        for r in stats.lr_rows:
            by_lr.setdefault((r["env"], r["variant"], r["lr"]), {})[r["metric"]] = r
        for (env, group, lr), cells_by_metric in by_lr.items():
            first = next(iter(cells_by_metric.values()))
            score = "-" if first["select_score"] is None else _num(first["select_score"], 1.0)
            lr_text = lr or "default"
            lr_text = f"**{lr_text}**" if first["selected"] else lr_text
            seeds = max((c["seeds"] or 0) for c in cells_by_metric.values())
            cells = [env, group, lr_text, score, str(seeds)]
            for key, _ in metrics:
                c = cells_by_metric.get(key)
                cells.append("-" if c is None else _ci_text(c["mean"], c["ci_low"], c["ci_high"]))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_learning_curves(stats: Stats, key: str, png: str, cache: dict | None = None) -> bool:
    """One panel per environment: per row, the mean over seeds of `key` against the episodes
    (the steps when a run's config lacks its batch) with a 95% t band. False if empty."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cache = {} if cache is None else cache
    envs = list(dict.fromkeys(e.env for e in stats.used))
    if not envs:
        return False
    fig = Figure(figsize=(5.0 * len(envs), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    plotted = False
    for ax, env in zip(axes, envs, strict=True):
        runs = [e for e in stats.used if e.env == env]
        per_step = {e.workdir: episodes_per_step(e) for e in runs}
        episodes = all(per_step.values())
        for label in dict.fromkeys(e.label for e in runs):
            mine = [e for e in runs if e.label == label]
            series = [
                [
                    (r["step"] * (per_step[e.workdir] if episodes else 1), r[key])
                    for r in _metrics_rows(e, cache)
                    if key in r and "step" in r
                ]
                for e in mine
            ]
            xs, mean, lo, hi, _ = results.curve_bands(series, LEVEL)
            if not xs:
                continue
            marker = "o" if len(xs) < 30 else None
            (line,) = ax.plot(xs, mean, marker=marker, ms=3, label=f"{label} ({len(mine)} seeds)")
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            plotted = True
        ax.set_title(env)
        ax.set_xlabel("episodes" if episodes else "step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"{key}: mean over seeds, band = {LEVEL:.0%} t interval")
    if plotted:
        fig.savefig(png, dpi=100)
    return plotted


def latex_escape(text: str) -> str:
    out = []
    for ch in str(text):
        if ch in "&%$#_{}":
            out.append("\\" + ch)
        elif ch == "\\":
            out.append(r"\textbackslash{}")
        elif ch in "~^":
            out.append({"~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}[ch])
        else:
            out.append(ch)
    return "".join(out)


def to_latex(table: Table, title: str) -> str:
    m = len(table.metrics)
    arrow = {"max": r"$\uparrow$", "min": r"$\downarrow$"}
    lines = [
        "% Made by scripts/make_table.py; needs \\usepackage{booktabs}.",
        r"\begin{table}[t]",
        r"\centering",
        r"\begin{tabular}{l" + "r" * (m * len(table.envs)) + "}",
        r"\toprule",
    ]
    groups = [rf"\multicolumn{{{m}}}{{c}}{{{latex_escape(env)}}}" for env in table.envs]
    lines.append(" & " + " & ".join(groups) + r" \\")
    rules = [f"\\cmidrule(lr){{{2 + i * m}-{1 + (i + 1) * m}}}" for i in range(len(table.envs))]
    lines.append(" ".join(rules))
    names = [f"{latex_escape(k)} {arrow[g]}" for _ in table.envs for k, g in table.metrics]
    lines += ["variant & " + " & ".join(names) + r" \\", r"\midrule"]
    for row in table.rows:
        cells = [latex_escape(row)]
        for env in table.envs:
            for key, _ in table.metrics:
                stat = table.cells.get((row, env, key))
                if stat is None:
                    cells.append("--")
                    continue
                text = cell_text(stat, pm=r"$\pm$")
                text = rf"\textbf{{{text}}}" if (row, env, key) in table.best else text
                cells.append(f"{text} ({stat.n})")
        lines.append(" & ".join(cells) + r" \\")
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        rf"\caption{{{latex_escape(title)}: mean $\pm$ sample standard deviation (ddof=1) over "
        r"seeds, number of seeds in parentheses; bold: best mean per column.}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def plot_env_curves(entries: list[Entry], env: str, keys: list[str], png: str) -> bool:
    """Per variant: mean over seeds of each key against the step, min-max band. False if empty."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    done = [e for e in entries if e.status == "complete" and e.env == env]
    fig = Figure(figsize=(6.5, 3.0 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    plotted = False
    for ax, key in zip(axes, keys, strict=True):
        for label in dict.fromkeys(e.label for e in done):
            runs = [e for e in done if e.label == label]
            series = [_series(e.workdir, key) for e in runs]
            xs, mean, lo, hi, _ = results.curve_stats(series)
            if not xs:
                continue
            marker = "o" if len(xs) < 30 else None
            (line,) = ax.plot(xs, mean, marker=marker, ms=3, label=f"{label} (n={len(runs)})")
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            plotted = True
        ax.set_title(f"{key}: mean over seeds, band = min-max")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(env)
    if plotted:
        fig.savefig(png, dpi=100)
    return plotted


def _series(workdir: str, key: str) -> list[tuple[float, float]]:
    rows = writers.read_metrics(os.path.join(workdir, results.METRICS_NAME))
    return [(r["step"], r[key]) for r in rows if key in r and "step" in r]


def check_keys(entries: list[Entry], metrics: list[tuple[str, str]], curve_keys: list[str]) -> None:
    """Raises ValueError for a --metric or --curve_key that no complete run has (a typo).

    The defaults are exempt: a sweep may lack one of them (no OOD split, say).
    """
    done = [e for e in entries if e.status == "complete"]
    if not done:
        return
    default_metrics = [results.parse_metric(m)[0] for m in DEFAULT_METRICS.split(",")]
    known = {}
    for e in done:
        known.update(sweep_lib.flatten(e.summary or {}))
    for key, _ in metrics:
        if key not in known and key not in default_metrics:
            numbers = sorted(
                k
                for k, v in known.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            )
            raise ValueError(
                f"--metric={key!r} is in no complete run's summary.json; allowed: {numbers}"
            )
    todo = [k for k in curve_keys if k not in DEFAULT_CURVES.split(",")]
    if todo:
        names = set()
        for e in done:
            for row in writers.read_metrics(os.path.join(e.workdir, results.METRICS_NAME)):
                names.update(row)
        for key in todo:
            if key not in names:
                raise ValueError(
                    f"--curve_key={key!r} is in no complete run's metrics.jsonl; allowed: "
                    f"{sorted(names - {'step', 'wall_time'})}"
                )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = config_utils.ArgumentParser(
        description="Tables and curves from a sweep directory.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sweep", required=True, help="sweep directory (holds sweep.json)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--metric", default=DEFAULT_METRICS, help="KEY[:max|:min], comma separated")
    p.add_argument("--curve_key", default=DEFAULT_CURVES, help="metrics.jsonl keys, commas")
    p.add_argument("--title", default=None, help="table title (default: the study name)")
    p.add_argument(
        "--strip", default="", help="regex removed from row labels (merge rows across envs)"
    )
    p.add_argument("--only", default=None, help="only runs whose name contains this")
    p.add_argument(
        "--exclude", default=None, help="drop runs whose name matches this regex (seed=0$)"
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help=f"also copy the runs' summaries, configs and cut metrics into --out/{RAW_DIR}/, a "
        "sweep directory this script remakes the tables and curves from",
    )
    p.add_argument(
        "--allow_mixed",
        action="store_true",
        help="pool runs of different commits or configs (listed in table.md)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="row to pair every other row with, seed by seed (a label, or the value of one of "
        "its parts: grpo for credit.name=grpo); adds the diff_vs_<baseline> columns",
    )
    p.add_argument(
        "--p_test",
        default="t",
        choices=P_TESTS,
        help="p-value of the paired difference: paired t-test or exact sign-flip test",
    )
    p.add_argument(
        "--reach", type=float, default=0.3, help="level for the episodes-to-reach columns"
    )
    p.add_argument("--lr_key", default=DEFAULT_LR_KEY, help="config key of a learning-rate sweep")
    p.add_argument(
        "--lr_select",
        default=DEFAULT_LR_SELECT,
        help="KEY[:min] the learning rate of each row is chosen on: a metrics.jsonl key (mean "
        "of its last quarter) or a summary.json key; never a held-out split",
    )
    p.add_argument(
        "--lr_from",
        default=None,
        help="an earlier stage's lr_sweep.csv whose selected learning rates the table keeps "
        "(instead of choosing on --lr_select again, now that the chosen rates have more seeds)",
    )
    return p.parse_args(argv)


def _check_regex(flag: str, pattern: str | None) -> None:
    """A one-line ValueError when --`flag`'s `pattern` is not a regular expression."""
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"--{flag}={pattern!r}: {e}; allowed: a regular expression") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keys = [k for k in args.curve_key.split(",") if k]
    try:
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise ValueError(f"--out={args.out!r} is a file; allowed: a directory")
        for flag in ("strip", "exclude"):
            _check_regex(flag, getattr(args, flag))
        metrics = [results.parse_metric(m) for m in args.metric.split(",") if m]
        if not metrics:
            raise ValueError(f"--metric={args.metric!r}; allowed: KEY[:max|:min], comma separated")
        entries = load_entries(args.sweep, args.strip, args.only, args.exclude)
        if not entries and args.only is not None:
            names = ", ".join(e.name for e in load_entries(args.sweep, args.strip)[:5])
            raise ValueError(f"--only={args.only!r} matches no run; runs: {names}, ...")
        check_keys(entries, metrics, keys)
        with open(os.path.join(args.sweep, results.PLAN_NAME)) as f:
            plan = json.load(f)
        varied = varied_keys(plan["runs"])
        table = aggregate(entries, metrics, varied, allow_mixed=args.allow_mixed)
        stats = statistics(
            entries,
            metrics,
            baseline=args.baseline,
            p_test=args.p_test,
            reach=args.reach,
            lr_key=args.lr_key,
            lr_select=args.lr_select,
            lr_fixed=None if args.lr_from is None else results.read_lr_choice(args.lr_from),
        )
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    title = args.title or plan["study"]
    done = [e for e in entries if e.status == "complete"]
    unknown = [e for e in done if e.provenance is None]
    if unknown:
        print(
            f"warning: {len(unknown)} of {len(done)} complete runs have no provenance.json "
            f"(made before it was recorded; e.g. {unknown[0].name!r}): their commit is unknown",
            file=sys.stderr,
        )
    mixed = pooling_problems(entries, varied) if args.allow_mixed else []
    os.makedirs(args.out, exist_ok=True)
    pngs = []
    for env in table.envs:
        png = f"curves_{env}.png"
        if keys and plot_env_curves(entries, env, keys, os.path.join(args.out, png)):
            pngs.append(png)
    if keys and plot_learning_curves(stats, keys[0], os.path.join(args.out, CURVES_PNG)):
        pngs.append(CURVES_PNG)
    markdown = to_markdown(table, title, entries, pngs, mixed, stats_markdown(stats, args.baseline))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(args.out, "table.tex"), "w") as f:
        f.write(to_latex(table, title))
    write_stats_csv(stats.rows, stats.columns, os.path.join(args.out, "table.csv"))
    written = ["table.md", "table.csv", "table.tex", "runs.csv"]
    if stats.lr_rows:
        write_stats_csv(stats.lr_rows, LR_COLUMNS, os.path.join(args.out, LR_SWEEP_CSV))
        written.append(LR_SWEEP_CSV)
    runs_csv(entries, metrics, os.path.join(args.out, "runs.csv"))
    if args.raw:
        keep = set(keys) | {curve_key_of(k) for k, _ in metrics} | {args.lr_select.split(":")[0]}
        save_raw(args.sweep, entries, keep, args.out)
        written.append(f"{RAW_DIR}/")
    print(markdown)
    print(f"wrote {args.out}: " + ", ".join(written + pngs))
    if not any(e.status == "complete" for e in entries):
        print("error: no run of the sweep is complete", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
