"""Maze with partial observability (4 x 4 rooms, 3 x 3 view): the agent must remember where it
has been. Held-out maze layouts for evaluation; the OOD split has 6 x 6 rooms.

  python scripts/train.py --config=configs/maze.py --workdir=runs/maze
  python scripts/train.py --config=configs/maze.py:gigpo --workdir=runs/maze_gigpo

The argument selects the credit variant (default grpo).
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import maze  # noqa: F401 (registers "maze" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "maze"
    c.env.maze.compact = True  # 9 cell tokens and the end "\n" per observation
    c.env.vocab = "minimal"  # the 4 cells, 4 moves and "invalid": ~15 tokens, not ~170
    c.rollout.num_tasks = 16
    c.rollout.group_size = 16
    # Shortest paths are 2-28 moves (mean ~10); exploring without the map takes up to ~50.
    c.rollout.max_turns = 32
    c.rollout.max_action_len = 2  # one move word plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1500
    c.train.max_minutes = 60.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 64  # 6 x 6 rooms: shortest paths up to ~54 moves (mean ~20)
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
