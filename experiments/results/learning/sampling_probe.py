"""How the base policy's sampled play relates to its greedy play under other sampling settings:
the held-out outcomes of the rebuild of base v5 (`runs/base_policy_v5`) with nucleus sampling
(`rollout.top_p`) and lower temperatures, task by task against its greedy outcomes. Writes
`sampling_probe.csv` beside this file (one row per environment and setting).

  python experiments/results/learning/sampling_probe.py \
      --envs=countdown,web_shop --settings=1:1,0.9:1,0.7:1,0.5:1,1:0.7,1:0.5

A setting is `top_p:temperature`. Each row plays the same 512 test tasks with the same
evaluation seed as `scripts/paired_eval.py` (one greedy and one sampled episode per task), so
its `top_p` 1, temperature 1 row equals the base rows of the learning studies' `per_task.csv`.
Columns: the greedy and sampled success, P(sampled ok | greedy fails), P(sampled fails |
greedy ok), and "new wins" = (1 - greedy) x P(sampled ok | greedy fails), the share of tasks on
which a sampled episode solves what greedy play does not.
"""

import argparse
import csv
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
sys.path.insert(0, os.path.join(os.path.abspath(_ROOT), "scripts"))
sys.path.insert(0, os.path.abspath(_ROOT))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import numpy as np  # noqa: E402
from where_signal import shares  # noqa: E402

from configs import base_policy  # noqa: E402
from rl4agents.train import experiment  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sampling_probe.csv")
FIELDS = (
    "env",
    "top_p",
    "temperature",
    "tasks",
    "greedy",
    "sampled",
    "ok_given_greedy_fails",
    "fails_given_greedy_ok",
    "new_wins",
)


def probe(env: str, top_p: float, temperature: float, base: str, num_tasks: int) -> dict:
    c = base_policy.env_config(env)
    c.unlock()
    c.init.params = base
    c.rollout.top_p = top_p
    c.rollout.temperature = temperature
    exp = experiment.build(c)
    params = exp.saved_params(base)
    out = jax.device_get(exp.task_outcomes_fn("test", num_tasks)(params, c.train.eval_seed))
    g, s = np.asarray(out["greedy_success"]), np.asarray(out["sampled_success"])
    ok_fail, fail_ok, new_wins = shares(g.tolist(), s.tolist())
    return {
        "env": env,
        "top_p": top_p,
        "temperature": temperature,
        "tasks": num_tasks,
        "greedy": round(float(g.mean()), 4),
        "sampled": round(float(s.mean()), 4),
        "ok_given_greedy_fails": round(ok_fail, 4),
        "fails_given_greedy_ok": round(fail_ok, 4),
        "new_wins": round(new_wins, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default="countdown,web_shop")
    ap.add_argument("--settings", default="1:1,0.7:1,1:0.5", help="top_p:temperature,...")
    ap.add_argument("--base", default=base_policy.CHECKPOINT)
    ap.add_argument("--num_tasks", type=int, default=512)
    args = ap.parse_args()
    settings = []
    for spec in args.settings.split(","):
        try:
            top_p, temperature = (float(x) for x in spec.split(":"))
        except ValueError:
            sys.exit(f"error: --settings entry {spec!r}; allowed: top_p:temperature numbers")
        settings.append((top_p, temperature))
    rows = []
    if os.path.exists(OUT):  # keep the rows of other settings
        with open(OUT) as f:
            rows = list(csv.DictReader(f))
    for env in args.envs.split(","):
        for top_p, temperature in settings:
            row = probe(env, top_p, temperature, args.base, args.num_tasks)
            print(row, flush=True)
            key = (env, str(top_p), str(temperature))
            rows = [r for r in rows if (r["env"], str(r["top_p"]), str(r["temperature"])) != key]
            rows.append(row)
    rows.sort(key=lambda r: (r["env"], -float(r["temperature"]), -float(r["top_p"])))
    with open(OUT, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
