"""AT-GRPO on two_agent in miniature: agent-and-turn groups and one parameter set per role,
against GRPO with one shared policy, from the base policy, with the swapped-roles control.

AT-GRPO (arXiv 2510.11062) trains multi-agent LLM systems with GRPO groups formed per agent
and turn (`credit=at_grpo`: rollouts of one task are compared only with those at the same
agent and turn) and reports that role-specialised policies (one model per role) beat one
shared model on its planning and game tasks. Its control: swapping the roles' policies at test
time drops success, so the gain is specialisation, not extra capacity.

Three variants, paired seeds and evaluation tasks:

  grpo          GRPO, one policy shared by guide and walker (`configs/base_policy.py:two_agent`)
  at_grpo       agent-and-turn groups, one shared policy
  at_grpo_roles agent-and-turn groups, `model.role_params=2`: guide and walker each get their
                own parameter set, both starting from the base policy

  python scripts/sweep.py experiments/at_grpo_roles.py \
      --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/at_grpo_roles --raw \
      --out=experiments/results/at_grpo_roles --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' --curve_key=eval_test/greedy_success
  # the swapped-roles control, per seed of the role-set variant: a "trained" and a "swapped" row
  python scripts/eval.py --workdir=runs/sweeps/at_grpo_roles/<run> --swap_roles --num_tasks=512

Every run has the learning studies' two_agent budget (`experiments/learning_base_v3.py`): 18
minutes of training and in-run evaluation, at most 150 steps, 4 tasks x 8 samples a step,
learning rate LR. The final evaluation (summary.json, the table's metric) plays EVAL_TASKS
held-out tasks, the same for every run; the in-run one the same tasks every EVAL_EVERY steps.
`AT_GRPO_SEEDS` sets the number of seeds (default 3), `AT_GRPO_MINUTES` the wall-clock budget.

Cost, one run at a time (two_agent needs most of the memory): 3 variants x 3 seeds = 9 runs x
about 20 minutes = 3 hours.
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENV = "two_agent"
LR = 3e-4
EVAL_TASKS = 256
EVAL_EVERY = 15
# make_table's --baseline and --strip (the rows: grpo, at_grpo, "at_grpo, model.role_params=2")
BASELINE = "grpo"
STRIP = "^[a-z_]+,"
# variant -> (credit variant of the config argument, overrides)
VARIANTS = {
    "grpo": ("grpo", {}),
    "at_grpo": ("at_grpo", {}),
    "at_grpo_roles": ("at_grpo", {"model.role_params": 2}),
}


def get_sweep():
    seeds = int(os.environ.get("AT_GRPO_SEEDS", "3"))
    minutes = float(os.environ.get("AT_GRPO_MINUTES", "18"))
    points = []
    for credit, overrides in VARIANTS.values():
        points += sweep.product(
            sweep.configs([f"configs/base_policy.py:{ENV},{credit}"]),
            *[sweep.sweep_values(k, [v]) for k, v in overrides.items()],
            _learning.from_base(ENV, BASE_POLICY, LR, minutes, EVAL_TASKS, EVAL_EVERY),
            sweep.seeds(seeds),
        )
    return points
