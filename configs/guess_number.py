"""Guess the number: find a secret in [0, 63] in 8 turns from "higher" / "lower" replies.

  python scripts/train.py --config=configs/guess_number.py --workdir=runs/gn
  python scripts/train.py --config=configs/guess_number.py \
      --config.model.checkpoint=runs/models/smollm2-135m-instruct --workdir=runs/gn_smollm2

The argument selects the credit variant (default grpo). The smallest task with feedback to
read: a policy that guesses uniformly at random solves about 12% of the tasks in 8 turns
(1 - (63/64)^8), binary search every one in at most 6. Its contexts are short (a prompt of
about 15 tokens, 8 turns of a 3-token guess and a 2-token reply), which makes it the task on
which a pretrained model's RL runs the most steps per minute (docs/real_model.md). The
held-out split is a quarter of the 64 secrets (hashed classes, never drawn in training); the
OOD split draws secrets from [0, 99].
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import guess_number  # noqa: F401 (registers "guess_number" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "guess_number"
    c.env.vocab = "minimal"  # the digits and the reply words, not the ~170 built-in tokens
    c.rollout.num_tasks = 16
    c.rollout.group_size = 8
    c.rollout.max_turns = 8  # the environment's own turn limit
    c.rollout.max_action_len = 3  # "3 1" is 2 tokens, plus end-of-action
    c.loss.entropy_coef = 0.01
    c.optim.lr = 1e-3
    c.train.num_steps = 500
    c.train.max_minutes = 15.0
    c.train.eval_every = 25
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
