"""Two-agent guide/walker cooperation with one shared policy and role prompts; larger OOD maps.

  python scripts/train.py --config=configs/two_agent.py --workdir=runs/two_agent
  python scripts/train.py --config=configs/two_agent.py:ppo_gae --workdir=runs/two_agent_ppo

The argument selects the credit variant (default grpo). Turns alternate guide (even) and
walker (odd); `TwoAgent.per_agent_returns` splits the returns per agent.
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import two_agent  # noqa: F401 (registers "two_agent" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "two_agent"
    c.env.vocab = "minimal"
    c.env.two_agent.size = 5
    c.env.two_agent.max_steps = 24  # 12 guide + 12 walker turns; maps need 2 x (3..~10)
    c.env.two_agent.ood_max_steps = 48  # 7x7 maps
    c.rollout.num_tasks = 16
    c.rollout.group_size = 8
    c.rollout.max_turns = 24
    c.rollout.max_action_len = 5  # "say stay" is 4 tokens with the built-in vocab + end
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 60.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 48
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
