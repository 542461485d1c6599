"""RL from base policy v3 at a lower sampling temperature: can training move greedy play?

From base v3, GRPO at temperature 1 raises sampled success and leaves greedy success where it
was on terminal (greedy +0.014 [-0.012, +0.041], sampled +0.236), as it did on sokoban from the
first base (`experiments/results/learning_base_v3/`, `../learning/`). At temperature 1 most
sampled episodes fail for reasons greedy play never meets (two thirds of terminal's sampled
turns are refused commands), so a group's contrast says little about the greedy action. At a
lower temperature the rollouts stay close to greedy play and a group contrasts the choices
greedy play actually makes. Everything else is `experiments/learning_base_v3.py` (same seeds,
budget, in-run evaluation and per-environment settings), so each run pairs with that study's
run of the same environment and seed.

  BASE_POLICY=runs/base_policy_v3 TEMPERATURE_ENVS=sokoban,terminal TEMPERATURE=0.5 \
      python scripts/sweep.py experiments/learning_temperature.py --workers=1 --devices=1
  python scripts/paired_eval.py --sweep=runs/sweeps/learning_temperature \
      --out=experiments/results/learning_temperature --num_tasks=512 --min_seeds=3

The rollouts sample at `rollout.temperature` and the loss scores the same tempered policy
(the log-probabilities of logits / T), so GRPO optimises the policy it samples from;
`paired_eval` evaluates greedy play (temperature-free) and sampled play at the run's
temperature. Cost: 3 runs x 18 minutes (plus about a minute of start-up and evaluation) per
environment, one run at a time.
"""

import os

from rl4agents import config_utils

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
TEMPERATURE = float(os.environ.get("TEMPERATURE", "0.5"))
DEFAULT_ENVS = ("sokoban", "terminal")  # the two whose greedy success did not move


def get_sweep():
    named = os.environ.get("TEMPERATURE_ENVS")
    envs = _learning.envs_from("TEMPERATURE_ENVS", _learning.STEPS) if named else DEFAULT_ENVS
    return [
        p
        for env in envs
        for p in _full.env_sweep(
            env,
            {**_v3.OVERRIDES.get(env, {}), "rollout.temperature": TEMPERATURE},
            seeds=_v3.SEEDS,
            eval_every=_v3.EVAL_EVERY.get(env),
        )
    ]
