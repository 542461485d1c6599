"""Example study: FrozenLake, GRPO vs PPO-GAE credit, 2 seeds, a few steps (about 2 minutes).

  python scripts/sweep.py experiments/example_sweep.py --workers=2
  python scripts/make_table.py --sweep=runs/sweeps/example_sweep \
      --out=experiments/results/example_sweep

The config argument picks the credit variant (configs/frozen_lake.py:ppo_gae also adds the
value head), so the two variants are two base configs. The fixed overrides shrink the run to
a smoke test; they are shared by every run and stay out of the run names.
"""

from rl4agents import sweep


def get_sweep():
    return sweep.product(
        sweep.configs(["configs/frozen_lake.py:grpo", "configs/frozen_lake.py:ppo_gae"]),
        sweep.fixed(
            {
                "train.num_steps": 4,
                "train.eval_every": 2,
                "train.eval_tasks": 16,
                "train.max_minutes": 0.0,
                "rollout.num_tasks": 4,
                "rollout.group_size": 4,
            }
        ),
        sweep.seeds(2),
    )
