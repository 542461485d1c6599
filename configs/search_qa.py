"""Search QA: answer 1-3 hop questions about a generated knowledge base with a search tool.

  python scripts/train.py --config=configs/search_qa.py --workdir=runs/sqa
  python scripts/train.py --config=configs/search_qa.py:ppo_gae --workdir=runs/sqa_ppo

The argument selects the credit variant (default grpo). Held-out knowledge bases for evaluation;
the OOD split asks 4-hop questions (three-relation chains, never asked in training).
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import search_qa  # noqa: F401 (registers "search_qa" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "search_qa"
    c.env.vocab = "minimal"  # the letters, digits and words the env emits, not ~170 tokens
    c.rollout.num_tasks = 16
    c.rollout.group_size = 16
    # A 3-hop question needs 3 searches and an answer; two turns of slack.
    c.rollout.max_turns = 6
    c.rollout.max_action_len = 9  # "answer Obrinex" is 8 tokens, plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 30.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 7  # 4 searches and an answer
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
