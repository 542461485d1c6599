"""The headline learning table: one row per environment, chosen from the learning studies.

  python scripts/learning_table.py --out=experiments/results/learning \
      --base=runs/base_policy_v2r \
      experiments/results/learning/study_15min experiments/results/learning_fixes \
      experiments/results/maze_length_bias experiments/results/learning_full_budget

Every source is a folder written by `scripts/paired_eval.py` (its `table.csv`, and
`run_data/<env>_seed<k>/config.json` for each run). A source row is eligible for the headline
when its runs started from `--base` (their `init.params`; with `--base_digest`, also the same
weights: paired_eval's `base_digest` column), it has at least `--min_seeds` seeds
and `--min_tasks` evaluation tasks, and its runs took at most `--max_minutes` each. Per
environment the eligible row with the highest lower 95% bound (`delta_ci_low`) is chosen; a tie
goes to the later source. Choosing the best of several attempts favours the chosen row, so the
table says how many were eligible (`attempts`) and `attempts.csv` lists every source row,
eligible or not, with the reason when it is not. A source named in `--confirmatory` (a
registered confirmation of an earlier row, run on new seeds) heads its environments when its
row is eligible, whatever its lower bound: its result replaces the exploratory rows it was
run to confirm, and the table marks it (`confirmatory`).

Writes to --out:
  table.csv     the issue's columns (env,base_test,rl_test,delta,delta_ci_low,delta_ci_high,
                seeds,eval_tasks,minutes), `delta_mde80` (the smallest true change in greedy
                success the row's evaluation would detect with 80% probability at the 5%
                level, from its interval's width: `results.detectable_difference`, normal
                approximation; a null's power), then the source row's other columns, `study`
                (the source folder's path from --out's parent, such as
                `learning_v5_rebuild/t1`), `confirmatory` (1 for a --confirmatory source),
                `settings` (the runs' training settings that differ from the environment's
                defaults in `configs/base_policy.py`) and `attempts`;
  table.md      the same as Markdown;
  attempts.csv  every source row with `study`, `confirmatory`, `settings`, `start` (the runs'
                start policy), `eligible` and `why_not`.
Environments with no eligible row are absent from the table (and listed on stdout).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents import checkpoint, results  # noqa: E402
from rl4agents.train import writers  # noqa: E402

COLUMNS = results.LEARNING_COLUMNS


def read_rows(source: str) -> list[dict]:
    """The rows of `source`/table.csv, as strings."""
    path = os.path.join(source, "table.csv")
    if not os.path.exists(path):
        raise ValueError(f"source {source!r} has no table.csv; allowed: a paired_eval.py --out")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}")
    return rows


def study_name(source: str, out: str) -> str:
    """`source`'s path relative to `out`'s parent folder (the folder that holds every study's
    results), or its own name when it lies elsewhere."""
    parent = os.path.dirname(os.path.abspath(os.path.normpath(out)))
    rel = os.path.relpath(os.path.abspath(source), parent)
    return os.path.basename(os.path.normpath(source)) if rel.startswith("..") else rel


def start_policy(source: str, env: str) -> str:
    """The `init.params` the runs of `env` in `source` started from ("" when unknown; an error
    when they differ)."""
    starts = set()
    for path in sorted(glob.glob(os.path.join(source, "run_data", f"{env}_seed*", "config.json"))):
        with open(path) as f:
            starts.add(json.load(f).get("init", {}).get("params", ""))
    if len(starts) > 1:
        raise ValueError(f"{source}: the {env} runs start from {sorted(starts)}; allowed: one")
    return starts.pop() if starts else ""


# Config fields that are the study's budget, bookkeeping or start, not a training setting.
_NOT_SETTINGS = ("train.", "init.", "log.", "checkpoint.", "seed", "pretrain.", "distributed.")


def settings(source: str, env: str) -> str:
    """The training settings of the `env` runs in `source` that differ from the environment's
    defaults (`configs/base_policy.py:<env>`), as "key=value" joined by spaces ("defaults" when
    none, "" when the source kept no config)."""
    from configs import base_policy  # the environment's defaults

    paths = sorted(glob.glob(os.path.join(source, "run_data", f"{env}_seed*", "config.json")))
    if not paths:
        return ""
    with open(paths[0]) as f:
        run = checkpoint.flatten(json.load(f))
    default = checkpoint.flatten(json.loads(base_policy.get_config(env).to_json_best_effort()))
    diff = [
        f"{k}={run[k]}"
        for k in sorted(run)
        if k in default and run[k] != default[k] and not k.startswith(_NOT_SETTINGS)
    ]
    return " ".join(diff) or "defaults"


def why_not(row: dict, start: str, args) -> str:
    """ "" when `row` is eligible, else the first rule it breaks."""
    if os.path.normpath(start) != os.path.normpath(args.base):
        return f"start policy {start or 'unknown'}"
    digest = args.base_digest
    if digest and row.get("base_digest") != digest:
        found = row.get("base_digest") or "none recorded"
        return f"another build of the start policy (base_digest {found})"
    if int(row["seeds"]) < args.min_seeds:
        return f"{row['seeds']} seeds"
    if int(row["eval_tasks"]) < args.min_tasks:
        return f"{row['eval_tasks']} evaluation tasks"
    if float(row["minutes"]) > args.max_minutes:
        return f"{row['minutes']} minutes per run"
    return ""


def choose(attempts: list[dict]) -> list[dict]:
    """Per environment (in first-seen order), the eligible attempt with the highest
    `delta_ci_low` (the later one on a tie), unless an eligible attempt is `confirmatory`: then
    that one (the later, if several); with `attempts`: the eligible count."""
    best: dict[str, dict] = {}
    count: dict[str, int] = {}
    for row in attempts:
        if row["eligible"]:
            env = row["env"]
            count[env] = count.get(env, 0) + 1
            held = best.get(env)
            if (
                held is None
                or row.get("confirmatory")
                or (
                    not held.get("confirmatory")
                    and float(row["delta_ci_low"]) >= float(held["delta_ci_low"])
                )
            ):
                best[env] = row
    return [{**row, "attempts": count[env]} for env, row in best.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sources", nargs="+", help="paired_eval.py output folders, oldest first")
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", required=True, help="the start policy every chosen row shares")
    ap.add_argument(
        "--base_digest",
        default=None,
        help="the start policy's checkpoint.params_digest: rows evaluated from another build "
        "of --base (the same path, other weights) or with no digest recorded are not eligible",
    )
    ap.add_argument(
        "--confirmatory",
        default="",
        help="comma-separated sources (among the positional ones) that are registered "
        "confirmations: their eligible rows head their environments",
    )
    ap.add_argument("--min_seeds", type=int, default=3)
    ap.add_argument("--min_tasks", type=int, default=512)
    ap.add_argument("--max_minutes", type=float, default=20.0)
    args = ap.parse_args()
    confirmatory = {os.path.normpath(c) for c in args.confirmatory.split(",") if c}
    unknown = sorted(confirmatory - {os.path.normpath(s) for s in args.sources})
    if unknown:
        ap.error(f"--confirmatory names {unknown}; allowed: sources given as positional arguments")
    attempts, extra = [], []
    for source in args.sources:
        for row in read_rows(source):
            start = start_policy(source, row["env"])
            reason = why_not(row, start, args)
            study = study_name(source, args.out)
            attempts.append(
                {
                    **row,
                    "delta_mde80": mde80(row),
                    "study": study,
                    "confirmatory": int(os.path.normpath(source) in confirmatory),
                    "settings": settings(source, row["env"]),
                    "start": start,
                    "eligible": not reason,
                    "why_not": reason,
                }
            )
            header = [c for c in row if c not in COLUMNS and c != "variant"]
            # The widest header's order first (a newer source has every older column).
            extra = (
                header + [c for c in extra if c not in header]
                if len(header) > len(extra)
                else extra + [c for c in header if c not in extra]
            )
    table = choose(attempts)
    columns = [*COLUMNS, "delta_mde80", *extra, "study", "confirmatory", "settings", "attempts"]
    os.makedirs(args.out, exist_ok=True)
    writers.write_csv(os.path.join(args.out, "table.csv"), table, columns, ignore_extra=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(writers.format_table([_numbers(r) for r in table], columns) + "\n")
    writers.write_csv(
        os.path.join(args.out, "attempts.csv"),
        attempts,
        [
            *COLUMNS,
            "delta_mde80",
            *extra,
            "study",
            "confirmatory",
            "settings",
            "start",
            "eligible",
            "why_not",
        ],
        ignore_extra=True,
    )
    for row in table:
        print(
            f"{row['env']}: {row['delta']} [{row['delta_ci_low']}, {row['delta_ci_high']}] "
            f"from {row['study']} "
            + ("(confirmatory" if row["confirmatory"] else "(best")
            + f" of {row['attempts']} eligible; detectable at 80%: {row['delta_mde80']})"
        )
    chosen = {r["env"] for r in table}
    for env in dict.fromkeys(r["env"] for r in attempts if r["env"] not in chosen):
        print(f"{env}: no eligible row")
    improved = sum(float(r["delta_ci_low"]) > 0 for r in table)
    print(f"{improved} of {len(table)} environments improved (95% interval above 0)")


def mde80(row: dict) -> float | str:
    """The smallest true change the row's paired evaluation detects with 80% probability at
    the 5% level, from its bootstrap interval (normal approximation), to 4 decimals; "" for a
    row without an interval."""
    try:
        low, high = float(row["delta_ci_low"]), float(row["delta_ci_high"])
    except (KeyError, TypeError, ValueError):
        return ""
    return round(results.detectable_difference(low, high), 4)


def _numbers(row: dict) -> dict:
    """`row` with its numeric strings as numbers (right-aligned in Markdown); values that are
    numbers already stay as they are."""
    out = {}
    for key, value in row.items():
        out[key] = value
        if not isinstance(value, str):
            continue
        for kind in (int, float):
            try:
                out[key] = kind(value)
                break
            except (TypeError, ValueError):
                pass
    return out


if __name__ == "__main__":
    main()
