"""Policy-loss and episode-filter remedies against the PPO-clip baseline from the base policy:
SAPO's soft gate, RAGEN-2's top-p variance filter, SimpleTIR's void-turn filter and EPO's
entropy smoothing, one change each on top of GRPO with `loss.policy = "ppo_clip"`.

  python scripts/sweep.py experiments/losses_filters.py \
      --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/losses_filters --raw \
      --out=experiments/results/losses_filters --metric=eval_test.greedy_success,wall_s:min \
      --baseline=ppo_clip --strip='^[a-z_]+,grpo(, )?' \
      --curve_key=eval_test/greedy_success,train/entropy,train/zero_std_groups,train/success

Variants (each row names the one key it changes; docs/methods.md, sections 5.7, 6.9, 6.11):

  loss.policy=ppo_clip                the baseline: clipped surrogate, clip 0.2 / 0.2
  loss.policy=sapo                    SAPO's gate (arXiv 2511.20347), the paper's temperatures
                                      tau_pos 1.0, tau_neg 1.05; aggregated "token-mean" like
                                      the baseline (the paper's "seq-mean-token-mean" would
                                      change two things at once)
  sampling.filter=top_p_variance      RAGEN-2 (arXiv 2604.06268): only the highest
                                      reward-variance groups holding p = 0.9 of the variance
  sampling.filter=void_turn           SimpleTIR (arXiv 2509.02479): episodes with a turn that
                                      was no valid action leave the update
  loss.epo_coef=0.05                  EPO (arXiv 2509.22576): a hinge on the batch entropy's
                                      distance from [0.8, 1.2] x its running average (decay 0.9)

Shared settings: the known-good GRPO settings of experiments/learning_base_v3.py (lr 3e-4, the
environment's entropy bonus: 0.05 FrozenLake, 0.02 Sokoban), except that every variant, the
baseline too, splits each batch into MINIBATCHES = 4 sequential updates. With one update per
batch the ratio is 1 when the loss is taken, so PPO's clip and SAPO's gate both give the plain
policy gradient and the same update; from the second minibatch on the ratio leaves 1 and the
clip and the gate act. EPO's coefficient 0.05 equals FrozenLake's
entropy bonus: below the band the penalty acts as a second entropy bonus of that size (the
paper's coefficient for this scale is not known; a guess). Every run logs
`log.collapse_metrics` (reward spread), `filter/kept_frac` (the filters), `sapo_gate` and
`epo_penalty`.

Pairing: every variant runs the same seeds and is evaluated on the same held-out tasks
(`train.eval_seed`, EVAL_TASKS); the table's differences are paired by seed against ppo_clip.

`LOSSES_FILTERS_ENVS` picks the environments (default frozen_lake,sokoban),
`LOSSES_FILTERS_SEEDS` the number of seeds (default 3), `LOSSES_FILTERS_MINUTES` each run's
wall-clock budget of training and in-run evaluation (default 10: about 200 FrozenLake and 100
Sokoban steps alone on the 2-core CPU).

Cost, one run at a time: 5 variants x 2 environments x 3 seeds = 30 runs x 10 minutes =
5.0 hours (about 5.5 with the final evaluations and start-ups).
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = ("frozen_lake", "sokoban")
LR = 3e-4
MINIBATCHES = 4
EVAL_TASKS = 256
EVAL_EVERY = 15
# The analysis command's arguments (module docstring).
BASELINE = "ppo_clip"
STRIP = "^[a-z_]+,grpo(, )?"
# variant -> (the override that names its runs, other overrides)
VARIANTS = {
    "ppo_clip": (("loss.policy", "ppo_clip"), {}),
    "sapo": (("loss.policy", "sapo"), {"loss.sapo.agg": "token-mean"}),
    "top_p_variance": (
        ("sampling.filter", "top_p_variance"),
        {"sampling.top_p_variance.p": 0.9},
    ),
    "void_turn": (("sampling.filter", "void_turn"), {}),
    "epo": (("loss.epo_coef", 0.05), {"loss.epo_decay": 0.9}),
}


def get_sweep():
    envs = _learning.envs_from("LOSSES_FILTERS_ENVS", ENVS)
    seeds = int(os.environ.get("LOSSES_FILTERS_SEEDS", "3"))
    minutes = float(os.environ.get("LOSSES_FILTERS_MINUTES", "10"))
    points = []
    for env in envs:
        for (key, value), overrides in VARIANTS.values():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},grpo"]),
                sweep.sweep_values(key, [value]),
                _learning.from_base(
                    env,
                    BASE_POLICY,
                    LR,
                    minutes,
                    EVAL_TASKS,
                    EVAL_EVERY,
                    **{"train.minibatches": MINIBATCHES, "log.collapse_metrics": True},
                    **overrides,
                ),
                sweep.seeds(seeds),
            )
    return points
