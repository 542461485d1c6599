"""WebShop-style shopping: search a generated catalogue, open products, select a size, buy.

  python scripts/train.py --config=configs/web_shop.py --workdir=runs/shop
  python scripts/train.py --config=configs/web_shop.py:ppo_gae --workdir=runs/shop_ppo

The argument selects the credit variant (default grpo). The reward is WebShop's attribute /
option / price score times the type match (partial credit for near misses); held-out catalogues
for evaluation; the OOD split asks for both a color and a material.
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import web_shop  # noqa: F401 (registers "web_shop" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "web_shop"
    c.env.vocab = "minimal"  # the characters of the pools and messages, not ~170 words
    c.rollout.num_tasks = 16
    c.rollout.group_size = 8
    # search, click, select, buy, plus a back and a click per listed near miss.
    c.rollout.max_turns = 8
    c.rollout.max_action_len = 9  # "search sweater" is 8 tokens, plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 30.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 10  # stricter instructions: more near misses to check
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
