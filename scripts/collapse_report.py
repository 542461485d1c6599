"""Per run of a learning study: did the groups stop differing, and which tasks moved?

  python scripts/collapse_report.py --results=experiments/results/learning_base_v5_t1

Reads a results folder written by scripts/paired_eval.py: `run_data/<env>_seed<k>/
metrics.jsonl` (each run's per-step training metrics) and, where it is there, `per_task.csv`
(the base policy's and each run's outcome on every held-out task). Writes `diagnosis.csv` and
`diagnosis.md` beside them, one row per run:

  steps             the run's last training step
  entropy_start     `train/entropy` (nats per action token) at the first step
  entropy_late      its median over the steps after --after
  zero_std_late     median share of the batch's task groups whose samples all got the same
                    reward (`train/zero_std_groups`: GRPO's advantage is 0 there) after --after
  all_zero_late     share of the steps after --after on which every group had that (the
                    update's gradient is exactly 0)
  success_start     mean batch success (`train/success`, sampled) over the first --window steps
  success_end       the same over the last --window steps
  mi_gap_late       median of RAGEN-2's prompt mutual-information proxy (`train/mi/gap`) after
                    --after, for runs that logged it (`log.mi_proxy`)
  gained, lost      held-out tasks the run solves greedily and the base does not, and the
                    reverse (per_task.csv)
  sampled_gained, sampled_lost
                    the same for sampled play

The echo trap (RAGEN, arXiv 2504.20073) shows as zero_std_late near 1 with a small
entropy_late: the policy samples the same episode for most tasks and the batch's updates rest on
the few groups left. A cell is empty when the run has no such data.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents import results  # noqa: E402
from rl4agents.train import writers  # noqa: E402

COLUMNS = (
    "env", "seed", "steps", "entropy_start", "entropy_late", "zero_std_late", "all_zero_late",
    "success_start", "success_end", "mi_gap_late", "gained", "lost", "sampled_gained",
    "sampled_lost",
)  # fmt: skip
_RUN = re.compile(r"(?P<env>.+)_seed(?P<seed>\d+)")


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def run_stats(rows: list[dict], after: int, window: int) -> dict:
    """The training columns of one run from its metrics.jsonl rows (module docstring)."""
    train = [r for r in rows if "train/success" in r]
    if not train:
        return {}
    late = [r for r in train if r["step"] > after]

    def values(key, subset):
        return [float(r[key]) for r in subset if key in r]

    zero = values("train/zero_std_groups", late)
    entropy = values("train/entropy", train)
    return {
        "steps": max(r["step"] for r in train),
        "entropy_start": entropy[0] if entropy else None,
        "entropy_late": _median(values("train/entropy", late)),
        "zero_std_late": _median(zero),
        "all_zero_late": _mean([float(z >= 1.0) for z in zero]),
        "success_start": _mean(values("train/success", train[:window])),
        "success_end": _mean(values("train/success", train[-window:])),
        "mi_gap_late": _median(values("train/mi/gap", late)),
    }


def task_changes(per_task: list[dict], env: str, seed: int) -> dict:
    """Tasks gained and lost against the base policy, greedy and sampled, for one run."""
    base = {r["task"]: r for r in per_task if r["env"] == env and r["policy"] == "base"}
    mine = [r for r in per_task if r["env"] == env and r["policy"] == "rl" and r["seed"] == seed]
    if not base or not mine:
        return {}
    out = {}
    for mode, prefix in (("greedy", ""), ("sampled", "sampled_")):
        key = f"{mode}_success"
        pairs = [(float(base[r["task"]][key]), float(r[key])) for r in mine]
        out[f"{prefix}gained"] = sum(b < a for b, a in pairs)
        out[f"{prefix}lost"] = sum(b > a for b, a in pairs)
    return out


def report(folder: str, after: int, window: int) -> list[dict]:
    """One row per run folder under `folder`/run_data (COLUMNS), sorted by env then seed."""
    root = os.path.join(folder, "run_data")
    if not os.path.isdir(root):
        raise ValueError(f"--results={folder!r} has no run_data/; allowed: a paired_eval --out")
    per_task = results.read_csv(os.path.join(folder, results.PER_TASK_NAME))
    found = []
    for name in os.listdir(root):
        m = _RUN.fullmatch(name)
        if m:
            found.append((m["env"], int(m["seed"]), name))
    rows = []
    for env, seed, name in sorted(found):
        metrics = writers.read_metrics(os.path.join(root, name, results.METRICS_NAME))
        row = {"env": env, "seed": seed}
        row.update(run_stats(metrics, after, window))
        row.update(task_changes(per_task, env, seed))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", required=True, help="A scripts/paired_eval.py --out folder.")
    ap.add_argument("--after", type=int, default=40, help="Late steps: those after this one.")
    ap.add_argument("--window", type=int, default=10, help="Steps averaged at start and end.")
    args = ap.parse_args()
    if args.after < 0 or args.window < 1:
        sys.exit(
            f"error: --after={args.after} --window={args.window}; allowed: --after >= 0, "
            "--window >= 1"
        )
    try:
        rows = report(args.results, args.after, args.window)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if not rows:
        sys.exit(f"error: --results={args.results!r}: no run_data/<env>_seed<k> folder")
    writers.write_csv(os.path.join(args.results, "diagnosis.csv"), rows, COLUMNS)
    table = writers.format_table(rows, list(COLUMNS))
    with open(os.path.join(args.results, "diagnosis.md"), "w") as f:
        f.write(
            f"# Collapse and task changes per run (late: steps after {args.after})\n\n"
            f"Made by `python scripts/collapse_report.py --results={args.results} "
            f"--after={args.after} --window={args.window}`; columns in its docstring.\n\n"
            f"{table}\n"
        )
    print(table)


if __name__ == "__main__":
    main()
