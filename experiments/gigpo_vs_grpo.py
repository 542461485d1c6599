"""GiGPO against GRPO from the base policy on long-horizon tasks (arXiv 2505.10978 reports +12
points on ALFWorld and +9 on WebShop over GRPO with the same budget).

  python scripts/sweep.py experiments/gigpo_vs_grpo.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/gigpo_vs_grpo \
      --out=experiments/results/gigpo_vs_grpo --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' --curve_key=eval_test/greedy_success

GiGPO's step groups exist only where states repeat across a task's samples: every run logs
`credit/frac_steps_grouped` (the share of valid steps whose anchor state another sample of the
same task also reached, i.e. in an anchor group larger than one) and `credit/step_group_size`.
Both estimators share everything else, the paper's protocol: N = 8 samples per task, gamma 0.95
for the step returns, no extra invalid-action penalty (the environments charge their own).
Household and web_shop are the ALFWorld and WebShop stand-ins; sokoban and maze repeat states
most (long horizons, few distinct positions).

Cost on a 2-core CPU: 2 variants x 4 environments x 5 seeds = 40 runs x 20 minutes / 2 workers
= 6.7 hours.
"""

import os

from configs import base_policy
from rl4agents import sweep

BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = tuple(os.environ.get("GIGPO_ENVS", "sokoban,maze,web_shop,household").split(","))
VARIANTS = {"grpo": {}, "gigpo": {"credit.gigpo.gamma": 0.95, "credit.gigpo.invalid_penalty": 0.0}}
SEEDS = 5
LR = 3e-4
MINUTES = 20.0
STEPS = {"sokoban": 400, "maze": 300, "web_shop": 200, "household": 100}


def get_sweep():
    points = []
    for env in ENVS:
        for credit, overrides in VARIANTS.items():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                sweep.fixed(
                    {
                        "init.params": BASE_POLICY,
                        "optim.lr": LR,
                        "train.num_steps": STEPS[env],
                        "train.eval_every": max(1, STEPS[env] // 8),
                        "train.eval_tasks": 512,
                        "train.max_minutes": MINUTES,
                        "train.eval_ood": False,
                        **overrides,
                    }
                ),
                sweep.seeds(SEEDS),
            )
    return points
