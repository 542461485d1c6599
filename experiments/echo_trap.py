"""RAGEN's "echo trap" in miniature (arXiv 2504.20073): under GRPO the reward variance within
groups and the policy's entropy collapse before success does, and the paper's remedies delay
or prevent it. Four variants from base policy v5, side by side:

  grpo          the baseline: GRPO, PPO's clip at 0.2 / 0.2
  top_p_var     grpo keeping only the highest reward-variance groups that hold 90% of the
                batch's variance (`sampling.filter=top_p_variance`, RAGEN-2's rule)
  critic        ppo_gae with a separate critic whose decoder starts as a copy of the base
                policy's (`init.critic=policy`), RAGEN's "critic incorporation"
  clip_higher   grpo with the upper clip at 0.28 (DAPO's clip-higher, RAGEN's decoupled clip)

  python scripts/sweep.py experiments/echo_trap.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/echo_trap --raw \
      --out=experiments/results/echo_trap --metric=eval_test.greedy_success,wall_s:min \
      --baseline=grpo --strip='^[a-z_]+,' --curve_key=eval_test/greedy_success,\
train/zero_std_groups,train/entropy,train/reward_std,train/mi/gap

Why these settings: each environment starts from the GRPO run of base v5 (its rebuild,
`runs/base_policy_v5`) in which the trap was seen, with that run's settings (each environment's
overrides of `experiments/learning_base_v3.py`, its batch, temperature and in-run evaluation,
SETTINGS):
- countdown: the one-seed pilot of `experiments/learning_recipes.py` with `RECIPE=batch8x8`
  (8 tasks x 8 samples a step, temperature 1; `experiments/results/learning_v5_rebuild/`,
  `pilot_batch8x8_countdown/`). The share of groups whose samples all got the same reward rose
  from about half over the first 60 steps to 0.88 by steps 120-180 and 0.93-0.96 after step
  600; entropy per action token fell from 0.83 to 0.15 by step 150; batch success stopped at
  about 0.3 by step 100, and held-out greedy success peaked at step 60 and fell below the base's
  from step 420 on (-0.039 [-0.076, -0.002] at the end, 944 steps);
- frozen_lake: the v5 learning study at temperature 0.5 (`experiments/learning_base_v5.py`),
  where from the first build of v5 0.69-0.81 of the groups had no variance after step 40.
Three changes are shared by all four variants, the baseline included:
- a fixed number of steps (STEPS) instead of the 18-minute wall-clock budget: the variants do
  not cost the same per step (the critic adds a model), and the trap is a function of updates,
  so every variant gets the same updates. STEPS covers the pilot's collapse and the fall of its
  greedy success on countdown, and three to four times the steps after which frozen_lake's
  groups had emptied;
- `train.minibatches = 4`: each batch is split into four sequential updates. With one update per
  batch the ratio is exactly 1 when the loss is taken, so a clip (0.2 or 0.28) never acts and
  clip-higher would be GRPO itself; from the second minibatch on the ratio leaves 1.
- `log.collapse_metrics` and `log.mi_proxy`: every step logs the collapse signature,
  `zero_std_groups` (share of groups with no reward variance), `entropy`, `reward_std` and
  `reward_group_std` (mean within-group std), and RAGEN-2's mutual-information proxy `mi/gap`
  (how much more likely each episode's actions are under its own prompt than under another
  task's: near 0 when the outputs no longer depend on the input), beside `filter/kept_frac`
  for the filter. The proxy is one more teacher-forced pass over twice the batch.
Every run also evaluates the base policy at step 0 (`train.eval_at_start`), so each curve
starts where training did. The final evaluation is on FINAL_TASKS held-out tasks, the same
tasks for every run of an environment, so make_table's differences against grpo are paired by
seed and task set.

`ECHO_ENVS` picks the environments (default countdown,frozen_lake: the two where the trap
showed), `ECHO_SEEDS` the number of seeds (default 3), `BASE_POLICY` the start.
Runs are ordered seed by seed, so an interrupted study has complete pairs.

Cost, one run at a time on the 2-core CPU, estimated from the runs the settings come from
(countdown's pilot 1.1 s a step, frozen_lake's learning runs about 5.5 s; the proxy's extra pass
adds to that, the critic more): countdown 4 variants x 3 seeds x 12-20 minutes = about 3 hours,
frozen_lake 4 x 3 x 15-25 minutes = about 4 hours.
"""

import dataclasses
import os

from configs import base_policy
from rl4agents import config_utils, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = ("countdown", "frozen_lake")
# env -> the settings of the run in which the trap was seen, on top of the learning study's
SETTINGS = {
    "countdown": {
        "rollout.temperature": 1.0,
        "rollout.num_tasks": 8,
        "rollout.group_size": 8,
        "train.eval_every": 40,
    },
    "frozen_lake": {"rollout.temperature": 0.5},
}
MINIBATCHES = 4
FINAL_TASKS = 512
STEPS = {"countdown": 480, "frozen_lake": 150}
# The analysis command's arguments (module docstring).
BASELINE = "grpo"
STRIP = "^[a-z_]+,"
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


def shared(env: str) -> dict:
    """The overrides every variant of `env` shares: the learning study's and SETTINGS[env],
    plus MINIBATCHES, the collapse metrics and the final evaluation's size. The step budget is
    set in `get_sweep` over the learning study's."""
    return {
        **_v3.OVERRIDES.get(env, {}),
        "init.params": BASE_POLICY,
        **SETTINGS[env],
        "train.minibatches": MINIBATCHES,
        "train.final_eval_tasks": FINAL_TASKS,
        "train.eval_at_start": True,
        "log.collapse_metrics": True,
        "log.mi_proxy": True,
    }


def get_sweep():
    seeds = int(os.environ.get("ECHO_SEEDS", "3"))
    points = []
    for env in _learning.envs_from("ECHO_ENVS", ENVS):
        runs = _full.env_sweep(env, shared(env), seeds=seeds, eval_every=_v3.EVAL_EVERY.get(env))
        budget = {"train.num_steps": STEPS[env], "train.max_minutes": 0.0}  # 0: no wall limit
        for run in runs:  # one seed at a time, every variant
            spec = run.config
            run = dataclasses.replace(run, config=None, overrides={**run.overrides, **budget})
            for credit, named, overrides in VARIANTS.values():
                variant = sweep.Point(
                    config=f"{spec},{credit}",
                    overrides={**(dict([named]) if named else {}), **overrides},
                    named=(named[0],) if named else (),
                )
                points += sweep.product([variant], [run])
    return points
