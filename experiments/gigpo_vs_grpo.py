"""GiGPO against GRPO from the base policy on long-horizon tasks (arXiv 2505.10978 reports +12
points on ALFWorld and +9 on WebShop over GRPO with the same budget).

  python scripts/sweep.py experiments/gigpo_vs_grpo.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/gigpo_vs_grpo --raw \
      --out=experiments/results/gigpo_vs_grpo --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' --curve_key=eval_test/greedy_success

GiGPO's step groups exist only where states repeat across a task's samples: every run logs
`credit/frac_steps_grouped` (the share of valid steps whose anchor state another sample of the
same task also reached, i.e. in an anchor group larger than one) and `credit/step_group_size`.
Both estimators share everything else, the paper's protocol: N = 8 samples per task, gamma 0.95
for the step returns, no extra invalid-action penalty (the environments charge their own), and
the learning studies' rollouts at temperature 0.5.

Household and web_shop, the ALFWorld and WebShop stand-ins, run here, each with one setting of
its own (SETTINGS, LR), shared by both estimators:
- household with its sub-goal reward (`env.household.progress_reward` 0.1 for finding, holding,
  transforming and placing, as in `configs/household.py`): the base policy (the rebuild of v5)
  never succeeds there, greedily or sampled (0 of 256 held-out tasks), so on success alone
  both estimators would see only zero rewards and neither could move. Success stays the
  measure;
- web_shop at a learning rate of 1e-4 instead of 3e-4: at 3e-4 its greedy success fell within
  the first six updates and its batch success never rose, at 1e-4 batch success went from 0.06
  to 0.13-0.15 (`experiments/results/learning_v5_rebuild/`, `pilot_lr1e-4_web_shop/`).

Sokoban and maze, where states repeat most (long horizons, few distinct positions), are in
the credit study v2 (`experiments/credit_v2.py`: the same two estimators, a learning rate
tuned for each, 5 seeds, a fixed number of updates, rollouts at temperature 1), so this study
does not run them again; `GIGPO_ENVS` adds them.

Cost on a 2-core CPU: 2 variants x 2 environments x 5 seeds = 20 runs x 20 minutes / 2 workers
= 3.3 hours, plus each run's final evaluation on 512 tasks (a few minutes on household).
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = tuple(os.environ.get("GIGPO_ENVS", "web_shop,household").split(","))
TEMPERATURE = 0.5
VARIANTS = {"grpo": {}, "gigpo": {"credit.gigpo.gamma": 0.95, "credit.gigpo.invalid_penalty": 0.0}}
SEEDS = 5
LR = {"web_shop": 1e-4}  # else DEFAULT_LR
DEFAULT_LR = 3e-4
SETTINGS = {"household": {"env.household.progress_reward": 0.1}}
MINUTES = 20.0
STEPS = {"sokoban": 400, "maze": 300, "web_shop": 200, "household": 100}  # caps
# About six in-run evaluations of 128 tasks per run (their time counts against the budget);
# the final evaluation, after it, on FINAL_TASKS.
EVAL_EVERY = {"sokoban": 15, "maze": 8, "web_shop": 10, "household": 6}
CURVE_TASKS = 128
FINAL_TASKS = 512


def get_sweep():
    points = []
    for env in ENVS:
        for credit, overrides in VARIANTS.items():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                sweep.fixed(
                    {
                        "init.params": BASE_POLICY,
                        "optim.lr": LR.get(env, DEFAULT_LR),
                        "train.num_steps": STEPS[env],
                        "train.eval_every": EVAL_EVERY[env],
                        "train.eval_tasks": CURVE_TASKS,
                        "train.final_eval_tasks": FINAL_TASKS,
                        "train.eval_at_start": True,  # curves start at the base policy
                        "train.max_minutes": MINUTES,
                        "train.eval_ood": False,
                        "rollout.temperature": TEMPERATURE,
                        **_v3.OVERRIDES.get(env, {}),
                        **SETTINGS.get(env, {}),
                        **overrides,
                    }
                ),
                sweep.seeds(SEEDS),
            )
    return points
