"""Stale rollouts and their corrections from the base policy: GRPO whose episodes come from the
parameters of k updates ago (`train.staleness`, asynchronous RL in one deterministic program),
at k = 0, 2, 4 without a correction and at k = 4 with each registered correction.

  python scripts/sweep.py experiments/staleness.py \
      --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/staleness --raw \
      --out=experiments/results/staleness --metric=eval_test.greedy_success,wall_s:min \
      --baseline=train.staleness=0 --strip='^[a-z_]+,grpo(, )?' \
      --curve_key=eval_test/greedy_success,train/ppo_kl,train/pg_clipfrac,train/success

Variants (docs/methods.md, sections 6.4, 6.8, 6.12, 6.13):

  train.staleness=0                          on-policy GRPO, the baseline
  train.staleness=2, train.staleness=4       stale sampler, no correction: the PPO ratio is
                                             pi_theta / pi_stale, clipped at 0.2 / 0.2
  train.staleness=4, loss.tis_cap=2.0        TIS: token weights min(pi_learner / pi_stale, 2)
                                             (C = 2 as in Yao et al.)
  train.staleness=4, mismatch.name=mis_token token MIS: tokens with ratio > 2 leave the loss
  train.staleness=4, mismatch.name=icepop    IcePop (arXiv 2510.18855): tokens with ratio
                                             outside [0.5, 5] leave the loss
  train.staleness=4, mismatch.name=m2po      M2PO (arXiv 2510.01161): the tokens of largest
                                             squared log ratio leave until the rest's mean is
                                             at most tau = 0.04

With a correction, the learner's log-probs at the start of the step are the PPO anchor and
the correction's weights carry pi_learner / pi_stale; every variant keeps `ppo_clip` as its
policy loss, so the corrections are compared on the same loss (M2PO's paper pairs its mask
with an unclipped loss; here the clip stays on top, around the learner's log-probs). The
corrections use their registered defaults. Each step logs `train/ppo_kl` and
`train/pg_clipfrac` (how far the sampler is behind) and `mismatch/kept_frac`.

Shared settings: the known-good GRPO settings of experiments/learning_base_v3.py (lr 3e-4,
one update per batch, the environment's entropy bonus), so k = 0 is that study's run at this
budget.

Pairing: every variant runs the same seeds (the same rollout keys; the stale sampler starts
from the same base policy, copied into every slot) and is evaluated on the same held-out
tasks (`train.eval_seed`, EVAL_TASKS); the table's differences are paired by seed against
k = 0.

`STALENESS_ENVS` picks the environments (default frozen_lake,sokoban), `STALENESS_SEEDS` the
number of seeds (default 3), `STALENESS_MINUTES` each run's wall-clock budget of training and
in-run evaluation (default 10: about 200 FrozenLake and 100 Sokoban steps alone on the 2-core
CPU; k = 4 lags by 4 of them).

Cost, one run at a time: 7 variants x 2 environments x 3 seeds = 42 runs x 10 minutes =
7.0 hours (about 7.7 with the final evaluations and start-ups).
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
EVAL_TASKS = 256
EVAL_EVERY = 15
TIS_CAP = 2.0
# The analysis command's arguments (module docstring).
BASELINE = "train.staleness=0"
STRIP = "^[a-z_]+,grpo(, )?"
# variant -> (staleness k, the correction's named override or None)
VARIANTS = {
    "k0": (0, None),
    "k2": (2, None),
    "k4": (4, None),
    "k4_tis": (4, ("loss.tis_cap", TIS_CAP)),
    "k4_mis_token": (4, ("mismatch.name", "mis_token")),
    "k4_icepop": (4, ("mismatch.name", "icepop")),
    "k4_m2po": (4, ("mismatch.name", "m2po")),
}


def get_sweep():
    envs = _learning.envs_from("STALENESS_ENVS", ENVS)
    seeds = int(os.environ.get("STALENESS_SEEDS", "3"))
    minutes = float(os.environ.get("STALENESS_MINUTES", "10"))
    points = []
    for env in envs:
        for k, correction in VARIANTS.values():
            named = sweep.fixed({})
            if correction is not None:
                named = sweep.sweep_values(correction[0], [correction[1]])
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},grpo"]),
                sweep.sweep_values("train.staleness", [k]),
                named,
                _learning.from_base(env, BASE_POLICY, LR, minutes, EVAL_TASKS, EVAL_EVERY),
                sweep.seeds(seeds),
            )
    return points
