"""RL from the base policy with the whole 20-minute budget and a fourth seed.

`experiments/learning.py` gave each run 15 minutes of training and in-run evaluation, and
sokoban ended at +0.028 with a 95% interval of [-0.006, +0.059] after 45-47 steps: all three
seeds above the base policy, the interval just reaching 0. This study gives GRPO, with the same
settings, the budget the learning target allows (18 minutes of training and in-run evaluation;
the final evaluation brings a run to about 20) and 4 seeds, and runs the environments that
study had not reached yet with the same budget. Maze and countdown run with the best settings
found for them at the shorter budget (OVERRIDES: `experiments/learning_fixes.py` and
`experiments/maze_length_bias.py`).

The in-run evaluation is halved (128 tasks, every EVAL_EVERY steps, about four times in a
run at the pace of the earlier runs) so that the slow environments spend their minutes on
training; the table's numbers come from
scripts/paired_eval.py on 512 held-out tasks, as in every learning study.

  BASE_POLICY=runs/base_policy_v2r FULL_BUDGET_ENVS=sokoban python scripts/sweep.py \
      experiments/learning_full_budget.py --workers=2
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_full_budget \
      --out=experiments/results/learning_full_budget --num_tasks=512

`FULL_BUDGET_ENVS` picks the environments, in order (default: all of ENVS).
"""

import os

from rl4agents import config_utils, sweep

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
ENVS = ("sokoban", "search_qa", "web_shop", "maze", "countdown", "frozen_lake")
SEEDS = 4
MINUTES = 18.0
EVAL_TASKS = 128
EVAL_EVERY = {
    "sokoban": 15,
    "search_qa": 15,
    "web_shop": 6,
    "maze": 15,
    "countdown": 15,
    "frozen_lake": 15,
}
# env -> overrides on top of GRPO's defaults: the best settings found at the shorter budget.
OVERRIDES = {
    "maze": {"loss.entropy_coef": 0.0, "loss.ppo_clip.agg": "seq-mean-token-mean"},
    "countdown": {"env.countdown.invalid_penalty": 0.0, "loss.entropy_coef": 0.0},
}


def env_sweep(
    env: str, overrides: dict | None = None, seeds: int = SEEDS, eval_every: int | None = None
) -> list[sweep.Point]:
    """The runs of `env` at this study's budget and in-run evaluation; `overrides` (default:
    OVERRIDES), `seeds` and `eval_every` (default: EVAL_EVERY, else 15) for the studies that
    reuse it with other settings."""
    return _learning.env_sweep(
        env,
        _learning.STEPS[env],
        minutes=MINUTES,
        seeds=seeds,
        eval_tasks=EVAL_TASKS,
        eval_every=eval_every or EVAL_EVERY.get(env, 15),
        overrides=OVERRIDES.get(env, {}) if overrides is None else overrides,
    )


def get_sweep():
    return [p for env in _learning.envs_from("FULL_BUDGET_ENVS", ENVS) for p in env_sweep(env)]
