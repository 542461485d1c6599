"""FrozenLake: random solvable maps, held-out layouts for evaluation.

  python scripts/train.py --config=configs/frozen_lake.py --workdir=runs/fl
  python scripts/train.py --config=configs/frozen_lake.py:ppo_gae --workdir=runs/fl_ppo

The argument selects the credit variant (default grpo).
"""

from __future__ import annotations

from configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "frozen_lake"
    c.rollout.num_tasks = 32
    c.rollout.group_size = 8
    c.rollout.max_turns = 8
    c.env.vocab = "minimal"  # a from-scratch model explores ~20 tokens, not ~170
    c.rollout.max_action_len = 1  # one action word; the turn ends at the action budget
    c.loss.entropy_coef = 0.01
    c.optim.lr = 1e-3
    c.train.num_steps = 400
    c.train.eval_every = 25
    c.credit.name = arg or "grpo"
    if c.credit.name == "ppo_gae":
        c.model.value_head = "shared"
    c.lock()
    return c
