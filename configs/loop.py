"""LOOP (leave-one-out PPO, arXiv 2502.01600) on a multi-turn environment.

  python scripts/train.py --config=configs/loop.py --workdir=runs/loop_sok
  python scripts/train.py --config=configs/loop.py:frozen_lake --workdir=runs/loop_fl

The argument names the environment config it starts from (default sokoban; one of `ENVS`).
LOOP is no new estimator or loss: it is `rloo` credit (each episode's score minus the mean
score of the other K - 1 samples of its task, no std scaling), the per-token PPO clipped
surrogate (`ppo_clip`, without the dual clip), no critic and no KL to a reference (one copy
of the policy in memory), and several epochs of minibatch updates per batch whose rows are
shuffled across tasks (docs/methods.md, "LOOP"; tests/train/test_loop.py pins each part).

From the paper: K = 6 samples per task, leave-one-out advantages without normalisation, PPO
clipping per token, no KL penalty, no value network, N_epoch passes of shuffled minibatches.
Chosen here for the environment, not taken from the paper: the clip range (PPO's 0.2), the
number of epochs (2) and minibatches (4), and the environment config's own optimiser and
budget.
"""

from __future__ import annotations

import importlib

ENVS = ("sokoban", "frozen_lake")


def get_config(arg: str | None = None):
    env = arg or "sokoban"
    if env not in ENVS:
        raise ValueError(f"configs/loop.py: unknown environment {env!r}; allowed: {list(ENVS)}")
    c = importlib.import_module(f"configs.{env}").get_config("rloo")
    c.unlock()
    c.rollout.group_size = 6  # K samples per task
    c.loss.policy = "ppo_clip"
    c.loss.ppo_clip.clip_low = 0.2
    c.loss.ppo_clip.clip_high = 0.2
    c.loss.ppo_clip.dual_clip_c = None  # plain PPO clipping
    c.loss.ppo_clip.agg = "token-mean"  # per-token objective
    c.loss.kl_coef = 0.0  # no KL penalty, no reference copy
    c.loss.entropy_coef = 0.0  # no entropy bonus
    c.model.value_head = "none"  # no value network
    c.train.epochs = 2
    c.train.minibatches = 4
    c.lock()
    return c
