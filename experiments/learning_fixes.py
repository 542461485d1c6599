"""The learning study's environments that did not improve, with one change each.

`experiments/learning.py` runs GRPO from the base policy with each environment's default
settings. Where that made the policy worse, this study tests the change its metrics point to,
with everything else as in that study (base policy, learning rate, budget, steps, seeds 0-2,
evaluation tasks), so the two are paired run for run:

  countdown  invalid_penalty 0 and no entropy bonus: under the default penalty (0.05 per
             invalid turn) GRPO learned to answer wrong at once (reward 0) instead of
             computing (invalid turns cost, success is rare), and the bonus kept entropy up
             without bringing success back.
  maze       no entropy bonus: with the default 0.02 bonus, entropy rose while success fell;
             the sparse goal reward's gradient is carried by the few groups with a success.

  BASE_POLICY=runs/base_policy_v2 python scripts/sweep.py experiments/learning_fixes.py \
      --workers=2
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_fixes \
      --out=experiments/results/learning_fixes --num_tasks=512

`FIXES_ENVS=maze` runs a subset.
"""

import os

from rl4agents import config_utils, sweep

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
# env -> the overrides on top of experiments/learning.py's settings for that environment.
FIXES = {
    "countdown": {"env.countdown.invalid_penalty": 0.0, "loss.entropy_coef": 0.0},
    "maze": {"loss.entropy_coef": 0.0},
}


def get_sweep():
    envs = [e for e in os.environ.get("FIXES_ENVS", ",".join(FIXES)).split(",") if e]
    unknown = sorted(set(envs) - set(FIXES))
    if unknown:
        raise ValueError(f"FIXES_ENVS names {unknown}; allowed: {list(FIXES)}")
    out = []
    for env in envs:
        out += sweep.product(
            _learning.env_sweep(env, _learning.STEPS[env]), sweep.fixed(FIXES[env])
        )
    return out
