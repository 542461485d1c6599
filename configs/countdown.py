"""Countdown with a calculator tool: build a target from 3 numbers with calc steps, then answer.

  python scripts/train.py --config=configs/countdown.py --workdir=runs/cd
  python scripts/train.py --config=configs/countdown.py:ppo_gae --workdir=runs/cd_ppo

The argument selects the credit variant (default grpo). Held-out tasks for evaluation; the OOD
split has 4 numbers and targets above 30.
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import countdown  # noqa: F401 (registers "countdown" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "countdown"
    c.env.vocab = "minimal"  # digits, + - * and the message words: ~60 tokens, not ~170
    c.rollout.num_tasks = 16
    c.rollout.group_size = 16
    # 3 numbers need at most 2 calcs and an answer; the rest is room for invalid turns.
    c.rollout.max_turns = 6
    c.rollout.max_action_len = 7  # "calc 30 * 30" is 6 tokens, plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 30.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 8  # 4 numbers need up to 3 calcs and an answer
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
