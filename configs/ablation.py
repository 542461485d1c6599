"""The credit-assignment ablation: FrozenLake 8x8 (slippery) and Sokoban 6x6.

  python scripts/train.py --config=configs/ablation.py:frozen_lake8 --workdir=runs/a_fl
  python scripts/train.py --config=configs/ablation.py:sokoban6,gigpo --workdir=runs/a_sok

The argument is `<task>[,<variant>]`: task "frozen_lake8" or "sokoban6"; variant one of
`VARIANTS` (default grpo). Every variant shares the task's hyperparameters (the GiGPO
protocol: N = 8 samples per task, gamma 0.95 for the discounted step-level estimators,
identical optimiser and budget); a variant only changes what `VARIANTS` lists.
"""

from __future__ import annotations

from configs import base

# variant -> dotted overrides on top of the task config.
VARIANTS = {
    "grpo": {"credit.name": "grpo"},
    "dr_grpo": {"credit.name": "dr_grpo"},
    "rloo": {"credit.name": "rloo"},
    "reinforce_pp_baseline": {"credit.name": "reinforce_pp_baseline"},
    "ppo_gae": {"credit.name": "ppo_gae", "model.value_head": "shared"},
    "turn_gae": {"credit.name": "turn_gae", "model.value_head": "shared"},
    "gigpo": {"credit.name": "gigpo"},
    "grpo_echo": {"credit.name": "grpo", "loss.echo_coef": 0.05},
}
TASKS = ("frozen_lake8", "sokoban6")


def _set(c, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    node = c
    for part in path:
        node = node[part]
    node[leaf] = value


def get_config(arg: str | None = None):
    task, _, variant = (arg or "frozen_lake8").partition(",")
    variant = variant or "grpo"
    if task not in TASKS:
        raise ValueError(f"unknown ablation task {task!r}; allowed: {list(TASKS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown ablation variant {variant!r}; allowed: {list(VARIANTS)}")
    c = base.get_config()
    c.unlock()
    c.env.vocab = "minimal"
    c.rollout.num_tasks = 8
    c.rollout.group_size = 8
    c.rollout.max_action_len = 1
    c.optim.lr = 1e-3
    c.train.eval_tasks = 128
    c.checkpoint.every = 25
    if task == "frozen_lake8":
        c.env.name = "frozen_lake"
        fl = c.env.frozen_lake
        fl.size = 8
        fl.slippery = True
        fl.success_rate = 0.8  # 20% of moves slip sideways (gym's 1/3 needs ~3x the turns)
        fl.progress_reward = 0.1  # per-turn process signal: 0.1 per step closer to the goal
        fl.hole_prob = 0.15
        fl.compact = True
        # A 3x3 window around the agent each turn: the whole 8x8 grid every turn would make a
        # 32-turn context of ~2,100 tokens, beyond a CPU run's budget.
        fl.view_radius = 1
        fl.ood_size = 10
        c.rollout.max_turns = 32
        c.train.ood_max_turns = 40
        c.loss.entropy_coef = 0.02
    else:
        c.env.name = "sokoban"
        c.env.sokoban.size = 6
        c.env.sokoban.num_boxes = 1
        c.env.sokoban.compact = True
        c.rollout.max_turns = 12
        c.train.ood_max_turns = 24
        c.loss.entropy_coef = 0.02
    # Discounted step-level estimators use the GiGPO protocol's gamma; GAE uses lambda 0.95.
    c.credit.gigpo.gamma = 0.95
    # One invalid-action penalty for every variant, as verl-agent's trainer applies its
    # `invalid_action_penalty_coef` before any estimator: here the env's own (FrozenLake 0.05,
    # Sokoban 0.1 on top of the step penalty), so GiGPO's estimator adds none of its own.
    c.credit.gigpo.invalid_penalty = 0.0
    c.credit.ppo_gae.lam = 0.95
    c.credit.turn_gae.lam = 0.95
    # Sized so 8 variants x 2 tasks x 3 seeds finish in about 1.5 hours on 2 CPU cores.
    c.train.num_steps = 80 if task == "frozen_lake8" else 120
    c.train.eval_every = 40
    for dotted, value in VARIANTS[variant].items():
        _set(c, dotted, value)
    c.lock()
    return c
