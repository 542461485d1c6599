"""Wordle: guess a 5-letter word in 6 turns from per-letter feedback; held-out secrets.

  python scripts/train.py --config=configs/wordle.py --workdir=runs/wordle
  python scripts/train.py --config=configs/wordle.py:ppo_gae --workdir=runs/wordle_ppo

The argument selects the credit variant (default grpo). Train and test secrets are disjoint;
the OOD split allows 4 turns instead of 6.
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import wordle  # noqa: F401 (registers "wordle" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "wordle"
    c.env.vocab = "minimal"  # letters, the marks + ? - and the prompt's words: ~45 tokens
    c.rollout.num_tasks = 16
    c.rollout.group_size = 16
    c.rollout.max_turns = 6  # the env's turn budget: every episode ends by itself
    c.rollout.max_action_len = 7  # "guess" + 5 letter tokens, plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 60.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 4  # the OOD env's budget
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
