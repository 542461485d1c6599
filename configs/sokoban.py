"""Sokoban 6x6 (4x4 interior), one box; held-out rooms for evaluation.

  python scripts/train.py --config=configs/sokoban.py --workdir=runs/sok_grpo
  python scripts/train.py --config=configs/sokoban.py:ppo_gae --workdir=runs/sok_ppo

The argument selects the credit variant (default grpo).
"""

from __future__ import annotations

from configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "sokoban"
    c.env.sokoban.size = 6
    c.env.sokoban.num_boxes = 1
    c.env.sokoban.compact = True  # 16 interior cells per observation, no row breaks
    c.env.vocab = "minimal"
    c.rollout.num_tasks = 16
    c.rollout.group_size = 16
    c.rollout.max_turns = 12  # shortest solutions: 2-12 moves, rarely more (1 room in 128: 13)
    c.rollout.max_action_len = 1
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 2000
    c.train.max_minutes = 60.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 24  # 7x7 rooms with 2 boxes need ~7-9 moves, up to ~20
    # A critic gets a trunk of its own: on a shared trunk the value regression steers the
    # policy's features (experiments/results: ppo_gae below random play on a shared one).
    base.set_credit(c, arg or "grpo", value_head="separate")
    if c.credit.name == "ppo_gae":
        c.credit.ppo_gae.gamma = 1.0
        c.credit.ppo_gae.lam = 0.95
    c.lock()
    return c
