"""GiGPO against GRPO from the base policy on long-horizon tasks (arXiv 2505.10978 reports +12
points on ALFWorld and +9 on WebShop over GRPO with the same budget).

  python scripts/sweep.py experiments/gigpo_vs_grpo.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/gigpo_vs_grpo --raw \
      --out=experiments/results/gigpo_vs_grpo --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' \
      --curve_key=eval_test/greedy_success,train/frac_steps_grouped,train/step_group_size

GiGPO's step groups exist only where states repeat across a task's samples: every GiGPO run
logs `train/frac_steps_grouped` (the share of valid steps whose anchor state another sample of the
same task also reached, i.e. in an anchor group larger than one) and `train/step_group_size`.
Both estimators share everything else, the paper's protocol: N = 8 samples per task, gamma 0.95
for the step returns, no extra invalid-action penalty (the environments charge their own), and
rollouts at temperature 1 (the paper's, and that of the learning runs whose settings both
environments take, below).

Web_shop, the WebShop stand-in, and sokoban, the long-horizon task whose states repeat most
across a task's samples (few distinct positions, many turns), run here, each with the settings
of its learning runs (`experiments/learning_base_v3.py`'s overrides; SETTINGS, LR), shared by
both estimators:
- web_shop at a learning rate of 1e-4 instead of 3e-4: at 3e-4 its greedy success fell within
  the first six updates and its batch success never rose, at 1e-4 batch success went from 0.06
  to 0.13-0.15 (`experiments/results/learning_v5_rebuild/`, `pilot_lr1e-4_web_shop/`);
- sokoban at 3e-4, where GRPO from this base improved held-out greedy success
  (`experiments/results/learning_v5_rebuild/t1/`).

Household, the ALFWorld stand-in, is left out by default (`GIGPO_ENVS` adds it, with its
sub-goal reward in SETTINGS): the base policy (the rebuild of v5) never succeeds there, greedily
or sampled (0 of 256 held-out tasks), and a GRPO pilot with the sub-goal reward made 17 updates
in 18 minutes (every episode runs to the 24-turn limit) without one success in training or on
512 held-out tasks (`experiments/results/learning_v5_rebuild/pilot_progress_household/`). On
success alone neither estimator could move; a comparison there measures nothing.

The credit study v2 (`experiments/credit_v2.py`) compares the same two estimators on sokoban
and maze under another protocol (a learning rate tuned for each, a fixed number of updates,
rollouts at temperature 1); this study keeps the learning runs' wall-clock budget.

Cost on a 2-core CPU: 2 variants x 2 environments x 5 seeds = 20 runs x 20 minutes, one at a
time (`--workers=1`, as the learning runs, so each run's 20 minutes buy the same updates as
theirs) = 6.7 hours, plus each run's final evaluation on 512 tasks (about a minute).
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = tuple(os.environ.get("GIGPO_ENVS", "web_shop,sokoban").split(","))
TEMPERATURE = 1.0
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
