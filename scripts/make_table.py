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

Provenance: each run's provenance.json (rl4agents.provenance, written by train.py) gives its
git commit, uncommitted changes, JAX version and devices; table.md ends with them (one line
when every run agrees, else one line per kind with its runs). The table refuses, in one
`error:` line naming two runs and what differs, to pool complete runs made at different
commits, or runs of one base config and environment whose configs differ beyond the seed and
the keys the sweep sets per run (its variants); `--allow_mixed` pools them anyway and lists
the differences in table.md. Runs without provenance.json (made before it was recorded) count
as "unknown": a warning on stderr, no refusal; a table of such runs only is as before.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import re
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


def load_entries(sweep_dir: str, strip: str = "", only: str | None = None) -> list[Entry]:
    """Every run of `<sweep_dir>/sweep.json` with its status, summary and config.

    `strip`: a regular expression removed from every row label, e.g. the environment part of
    a config argument ("frozen_lake8,grpo" -> "grpo") so that one row spans the environments.
    `only`: keep the runs whose name contains it (as `scripts/sweep.py --only`).
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
    table: Table, title: str, entries: list[Entry], pngs: list[str], mixed: list[str] = ()
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
    for png in pngs:
        lines += ["", f"![{os.path.splitext(png)[0]}]({png})"]
    return "\n".join(lines) + "\n"


def describe_provenance(record: dict | None) -> str:
    """ "commit 275943f (clean), jax 0.10.2, 8 cpu devices", or "unknown (no provenance.json)"."""
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


def to_csv(table: Table, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "env", "metric", "goal", "mean", "std", "n", "best"])
        for row in table.rows:
            for env in table.envs:
                for key, goal in table.metrics:
                    s = table.cells.get((row, env, key))
                    if s is not None:
                        std = "" if s.std is None else repr(s.std)
                        best = int((row, env, key) in table.best)
                        w.writerow([row, env, key, goal, repr(s.mean), std, s.n, best])


def runs_csv(entries: list[Entry], metrics: list[tuple[str, str]], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "variant", "env", "seed", "status", "detail"] + [k for k, _ in metrics])
        for e in entries:
            values = [results.get_dotted(e.summary or {}, k) for k, _ in metrics]
            values = ["" if v is None else v for v in values]
            w.writerow([e.name, e.label, e.env, e.seed, e.status, e.detail] + values)


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
        "--allow_mixed",
        action="store_true",
        help="pool runs of different commits or configs (listed in table.md)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keys = [k for k in args.curve_key.split(",") if k]
    try:
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise ValueError(f"--out={args.out!r} is a file; allowed: a directory")
        try:
            re.compile(args.strip)
        except re.error as e:
            raise ValueError(
                f"--strip={args.strip!r}: {e}; allowed: a regular expression"
            ) from None
        metrics = [results.parse_metric(m) for m in args.metric.split(",") if m]
        if not metrics:
            raise ValueError(f"--metric={args.metric!r}; allowed: KEY[:max|:min], comma separated")
        entries = load_entries(args.sweep, args.strip, args.only)
        if not entries and args.only is not None:
            names = ", ".join(e.name for e in load_entries(args.sweep, args.strip)[:5])
            raise ValueError(f"--only={args.only!r} matches no run; runs: {names}, ...")
        check_keys(entries, metrics, keys)
        with open(os.path.join(args.sweep, results.PLAN_NAME)) as f:
            plan = json.load(f)
        varied = varied_keys(plan["runs"])
        table = aggregate(entries, metrics, varied, allow_mixed=args.allow_mixed)
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
    markdown = to_markdown(table, title, entries, pngs, mixed)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(args.out, "table.tex"), "w") as f:
        f.write(to_latex(table, title))
    to_csv(table, os.path.join(args.out, "table.csv"))
    runs_csv(entries, metrics, os.path.join(args.out, "runs.csv"))
    print(markdown)
    print(f"wrote {args.out}: table.md, table.csv, table.tex, runs.csv, " + ", ".join(pngs))
    if not any(e.status == "complete" for e in entries):
        print("error: no run of the sweep is complete", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
