"""Household (ALFWorld-like): find, clean/heat/cool and place objects; held-out goals as OOD.

  python scripts/train.py --config=configs/household.py --workdir=runs/hh
  python scripts/train.py --config=configs/household.py:ppo_gae --workdir=runs/hh_ppo

The argument selects the credit variant (default grpo).
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import household  # noqa: F401 (registers "household" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "household"
    c.env.vocab = "minimal"  # the words the env emits; unknown words are spelled by characters
    # A from-scratch model rarely finishes a 10-20 action task by chance: the sub-goal signal
    # (found, held, transformed, placed) gives it something to climb. 0 = the sparse task.
    c.env.household.progress_reward = 0.1
    c.rollout.num_tasks = 8
    c.rollout.group_size = 8
    c.rollout.max_turns = 24  # the oracle needs 11 turns on average, 23 at most
    c.rollout.max_action_len = 24  # longest action 23 tokens (built-in vocab) + end-of-action
    c.loss.entropy_coef = 0.01
    c.optim.lr = 1e-3
    c.train.num_steps = 500
    c.train.max_minutes = 60.0
    c.train.eval_every = 50
    c.train.eval_tasks = 64
    c.train.ood_max_turns = 24  # held-out goals with 9 objects: also at most ~22 turns
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
