"""Maze under GRPO: does the token-mean loss's length bias push success down?

In experiments/learning.py GRPO made Maze worse, and without the entropy bonus
(experiments/learning_fixes.py) the policy's entropy still rose and training success still
fell on 2 of 3 seeds, so the bonus is not the cause. The hypothesis tested here: most maze
episodes fail by running out of turns (32 turns, about 85% truncated) while successes are
short, so under `token-mean` aggregation the tokens of failed episodes outnumber those of
successful ones. Group advantages sum to zero over episodes, not over tokens, so the update
has a net push down on the actions the policy took, which raises entropy and moves probability
to unsampled, mostly worse, moves. `seq-mean-token-mean` weighs every episode equally (each
episode's loss is its token mean), so the episode-level advantages again sum to zero.

Everything else as in experiments/learning_fixes.py's maze runs (no entropy bonus), paired seed
for seed:

  BASE_POLICY=runs/base_policy_v2r python scripts/sweep.py experiments/maze_length_bias.py \
      --workers=2
  python scripts/paired_eval.py --sweep=runs/sweeps/maze_length_bias \
      --out=experiments/results/maze_length_bias --num_tasks=512
"""

import os

from rl4agents import config_utils, sweep

_fixes = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning_fixes.py"), "fixes_study"
)
_learning = _fixes._learning
OVERRIDES = {**_fixes.FIXES["maze"], "loss.ppo_clip.agg": "seq-mean-token-mean"}


def get_sweep():
    return sweep.product(
        _learning.env_sweep("maze", _learning.STEPS["maze"]), sweep.fixed(OVERRIDES)
    )
