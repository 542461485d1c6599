"""RL from base policy v4: every environment, with the settings of the base-v3 study.

Base v3 left wordle, search_qa, two_agent, web_shop and household below the 0.1-0.6 band of
held-out greedy success, and its episodes show why: well-formed actions that do not depend on
the observation (`experiments/results/base_policy_v3/failures.md`). Base v4 continues
pretraining from v3 for 4,000 more steps on a fresh corpus twice v3's size, weighted toward
those five environments (`experiments/results/base_policy_v4/`). This study runs GRPO from it
with exactly the per-environment settings, budget, seeds and in-run evaluation of
`experiments/learning_base_v3.py`, so each environment's v3 and v4 rows differ only in the
start policy.

  BASE_POLICY=runs/base_policy_v4 V4_ENVS=frozen_lake python scripts/sweep.py \
      experiments/learning_base_v4.py --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_base_v4 \
      --out=experiments/results/learning_base_v4 --num_tasks=512 --min_seeds=3

`V4_ENVS` picks the environments, in order (default: all ten). One run at a time, as in the
v3 study.
"""

import os

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
SEEDS = _v3.SEEDS


def get_sweep():
    return [
        p
        for env in _learning.envs_from("V4_ENVS", _learning.STEPS)
        for p in _full.env_sweep(
            env, _v3.OVERRIDES.get(env, {}), seeds=SEEDS, eval_every=_v3.EVAL_EVERY.get(env)
        )
    ]
