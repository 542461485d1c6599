"""More, smaller updates in the same 18 minutes: the v5 learning study at temperature 1 with a
quarter of the batch.

At temperature 1, GRPO from base v5 did not move maze in 62-65 steps of 256 episodes (16 tasks
x 16 samples, about 17 s a step), although three quarters of its groups carried reward
variance (`experiments/results/learning_base_v5_t1/`). This study trains on BATCH_TASKS tasks x
BATCH_GROUP samples per step (default 8 x 8 = 64 episodes), so the same budget buys about four
times the updates, each from a noisier estimate; everything else is the temperature-1 runs'
(settings, overrides, budget, seeds 0-2, evaluation tasks), so the rows pair with theirs. The
in-run evaluation comes every EVAL_EVERY steps (about as many evaluations per run as there).
Group size 8 is GiGPO's and verl-agent's default.

  BATCH_ENVS=maze python scripts/sweep.py experiments/learning_batch.py \
      --out=runs/sweeps/learning_batch --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_batch \
      --out=experiments/results/learning_batch --num_tasks=512 --min_seeds=3 --envs=maze

`BATCH_ENVS` picks the environments (default maze), `BATCH_SEEDS` the seeds (default 3; 1 is
a pilot), `BATCH_TASKS`/`BATCH_GROUP` the batch.
Cost: about 20 minutes a run, one at a time.
"""

import os

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", "runs/base_policy_v5")
TEMPERATURE = 1.0
TASKS = int(os.environ.get("BATCH_TASKS", "8"))
GROUP = int(os.environ.get("BATCH_GROUP", "8"))
SEEDS = int(os.environ.get("BATCH_SEEDS", "3"))
EVAL_EVERY = {"maze": 60, "sokoban": 60, "frozen_lake": 60, "countdown": 60}
# At 64 episodes a step the step caps of the learning studies would end the runs before the
# clock does.
STEPS = 2000


def get_sweep():
    return [
        p
        for env in _learning.envs_from("BATCH_ENVS", EVAL_EVERY)
        if env in os.environ.get("BATCH_ENVS", "maze").split(",")
        for p in _learning.env_sweep(
            env,
            STEPS,
            minutes=_full.MINUTES,
            seeds=SEEDS,
            eval_tasks=_full.EVAL_TASKS,
            eval_every=EVAL_EVERY[env],
            overrides={
                **_v3.OVERRIDES.get(env, {}),
                "init.params": BASE_POLICY,
                "rollout.temperature": TEMPERATURE,
                "rollout.num_tasks": TASKS,
                "rollout.group_size": GROUP,
            },
        )
    ]
