"""RL from base policy v5, every environment: GRPO at sampling temperature 0.5, 3 seeds.

Base v5 (`runs/base_policy_v5`, made by the `scripts/pretrain.py` command below; its results
are in `experiments/results/base_policy_v5/`) is one pretraining run from
random weights on the recipe the base-v2 -> v3 -> v4 chain converged to (4,096 imperfect
demonstrations per environment, the weak environments weighted up), built in one go because
the chain's checkpoints were lost with the machine they lived on.

The settings are the ones that worked from the earlier bases:
- each environment's overrides of `experiments/learning_base_v3.py` (maze's per-episode loss
  aggregation; no invalid-action penalty on countdown and terminal; terminal at lr 3e-5);
- rollouts at temperature 0.5, the loss scoring the same tempered policy: from base v4, GRPO on
  search_qa at temperature 1 raised sampled success and left greedy success where it was
  (-0.001 [-0.063, +0.066]); at 0.5 every seed raised greedy success (+0.076 [+0.031, +0.124],
  `experiments/results/learning_v4_temperature/`). Greedy play moves when the rollouts stay
  close to it (`experiments/results/learning/why_greedy.md`);
- the full-budget study's 18 minutes of training and in-run evaluation per run
  (`experiments/learning_full_budget.py`), one run at a time.

  W=frozen_lake=0.75,maze=1,countdown=1.25,sokoban=1.5,wordle=3,search_qa=2
  W=$W,two_agent=2.5,web_shop=2,terminal=1,household=3
  python scripts/pretrain.py --config=configs/base_policy.py --workdir=runs/base_policy_v5 \
      --config.pretrain.steps=6000 --config.pretrain.lr=1e-3 \
      --config.pretrain.warmup_steps=100 --config.pretrain.demos_per_env=4096 \
      --config.pretrain.weights=$W --config.seed=5 --config.log.progress=False
  V5_ENVS=frozen_lake python scripts/sweep.py experiments/learning_base_v5.py \
      --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_base_v5 \
      --out=experiments/results/learning_base_v5 --num_tasks=512 --min_seeds=3 \
      --envs=frozen_lake

`V5_ENVS` picks the environments, in order (default: all ten; terminal is in the plan but was
not run from v5, where it never succeeds greedy or sampled:
`experiments/results/base_policy_v5/`); `BASE_POLICY` (default runs/base_policy_v5) and
`V5_TEMPERATURE` (default 0.5) change the start and the temperature;
`V5_SEEDS` (default 3) the number of seeds (more seeds add runs beside the first three: the
sweep skips the complete ones).
Cost: 3 x 18 minutes (plus about a minute of start-up and evaluation each) per environment,
about 9.5 hours for the ten, and the paired evaluation (512 tasks, greedy and sampled, base and
three seeds) after each environment.
"""

import os

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", "runs/base_policy_v5")
TEMPERATURE = float(os.environ.get("V5_TEMPERATURE", "0.5"))
SEEDS = int(os.environ.get("V5_SEEDS", "3"))


def get_sweep():
    return [
        p
        for env in _learning.envs_from("V5_ENVS", _learning.STEPS)
        for p in _full.env_sweep(
            env,
            {
                **_v3.OVERRIDES.get(env, {}),
                "init.params": BASE_POLICY,
                "rollout.temperature": TEMPERATURE,
            },
            seeds=SEEDS,
            eval_every=_v3.EVAL_EVERY.get(env),
        )
    ]
