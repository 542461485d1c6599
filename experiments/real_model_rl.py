"""RL of a real pretrained chat model: SmolLM2-135M-Instruct with LoRA on guess_number, for an
hour, evaluated against its own zero-shot policy on held-out tasks.

  python scripts/get_model.py smollm2-135m-instruct --out=runs/models/smollm2-135m-instruct
  python scripts/sweep.py experiments/real_model_rl.py --workers=1
  python scripts/paired_eval.py --sweep=runs/sweeps/real_model_rl \
      --out=experiments/results/real_model/rl --num_tasks=512 --task_batch=128
  python experiments/real_model_rl.py --sweep=runs/sweeps/real_model_rl \
      --table=experiments/results/real_model/rl/table.csv \
      --out=experiments/results/real_model/rl_summary.json

The run is `configs/real_model.py:guess_number` (LoRA r16 on every projection, the
environment's instruction as system message, 4 tasks x 8 samples a step, GRPO at lr 1e-4)
for MINUTES of training and in-run evaluation, with the rollouts sampled at temperature 0.5
(`REAL_MODEL_RL_TEMPERATURE`) and the loss scoring the same tempered policy. At temperature 1
the checkpoint writes prose instead of a number in 88% of its sampled turns, where its greedy
turns are all valid (`experiments/results/real_model/zero_shot.csv`): a group's contrast would
be about the format, which greedy play already has, and not about which number to guess. The
project's own studies found the same: greedy success moved only where the sampled policy
stayed close to greedy play (`experiments/results/learning/why_greedy.md`).

guess_number is the task for it: a zero-shot chat model plays it validly and sometimes wins (a
uniformly random guesser solves about 12%), and its contexts are the shortest of the
project's tasks, so the hour buys the most steps.

`REAL_MODEL_RL_SEEDS` (default 1), `REAL_MODEL_RL_MINUTES` (default 60) and
`REAL_MODEL_RL_TEMPERATURE` (default 0.5) change the plan;
`REAL_MODEL_DIR` names another checkpoint folder.

`scripts/paired_eval.py` evaluates the checkpoint's own weights (LoRA adapters at zero) and
the run's final policy on the same 512 held-out tasks; this file's `main` writes
`rl_summary.json` from its table and the run's files: `base` and `final` held-out greedy
success, the paired change with its 95% interval (`delta_ci_low`, `delta_ci_high`: a bootstrap
over tasks, and over seeds when there are several), the curves (in-run held-out greedy success
and training success by step) and the peak resident memory of the run's process.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from rl4agents import results, sweep
from rl4agents.train import writers

ENV = "guess_number"
CONFIG = f"configs/real_model.py:{ENV}"
SUMMARY_KEYS = ("base", "final", "delta", "delta_ci_low", "delta_ci_high")


def get_sweep():
    seeds = int(os.environ.get("REAL_MODEL_RL_SEEDS", "1"))
    minutes = float(os.environ.get("REAL_MODEL_RL_MINUTES", "60"))
    temperature = float(os.environ.get("REAL_MODEL_RL_TEMPERATURE", "0.5"))
    fixed = {
        "train.max_minutes": minutes,
        "train.num_steps": 1000,
        "rollout.temperature": temperature,
    }
    if os.environ.get("REAL_MODEL_DIR"):
        fixed["model.checkpoint"] = os.environ["REAL_MODEL_DIR"]
    return sweep.product(sweep.configs([CONFIG]), sweep.fixed(fixed), sweep.seeds(seeds))


def rl_summary(sweep_dir: str, table_csv: str) -> dict:
    """The summary of the study's runs from paired_eval's table and the runs' own files.

    Args:
      sweep_dir: the sweep directory (holds sweep.json and the run folders).
      table_csv: scripts/paired_eval.py's table.csv for that sweep (its ENV row is used).

    Returns:
      {"env", "base", "final", "delta", "delta_ci_low", "delta_ci_high", "eval_tasks",
      "seeds", "sampled": {base, final, delta, ci_low, ci_high}, "runs": [per run: "seed",
      "steps", "minutes", "peak_rss_gb", "curves": {"eval_test/greedy_success": [[step,
      value], ...], "train/success": [...]}]}; the first block as in the table (greedy
      success on the held-out split).

    Raises:
      ValueError: no ENV row in the table, or no finished run in the sweep.
    """
    with open(table_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["env"] == ENV]
    if not rows:
        raise ValueError(f"{table_csv}: no {ENV!r} row; allowed: paired_eval's table of the sweep")
    (row,) = rows
    with open(os.path.join(sweep_dir, sweep.PLAN_NAME)) as f:
        plan = json.load(f)["runs"]
    runs = []
    for entry in plan:
        workdir = os.path.join(sweep_dir, entry["dir"])
        if not results.is_complete(workdir):
            continue
        summary = results.read_summary(workdir)
        metrics = writers.read_metrics(os.path.join(workdir, results.METRICS_NAME))
        curves = {
            key: [[r["step"], r[key]] for r in metrics if key in r]
            for key in ("eval_test/greedy_success", "train/success")
        }
        runs.append(
            {
                "seed": entry["seed"],
                "steps": summary["steps"],
                "minutes": round(summary["wall_s"] / 60, 1),
                "peak_rss_gb": summary.get("peak_rss_gb"),
                "curves": curves,
            }
        )
    if not runs:
        raise ValueError(f"--sweep={sweep_dir!r}: no finished run")
    value = lambda key: float(row[key])  # noqa: E731
    return {
        "env": ENV,
        "base": value("base_test"),
        "final": value("rl_test"),
        "delta": value("delta"),
        "delta_ci_low": value("delta_ci_low"),
        "delta_ci_high": value("delta_ci_high"),
        "eval_tasks": int(row["eval_tasks"]),
        "seeds": int(row["seeds"]),
        "sampled": {
            "base": value("base_sampled"),
            "final": value("rl_sampled"),
            "delta": value("sampled_delta"),
            "ci_low": value("sampled_ci_low"),
            "ci_high": value("sampled_ci_high"),
        },
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="rl_summary.json of the real-model RL run.")
    p.add_argument("--sweep", required=True, help="sweep directory (holds sweep.json)")
    p.add_argument("--table", required=True, help="scripts/paired_eval.py's table.csv")
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    try:
        out = rl_summary(args.sweep, args.table)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(json.dumps({k: out[k] for k in SUMMARY_KEYS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
