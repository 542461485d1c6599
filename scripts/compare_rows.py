"""Paired difference between two studies' rows of one environment, seed by seed and task by task.

  python scripts/compare_rows.py --a=experiments/results/learning_base_v5_t1 \
      --b=experiments/results/learning_base_v5 --env=frozen_lake

Both folders are scripts/paired_eval.py outputs whose runs of `--env` were evaluated on the same
tasks (the same `--num_tasks` and evaluation seed; tasks are compared by index, and the two base
rows' greedy outcomes must agree task for task, which the script checks; sampled play is at each
study's own temperature, so where the base's sampled outcomes differ that mode is skipped).
Seed k of A is paired with seed k of B (studies that share their seeds start from the same
rollout keys), and the interval of the mean difference A - B resamples seeds and tasks
(`results.paired_bootstrap_ci`). Prints one JSON line per mode (greedy, sampled): the two
means, the difference, its 95% interval, the seeds paired and the tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents import results  # noqa: E402


def outcomes(folder: str, env: str, policy: str, key: str) -> dict[str, np.ndarray]:
    """seed -> f[N] of `key` for `policy` ("base" or "rl") of `env` in `folder`/per_task.csv,
    in task order (the base row has seed "")."""
    path = os.path.join(folder, results.PER_TASK_NAME)
    if not os.path.exists(path):
        raise ValueError(f"{folder!r} has no per_task.csv; allowed: a paired_eval.py --out")
    rows: dict[str, list[tuple[int, float]]] = {}
    for r in results.read_csv(path):
        if r["env"] == env and r["policy"] == policy:
            rows.setdefault(str(r["seed"]), []).append((int(r["task"]), float(r[key])))
    return {s: np.array([v for _, v in sorted(pairs)]) for s, pairs in rows.items()}


def compare(a: str, b: str, env: str, samples: int = 10000) -> list[dict]:
    """One dict per mode: mean_a, mean_b, diff (A - B), ci_low, ci_high, seeds, tasks (or
    `skipped` with the reason)."""
    out = []
    for mode in ("greedy", "sampled"):
        key = f"{mode}_success"
        base_a, base_b = outcomes(a, env, "base", key), outcomes(b, env, "base", key)
        if not base_a or not base_b:
            raise ValueError(f"{env!r} has no base row in {a if not base_a else b!r}")
        if not np.array_equal(base_a[""], base_b[""]):
            if mode == "greedy":
                raise ValueError(
                    f"the base policy's greedy outcomes of {env!r} differ between {a!r} and "
                    f"{b!r}; allowed: folders evaluated on the same tasks from the same start"
                )
            # Sampled play is at each study's own temperature: another policy to compare.
            out.append({"env": env, "mode": mode, "skipped": "the base's outcomes differ"})
            continue
        rl_a, rl_b = outcomes(a, env, "rl", key), outcomes(b, env, "rl", key)
        seeds = sorted(set(rl_a) & set(rl_b), key=int)
        if not seeds:
            raise ValueError(f"no seed of {env!r} is in both {a!r} and {b!r}")
        xa = np.stack([rl_a[s] for s in seeds])
        xb = np.stack([rl_b[s] for s in seeds])
        diff, low, high = results.paired_bootstrap_ci(xa, xb, samples=samples)
        out.append(
            {
                "env": env,
                "mode": mode,
                "mean_a": float(xa.mean()),
                "mean_b": float(xb.mean()),
                "diff": diff,
                "ci_low": low,
                "ci_high": high,
                "seeds": len(seeds),
                "tasks": xa.shape[1],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="A paired_eval.py --out folder.")
    ap.add_argument("--b", required=True, help="Another, evaluated on the same tasks.")
    ap.add_argument("--env", required=True)
    ap.add_argument("--samples", type=int, default=10000, help="Bootstrap resamples.")
    args = ap.parse_args()
    try:
        rows = compare(args.a, args.b, args.env, args.samples)
    except ValueError as e:
        sys.exit(f"error: {e}")
    for row in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))


if __name__ == "__main__":
    main()
