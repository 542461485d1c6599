"""Paired change of held-out greedy success, temperature 0.5 against temperature 1, per env.

Both studies' runs start from base v4 with the same seeds and are evaluated on the same 512
held-out tasks, so run (seed s, task i) at 0.5 pairs with run (seed s, task i) at 1. The
interval resamples seeds, then tasks (10,000 replicates, seed 0 per environment).

  python experiments/results/learning_v4_temperature/compare_t1.py   # from the project root
"""

import csv
import os

import numpy as np

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
        rng = np.random.default_rng(0)  # per environment: rows do not depend on the others
        a, b = greedy(T05, env), greedy(T1, env)
        seeds = sorted(set(a) & set(b))
        d = np.stack([a[s] - b[s] for s in seeds])  # f[S, N]
        s_n, t_n = d.shape
        reps = []
        for _ in range(10000):
            rows = d[rng.integers(0, s_n, s_n)]
            reps.append(rows[:, rng.integers(0, t_n, t_n)].mean())
        lo, hi = np.percentile(reps, [2.5, 97.5])
        t1 = np.mean([b[s].mean() for s in seeds])
        t05 = np.mean([a[s].mean() for s in seeds])
        print(f"{env},{s_n},{t_n},{t1:.4f},{t05:.4f},{d.mean():+.4f},{lo:+.4f},{hi:+.4f}")


if __name__ == "__main__":
    main()
