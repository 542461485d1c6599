"""RAGEN's "echo trap" in miniature (arXiv 2504.20073): under GRPO the reward variance within
groups and the policy's entropy collapse before success does; the paper's remedies delay or
prevent it. Four variants from the base policy, side by side:

  grpo          the baseline (clip 0.2 / 0.2)
  top_p_var     grpo keeping only the highest reward-variance groups that hold 90% of the
                batch's variance (sampling.filter=top_p_variance, RAGEN-2's rule)
  critic        ppo_gae with a separate critic started from the base policy (init.critic)
  clip_higher   grpo with the upper clip at 0.28 (DAPO's clip-higher)

  python scripts/sweep.py experiments/echo_trap.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/echo_trap --out=experiments/results/echo_trap \
      --metric=eval_test.greedy_success --baseline=grpo --strip='^[a-z_]+,' \
      --curve_key=zero_std_groups,entropy,train/reward_std,train/success

Every step logs the collapse signature: `zero_std_groups` (share of groups whose samples all
got the same reward), `entropy`, and with `log.collapse_metrics` `reward_std` and
`reward_group_std`. The runs are long (MINUTES) because the trap shows late. FrozenLake and
Sokoban: the environments where GRPO from the base policy learns fastest
(experiments/results/learning).

Cost on a 2-core CPU: 4 variants x 2 environments x 3 seeds = 24 runs x 30 minutes / 2 workers
= 6 hours.
"""

import os

from configs import base_policy
from rl4agents import sweep

BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = ("frozen_lake", "sokoban")
# variant -> (credit name, the override that names its runs (None: none), other overrides)
VARIANTS = {
    "grpo": ("grpo", None, {}),
    "top_p_var": (
        "grpo",
        ("sampling.filter", "top_p_variance"),
        {"sampling.top_p_variance.p": 0.9},
    ),
    "critic": ("ppo_gae", None, {"model.value_head": "separate", "init.critic": "policy"}),
    "clip_higher": ("grpo", ("loss.ppo_clip.clip_high", 0.28), {}),
}
SEEDS = 3
LR = 3e-4
MINUTES = 30.0
STEPS = 1000  # a cap; the wall budget ends the runs on this CPU


def get_sweep():
    points = []
    for env in ENVS:
        for credit, named, overrides in VARIANTS.values():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                sweep.sweep_values(named[0], [named[1]]) if named else sweep.fixed({}),
                sweep.fixed(
                    {
                        "init.params": BASE_POLICY,
                        "optim.lr": LR,
                        "train.num_steps": STEPS,
                        "train.eval_every": 20,
                        "train.eval_tasks": 256,
                        "train.max_minutes": MINUTES,
                        "train.eval_ood": False,
                        "log.collapse_metrics": True,
                        **overrides,
                    }
                ),
                sweep.seeds(SEEDS),
            )
    return points
