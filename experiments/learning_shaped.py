"""The full-budget runs with a process reward, where success alone is too rare to learn from.

Under GRPO a group whose samples all get the same reward has zero advantage. On search_qa the
base policy answers right in about 2% of sampled episodes, so most of the first steps' reward
variance comes from the invalid-turn penalty: in the full-budget study's first search_qa run the
share of zero-variance groups rose from 0.12 to 0.69 in 60 steps while the invalid rate fell
from 0.08 to 0.015 and training success stayed at 0.015-0.02 (the countdown pattern, see
`experiments/learning_fixes.py`). Wordle and terminal are further off: the base
policy's sampled success is 0 on 256 held-out tasks, so every group has zero advantage unless
the reward says more than success. This study keeps every other setting of
`experiments/learning_full_budget.py` (budget, in-run evaluation, learning rate) and changes the
reward: each environment's progress reward (`progress_reward`, 0.1 per step of progress, listed
at SHAPING), no invalid-turn penalty, no entropy bonus. Success, which the tables report, is
unchanged: the goal reached.

  BASE_POLICY=runs/base_policy_v2r SHAPED_ENVS=search_qa python scripts/sweep.py \
      experiments/learning_shaped.py --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_shaped \
      --out=experiments/results/learning_shaped --num_tasks=512 --min_seeds=3

`SHAPED_ENVS` picks the environments, in order (default: all of SHAPING).
"""

import os

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
SEEDS = 3


def _shaped(env: str, progress: float = 0.1) -> dict:
    return {
        f"env.{env}.progress_reward": progress,
        f"env.{env}.invalid_penalty": 0.0,
        "loss.entropy_coef": 0.0,
    }


# env -> the reward settings (and the changes that go with them) on top of GRPO's defaults.
# The progress reward of each environment (its `progress_reward` docstring): search_qa, each
# first search of a person on the question's chain; wordle, each newly found green position;
# terminal, each first entry of a directory on the key's path and first read of the key file;
# web_shop, each first visit of a matching product page and first right size.
SHAPING = {env: _shaped(env) for env in ("search_qa", "wordle", "terminal", "web_shop")}


def get_sweep():
    return [
        p
        for env in _learning.envs_from("SHAPED_ENVS", SHAPING)
        for p in _full.env_sweep(env, SHAPING[env], seeds=SEEDS)
    ]
