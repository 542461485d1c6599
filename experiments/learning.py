"""RL from the base policy in every environment: GRPO, 3 seeds, 512 held-out tasks.

  python scripts/sweep.py experiments/learning.py --workers=2   # two runs at a time
  python scripts/paired_eval.py --sweep=runs/sweeps/learning \
      --out=experiments/results/learning/study_15min --num_tasks=512

Every run starts from the base policy (`configs/base_policy.py`, saved by scripts/pretrain.py
in BASE_POLICY, default runs/base_policy) and trains with that environment's settings as the
pretraining corpus used them. The budget is wall time: `train.max_minutes` (MINUTES) ends a
run at the step its pace predicts, so a run with its evaluations stays within 20 minutes on
this project's 2-core CPU; `STEPS` caps the steps (a faster machine stops there). The steps
each run reached are in the table. `LEARNING_ENVS=maze,sokoban` runs a subset.

Each run evaluates 256 held-out tasks on the way (the curves); the table's numbers come from
scripts/paired_eval.py, which re-evaluates the start policy and every final checkpoint task by
task on 512 held-out tasks and bootstraps the paired change.
"""

import os

from rl4agents import sweep

BASE_POLICY = os.environ.get("BASE_POLICY", "runs/base_policy")
SEEDS = 3
EVAL_TASKS = 256  # in-run curves; the table uses 512 (scripts/paired_eval.py)
LR = 3e-4
MINUTES = 15.0  # training and in-run evaluations; the final evaluation comes after
# The most steps per environment (see the module docstring).
STEPS = {
    "frozen_lake": 400,
    "maze": 300,
    "wordle": 400,
    "countdown": 400,
    "sokoban": 400,
    "search_qa": 400,
    "two_agent": 150,
    "web_shop": 200,
    "terminal": 300,
    "household": 100,
}


def env_sweep(
    env: str,
    steps: int,
    *,
    minutes: float = MINUTES,
    seeds: int = SEEDS,
    eval_tasks: int = EVAL_TASKS,
    eval_every: int | None = None,
    overrides: dict | None = None,
    first_seed: int = 0,
) -> list[sweep.Point]:
    """The runs of `env`: GRPO from BASE_POLICY at LR, `seeds` seeds from `first_seed` on, at
    most `steps` steps or `minutes` of training; in-run evaluation on `eval_tasks` held-out
    tasks every `eval_every` steps (default: a tenth of `steps`); `overrides` on top."""
    return sweep.product(
        sweep.configs([f"configs/base_policy.py:{env}"]),
        sweep.fixed(
            {
                "init.params": BASE_POLICY,
                "optim.lr": LR,
                "train.num_steps": steps,
                "train.eval_every": eval_every or max(1, steps // 10),
                "train.eval_tasks": eval_tasks,
                "train.max_minutes": minutes,
                "train.eval_ood": False,
                **(overrides or {}),
            }
        ),
        sweep.seeds(seeds, start=first_seed),
    )


def envs_from(var: str, allowed) -> list[str]:
    """The environments the variable `var` names (comma-separated, in that order), default
    all of `allowed`; raises naming any that is not allowed."""
    envs = [e for e in os.environ.get(var, ",".join(allowed)).split(",") if e]
    unknown = sorted(set(envs) - set(allowed))
    if unknown:
        raise ValueError(f"{var} names {unknown}; allowed: {list(allowed)}")
    return envs


def from_base(
    env: str,
    base_policy: str,
    lr: float,
    minutes: float,
    eval_tasks: int,
    eval_every: int,
    **extra,
) -> sweep.Point:
    """The fixed settings of a method-family study's run of `env` from a base policy: start
    point, learning rate, step cap, wall-clock budget and in-run evaluation (no OOD split),
    plus `extra` dotted overrides (pass them as a dict: `**{"train.minibatches": 4}`)."""
    return sweep.fixed(
        {
            "init.params": base_policy,
            "optim.lr": lr,
            "train.num_steps": STEPS[env],
            "train.eval_every": eval_every,
            "train.eval_tasks": eval_tasks,
            "train.max_minutes": minutes,
            "train.eval_ood": False,
            **extra,
        }
    )


def get_sweep():
    # LEARNING_ENVS=frozen_lake,maze: a subset, in that order (the plan lists only those).
    return [p for env in envs_from("LEARNING_ENVS", STEPS) for p in env_sweep(env, STEPS[env])]
