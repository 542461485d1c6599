"""Paired change of held-out greedy success, temperature 0.5 against temperature 1, per env.

Both studies' runs start from base v4 with the same seeds and are evaluated on the same 512
held-out tasks, so run (seed s, task i) at 0.5 pairs with run (seed s, task i) at 1. The
interval is `rl4agents.results.paired_bootstrap_ci` (seeds and tasks resampled, 10,000
replicates, seed 0 per environment).

  python experiments/results/learning_v4_temperature/compare_t1.py   # from the project root
"""

import csv
import os

import numpy as np

from rl4agents import results

HERE = os.path.dirname(os.path.abspath(__file__))
T1 = os.path.join(os.path.dirname(HERE), "learning_base_v4", "per_task.csv")
T05 = os.path.join(HERE, "per_task.csv")


def greedy(path: str, env: str) -> dict[str, np.ndarray]:
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["env"] == env and r["policy"] == "rl"]
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["seed"], {})[int(r["task"])] = float(r["greedy_success"])
    return {s: np.array([v[i] for i in sorted(v)]) for s, v in out.items()}


def main() -> None:
    with open(T05) as f:
        envs = sorted({r["env"] for r in csv.DictReader(f)})
    print("env,seeds,tasks,t1,t05,diff,ci_low,ci_high")
    for env in envs:
        a, b = greedy(T05, env), greedy(T1, env)
        seeds = sorted(set(a) & set(b))
        a_s, b_s = np.stack([a[s] for s in seeds]), np.stack([b[s] for s in seeds])  # f[S, N]
        diff, lo, hi = results.paired_bootstrap_ci(a_s, b_s, samples=10000, seed=0)
        print(
            f"{env},{len(seeds)},{a_s.shape[1]},{b_s.mean():.4f},{a_s.mean():.4f},"
            f"{diff:+.4f},{lo:+.4f},{hi:+.4f}"
        )


if __name__ == "__main__":
    main()
