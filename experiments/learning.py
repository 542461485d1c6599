"""RL from the base policy in every environment: GRPO, 3 seeds, 512 held-out tasks.

  python scripts/sweep.py experiments/learning.py --workers=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning \
      --out=experiments/results/learning --num_tasks=512

Every run starts from the base policy (`configs/base_policy.py`, saved by scripts/pretrain.py
in BASE_POLICY, default runs/base_policy) and trains with that environment's settings as the
pretraining corpus used them. `STEPS` gives each environment a fixed number of steps, chosen
from its measured step time so that a run (training plus its evaluations) stays within 20
minutes on this project's 2-core CPU; `train.max_minutes` is a safety cap above that, never
the stopping rule, so a run is the same on a faster machine. `--only=<env>` runs one row.

Each run evaluates 512 held-out tasks five times on the way (the curves); the table's numbers
come from scripts/paired_eval.py, which re-evaluates the start policy and every final
checkpoint task by task on the same 512 tasks and bootstraps the paired change.
"""

import os

from rl4agents import sweep

BASE_POLICY = os.environ.get("BASE_POLICY", "runs/base_policy")
SEEDS = 3
EVAL_TASKS = 512
LR = 3e-4
# Steps per environment (a run's budget; see the module docstring).
STEPS = {
    "frozen_lake": 200,
    "maze": 150,
    "wordle": 200,
    "countdown": 200,
    "sokoban": 200,
    "search_qa": 200,
    "two_agent": 60,
    "web_shop": 100,
    "terminal": 150,
    "household": 40,
}


def env_sweep(env: str, steps: int) -> list[sweep.Point]:
    return sweep.product(
        sweep.configs([f"configs/base_policy.py:{env}"]),
        sweep.fixed(
            {
                "init.params": BASE_POLICY,
                "optim.lr": LR,
                "train.num_steps": steps,
                "train.eval_every": max(1, steps // 5),
                "train.eval_tasks": EVAL_TASKS,
                "train.max_minutes": 25.0,
                "train.eval_ood": False,
            }
        ),
        sweep.seeds(SEEDS),
    )


def get_sweep():
    return [p for env, steps in STEPS.items() for p in env_sweep(env, steps)]
