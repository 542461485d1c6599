"""TextArena's GuessTheNumber (a PyPI text-game collection) as host environments.

  pip install -e ".[host]"    # installs textarena
  python scripts/train.py --config=configs/textarena.py --workdir=runs/textarena
  python scripts/eval.py --workdir=runs/textarena --split=test,ood

The games run in Python on worker threads (`env.name = "host"`, docs/host_envs.md); each
turn's sampling is one jitted program with the KV cache on the device. Training plays
GuessTheNumber-v0 (1..20 in 10 guesses) from even seeds, "test" from odd seeds and "ood"
GuessTheNumber-v0-hardcore (1..50). Other games: `--config.env.host.args.games=TowerOfHanoi-v0`
(comma-separated ids; task t of a batch plays game t mod their number). Any gymnasium-style text
environment: `--config.env.host.factory=package.module:function` (see
rl4agents.envs.host.registry). The argument selects the credit variant (default grpo).
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.unlock()
    c.env.name = "host"
    c.env.host.factory = "textarena"
    c.env.host.args = ml_collections.ConfigDict(
        {"games": "GuessTheNumber-v0", "ood_games": "GuessTheNumber-v0-hardcore"}
    )
    c.env.host.max_prompt_len = 400  # the rules are ~380 built-in tokens
    c.env.host.max_obs_len = 32  # "The target number is lower." is 17
    c.env.host.step_timeout_s = 10.0
    c.rollout.num_tasks = 8
    c.rollout.group_size = 8
    c.rollout.max_turns = 10
    c.rollout.max_action_len = 5  # "[13]" + end-of-action
    c.loss.entropy_coef = 0.01
    c.optim.lr = 1e-3
    c.train.num_steps = 300
    c.train.max_minutes = 20.0
    c.train.eval_every = 25
    c.train.eval_tasks = 32
    base.set_credit(c, arg or "grpo")
    c.lock()
    return c
