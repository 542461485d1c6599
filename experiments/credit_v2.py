"""Credit study v2: six estimators from the base policy on two long-horizon environments, paired
seeds, a learning-rate sweep per estimator, 1,024 held-out tasks.

  # stage 1, the learning rates: 2 seeds x 3 rates
  CREDIT_V2_SEEDS=2 python scripts/sweep.py experiments/credit_v2.py --workers=2
  # stage 2, more seeds (the runs of stage 1 are kept and reused: same directories)
  CREDIT_V2_SEEDS=5 python scripts/sweep.py experiments/credit_v2.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/credit_v2 --out=experiments/results/credit_v2 \
      --metric=eval_test.greedy_success --baseline=grpo --strip='^[a-z_]+,' \
      --lr_select=train/success --curve_key=eval_test/greedy_success

Every variant uses the learning studies' settings (`experiments/learning_base_v5.py`): rollouts
at temperature 0.5, and maze's per-episode loss aggregation without an entropy bonus
(`experiments/learning_base_v3.py`'s overrides).

Every run starts from the base policy (BASE_POLICY, default configs/base_policy.py's `CHECKPOINT`;
scripts/pretrain.py with configs/base_policy.py) with that environment's settings
(configs/base_policy.py:<env>).
The estimators that need a critic get a separate one whose decoder starts as a copy of the base
policy's (`init.critic="policy"`) and whose value projection starts at zero.

Pairing: every variant runs the same seeds (so the same rollout keys at step 0 and the same
evaluation tasks, `train.eval_seed`). The learning rate of each variant x environment is chosen by
make_table on training success (never on held-out numbers).

Cost on a 2-core CPU (two runs at a time, MINUTES each): stage 1 is 6 x 2 x 3 x 2 = 72 runs,
72 x MINUTES / 2 = 12 hours of wall time at 20 minutes; stage 2 adds 6 x 2 x 3 x 3 = 108 runs
(or 36 with `CREDIT_V2_LRS` set to the chosen rates, 6 hours).
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
# The learning studies' settings, shared by every variant: rollouts at temperature 0.5 (greedy
# play moves when the rollouts stay close to it; CREDIT_V2_TEMPERATURE changes it) and each
# environment's loss overrides.
TEMPERATURE = float(os.environ.get("CREDIT_V2_TEMPERATURE", "0.5"))
ENVS = ("sokoban", "maze")
# variant -> (credit name, dotted overrides)
VARIANTS = {
    "grpo": ("grpo", {}),
    "rloo": ("rloo", {}),
    "ppo_gae": ("ppo_gae", {"model.value_head": "separate", "init.critic": "policy"}),
    "turn_gae": ("turn_gae", {"model.value_head": "separate", "init.critic": "policy"}),
    "gigpo": ("gigpo", {"credit.gigpo.gamma": 0.95, "credit.gigpo.invalid_penalty": 0.0}),
    "empg": ("empg", {}),
}
LRS = tuple(float(x) for x in os.environ.get("CREDIT_V2_LRS", "1e-4,3e-4,1e-3").split(","))
SEEDS = int(os.environ.get("CREDIT_V2_SEEDS", "2"))
MINUTES = 20.0
STEPS = {"sokoban": 400, "maze": 300}  # caps; the wall budget ends the runs on this CPU
EVAL_TASKS = 1024  # the final evaluation, after the budget
CURVE_TASKS = 256  # the in-run evaluations of the curves, inside the budget
# About eight points per curve at the pace of two runs at a time (one at a time, the learning
# studies' runs took about 7 s a step on sokoban and 17 s on maze; an evaluation of 128 tasks
# added 2 s).
EVAL_EVERY = {"sokoban": 10, "maze": 5}


def get_sweep():
    points = []
    for env in ENVS:
        for credit, overrides in VARIANTS.values():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                sweep.fixed(
                    {
                        "init.params": BASE_POLICY,
                        "train.num_steps": STEPS[env],
                        "train.eval_every": EVAL_EVERY[env],
                        "train.eval_tasks": CURVE_TASKS,
                        "train.final_eval_tasks": EVAL_TASKS,
                        "train.max_minutes": MINUTES,
                        "train.eval_ood": False,
                        "log.collapse_metrics": True,
                        "rollout.temperature": TEMPERATURE,
                        **_v3.OVERRIDES.get(env, {}),
                        **overrides,
                    }
                ),
                sweep.sweep_values("optim.lr", LRS),
                sweep.seeds(SEEDS),
            )
    return points
