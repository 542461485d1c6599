"""The learning-rate check of the full-budget study: the same runs at another learning rate.

`experiments/learning_full_budget.py` trains every environment at one learning rate (3e-4,
untuned). Maze, at about 18 s a step, gets 60 updates in the budget, and two of its four seeds
ended with greedy play identical to the base policy's on all 512 held-out tasks: the updates
were too small to flip an argmax. This study reruns an environment with everything else equal
(settings, overrides, budget, in-run evaluation, seeds 0-2, so the runs pair with the
full-budget study's) at LEARNING_LR (default 1e-3):

  BASE_POLICY=runs/base_policy_v2r LR_ENVS=maze LEARNING_LR=1e-3 python scripts/sweep.py \
      experiments/learning_lr.py --out=runs/sweeps/learning_lr1e-3 --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_lr1e-3 \
      --out=experiments/results/learning_lr/lr1e-3 --num_tasks=512 --min_seeds=3

`LR_ENVS` picks the environments, in order (default: maze).
"""

import os

from rl4agents import config_utils, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
LR = float(os.environ.get("LEARNING_LR", "1e-3"))
SEEDS = 3


def env_sweep(env: str) -> list[sweep.Point]:
    return _learning.env_sweep(
        env,
        _learning.STEPS[env],
        minutes=_full.MINUTES,
        seeds=SEEDS,
        eval_tasks=_full.EVAL_TASKS,
        eval_every=_full.EVAL_EVERY[env],
        overrides={**_full.OVERRIDES.get(env, {}), "optim.lr": LR},
    )


def get_sweep():
    envs = [e for e in os.environ.get("LR_ENVS", "maze").split(",") if e]
    unknown = sorted(set(envs) - set(_full.ENVS))
    if unknown:
        raise ValueError(f"LR_ENVS names {unknown}; allowed: {list(_full.ENVS)}")
    if not LR > 0:
        raise ValueError(f"LEARNING_LR={LR}; allowed: a positive float")
    return [p for env in envs for p in env_sweep(env)]
