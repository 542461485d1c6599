"""The power of the confirmatory countdown run, from the 3-seed row it confirms.

python experiments/results/learning_v5_rebuild/confirm_lr1e-4_countdown/power.py

Reads the per-task outcomes of `../recipe_lr1e-4_countdown/per_task.csv` (base and 3 seeds on
512 held-out tasks) and fits the crossed model d[s, i] = mu + u[s] + t[i] + e[s, i] of the
per-seed, per-task change in greedy success (two-way ANOVA moments: e from the interaction
residual, t from the variance of the task means less e's share, u from the variance of the seed
means less e's share). The paired bootstrap's standard error for S seeds and N tasks is then
about sqrt(var_u / S + var_t / N + var_e / (S N)); printed per design: that standard error, the
interval's half-width (1.96 se), the change detected with 80% probability (2.80 se) and the
probability of detecting a true change of +0.024 (the 3-seed estimate) and +0.015.

The seed variance var_u rests on 3 seeds (2 degrees of freedom), so the last table repeats the
chosen design (5 seeds, 2,048 draws) with var_u taken from the lr 3e-4 row's 3 seeds
(`../t1/per_task.csv`), and with var_u 4 and 10 times the lr 1e-4 row's.
"""

import csv
import os
from statistics import NormalDist

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "recipe_lr1e-4_countdown", "per_task.csv")
OTHER_LR = os.path.join(HERE, "..", "t1", "per_task.csv")  # the same runs at lr 3e-4
DESIGNS = ((3, 512), (5, 512), (5, 1024), (5, 2048))


def components(path: str = SOURCE) -> tuple[float, float, float, float]:
    """(mean change, var_u, var_t, var_e) of the crossed model fitted to `path`."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["env"] == "countdown"]
    base = {int(r["task"]): float(r["greedy_success"]) for r in rows if r["policy"] == "base"}
    seeds = sorted({r["seed"] for r in rows if r["policy"] == "rl"})
    a = np.array(
        [
            [float(r["greedy_success"]) for r in sorted(
                (x for x in rows if x["policy"] == "rl" and x["seed"] == s),
                key=lambda x: int(x["task"]),
            )]
            for s in seeds
        ]
    )  # fmt: skip
    d = a - np.array([base[i] for i in range(a.shape[1])])[None, :]
    num_seeds, num_tasks = d.shape
    resid = d - d.mean(0)[None, :] - d.mean(1)[:, None] + d.mean()
    var_e = float((resid**2).sum() / ((num_seeds - 1) * (num_tasks - 1)))
    var_t = max(0.0, float(d.mean(0).var(ddof=1) - var_e / num_seeds))
    var_u = max(0.0, float(d.mean(1).var(ddof=1) - var_e / num_tasks))
    return float(d.mean()), var_u, var_t, var_e


def main() -> None:
    mean, var_u, var_t, var_e = components()
    normal = NormalDist()
    z, z80 = normal.inv_cdf(0.975), normal.inv_cdf(0.8)
    print(f"3-seed change {mean:+.4f}; var_u {var_u:.3g}, var_t {var_t:.4f}, var_e {var_e:.4f}")
    print("| seeds | tasks | se | 95% half-width | detectable (80%) | P(detect +0.024) "
          "| P(detect +0.015) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s, n in DESIGNS:
        se = (var_u / s + var_t / n + var_e / (s * n)) ** 0.5
        p24, p15 = (normal.cdf(effect / se - z) for effect in (0.024, 0.015))
        print(f"| {s} | {n} | {se:.4f} | {z * se:.4f} | {(z + z80) * se:.4f} | {p24:.2f} "
              f"| {p15:.2f} |")  # fmt: skip
    other_u = components(OTHER_LR)[1]
    print()
    print("| seed variance (5 seeds, 2,048 draws) | var_u | se | P(detect +0.024) |")
    print("|---|---:|---:|---:|")
    for label, u in (
        ("the lr 1e-4 row's", var_u),
        ("the lr 3e-4 row's", other_u),
        ("4 x the lr 1e-4 row's", 4 * var_u),
        ("10 x the lr 1e-4 row's", 10 * var_u),
    ):
        se = (u / 5 + var_t / 2048 + var_e / (5 * 2048)) ** 0.5
        print(f"| {label} | {u:.2e} | {se:.4f} | {normal.cdf(0.024 / se - z):.2f} |")


if __name__ == "__main__":
    main()
