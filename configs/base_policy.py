"""The base policy: one decoder pretrained on imperfect demonstrations of all ten environments,
the stand-in for a pretrained LLM that RL starts from (docs/base_policy.md).

  # pretraining (no argument): the corpus, the model and the schedule
  python scripts/pretrain.py --config=configs/base_policy.py --workdir=runs/base_policy
  # RL in one environment from it: that environment's settings as the corpus used them, the
  # base model's architecture and the shared built-in vocabulary
  python scripts/train.py --config=configs/base_policy.py:maze --workdir=runs/maze_base \
      --config.init.params=runs/base_policy
  python scripts/train.py --config=configs/base_policy.py:maze,gigpo ...

The argument is an environment name, optionally followed by a comma and the credit variant
(default grpo). Variants that need a critic (`ppo_gae`) add a value head, which the base
checkpoint does not have: it starts from the run's initialisation, or with
`--config.model.value_head=separate --config.init.critic=policy` as a critic whose decoder is a
copy of the base policy's.
"""

from __future__ import annotations

import importlib

import ml_collections

from configs import base

# The environments of the pretraining corpus, in the order the pretraining reports them.
ENVS = (
    "frozen_lake",
    "maze",
    "wordle",
    "countdown",
    "sokoban",
    "search_qa",
    "two_agent",
    "web_shop",
    "terminal",
    "household",
)
# The checkpoint that the studies still to run start from (their `BASE_POLICY` environment
# variable overrides it): base v5, made by the pretraining command in
# experiments/learning_base_v5.py; its results are in experiments/results/base_policy_v5/.
CHECKPOINT = "runs/base_policy_v5"
# The base model: 4 layers at d_model 128 (the `small` preset), shared by every environment.
MODEL = dict(preset="small", d_model=0, num_layers=0, d_ff=0, num_heads=0, num_kv_heads=0)
# Contexts of 1,400-3,200 slots: RL batches of 4 tasks x 8 samples, and the update split in
# minibatches, as in experiments/results/envs (the memory check refuses the env's default).
# The long-context environments: smaller batches, and the rollout in 4 turn groups: each group
# decodes and prefills against a KV cache only as long as its turns need instead of the whole
# episode's slots, and attention over the cache is most of these rollouts' work (the tokens are
# the same as with one group).
_LONG = {
    "two_agent": dict(num_tasks=4, group_size=8, minibatches=2, turn_groups=4),
    "web_shop": dict(num_tasks=4, group_size=8, minibatches=2, turn_groups=4),
    "terminal": dict(num_tasks=4, group_size=8, minibatches=2, turn_groups=4),
    "household": dict(num_tasks=4, group_size=8, minibatches=4, turn_groups=4),
}


def env_config(name: str, credit: str = "grpo") -> ml_collections.ConfigDict:
    """The config of `configs/<name>.py` (its environment settings, turns and action budget)
    with the built-in vocabulary, the base model and evaluation settings of the base policy."""
    if name not in ENVS:
        raise ValueError(f"configs/base_policy.py: environment {name!r}; allowed: {list(ENVS)}")
    c = importlib.import_module(f"configs.{name}").get_config(credit)
    c.unlock()
    c.env.vocab = "builtin"  # one vocabulary for every environment: one embedding table
    for field, value in MODEL.items():
        c.model[field] = value
    c.train.eval_tasks = 256
    if name in _LONG:
        long = _LONG[name]
        c.rollout.num_tasks = long["num_tasks"]
        c.rollout.group_size = long["group_size"]
        c.train.minibatches = long["minibatches"]
        c.rollout.turn_groups = long["turn_groups"]
    _add_pretrain(c)
    c.lock()
    return c


def _add_pretrain(c: ml_collections.ConfigDict) -> None:
    """The `pretrain` section (scripts/pretrain.py); present in every base-policy config."""
    p = c.pretrain = ml_collections.ConfigDict()
    p.envs = ",".join(ENVS)  # comma-separated environment names
    # Noise levels of the imperfect demonstrations: each episode takes, every turn, a uniformly
    # random action with probability eps, else the oracle's; episodes cycle through the levels.
    p.eps = "0,0.1,0.25,0.5"
    p.demos_per_env = 1024  # episodes on training tasks per environment, failed ones kept
    # Sampling weight of each environment's batches ("name=w,..."; unlisted: 1): the tasks
    # whose action-token NLL stayed highest in an equal-weight run get more of the steps.
    p.weights = "wordle=2,countdown=2,search_qa=2,terminal=1.5,sokoban=1.5"
    p.steps = 2000  # optimizer steps, each on one environment's batch
    p.batch_size = 16  # episodes per step
    p.lr = 1e-3
    p.warmup_steps = 50  # then cosine decay to 0
    p.eval_tasks = 256  # held-out tasks per environment for the final evaluation
    # Stop training after this much wall time of one invocation (0 = no limit): the run is cut
    # (checkpoint, parameters, evaluation, summary) and the same command continues it.
    p.max_minutes = 0.0
    p.eval_every = 0  # also evaluate (test split) every this many steps (0 = at the end only)
    # Save a checkpoint (workdir/checkpoints, newest 2 kept) every this many steps; the same
    # command on the same workdir resumes from the newest one. 0 = none (not resumable).
    p.checkpoint_every = 100
    # A saved base policy (a pretraining or scripts/sft.py workdir) whose parameters start the
    # run, for continued pretraining; the optimizer and schedule start fresh. "" = random init.
    p.init = ""


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        name, _, credit = arg.partition(",")
        return env_config(name, credit or "grpo")
    c = base.get_config()
    c.unlock()
    c.env.vocab = "builtin"
    for field, value in MODEL.items():
        c.model[field] = value
    c.log.progress = True
    _add_pretrain(c)
    c.lock()
    return c
