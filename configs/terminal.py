"""Terminal: find a hidden value in a generated file tree with ls/cd/cat/grep/pwd, then submit.

  python scripts/train.py --config=configs/terminal.py --workdir=runs/term
  python scripts/train.py --config=configs/terminal.py:ppo_gae --workdir=runs/term_ppo

The argument selects the credit variant (default grpo). Held-out trees for evaluation; the OOD
split has deeper and wider trees (depth 3, 3 subdirectories per directory). Command outputs are
long (up to 161 tokens a turn with the built-in vocabulary), the setting ECHO's
observation-prediction loss (`loss.echo_coef`) studies.
"""

from __future__ import annotations

from configs import base
from rl4agents.envs import terminal  # noqa: F401 (registers "terminal" before base reads it)


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "terminal"
    c.env.vocab = "minimal"  # the characters of the names and messages, not ~170 words
    c.rollout.num_tasks = 16
    c.rollout.group_size = 8
    # grep, cd down (key depth <= 2), cat, submit: <= 5 turns; the rest is room to explore.
    c.rollout.max_turns = 8
    c.rollout.max_action_len = 10  # "cat notes.md" is 9 tokens, plus end-of-action
    c.loss.entropy_coef = 0.02
    c.optim.lr = 1e-3
    c.train.num_steps = 1000
    c.train.max_minutes = 30.0
    c.train.eval_every = 50
    c.train.ood_max_turns = 10  # keys up to depth 3: grep, 3 cds, cat, submit
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
