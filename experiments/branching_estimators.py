"""Branching (tree) credit estimators against plain GRPO from the base policy, at an equal
number of episode rows per step: VinePPO, Tree-GRPO and ARPO, each with its branching rule.

  python scripts/sweep.py experiments/branching_estimators.py \
      --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/branching_estimators --raw \
      --out=experiments/results/branching_estimators --metric=eval_test.greedy_success,wall_s:min \
      --baseline=grpo --strip='^[a-z_]+,' \
      --curve_key=eval_test/greedy_success,train/success,train/action_tokens

Variants (credit estimator, branching rule; docs/methods.md, "Branching rollouts and tree
estimators"):

  grpo        no branching: T x G = 16 tasks x 16 samples (the known-good FrozenLake and
              Sokoban settings of experiments/learning_base_v3.py)
  vineppo     rule "every": one continuation (N = 1) from every turn a root took, so every
              state has a second step from it (VinePPO's Monte Carlo values, arXiv 2410.01679);
              only the roots are trained (`credit.vineppo.train_on = "roots"`)
  tree_grpo   rule "turns" at turns (1, 3), N = 2: trees of 5 leaves per root, advantages
              within the tree and the task group (arXiv 2509.21240)
  arpo        rule "arpo" (ARPO's entropy-rise test, weight 0.2, probability 0.5), at most 2
              forks per root, N = 2 (arXiv 2507.19849)

Budget matching: every variant computes about the same number of episode rows per step, the
256 = 16 x 16 of GRPO. A branching step computes R = T x G x (1 + M x N) rows (M fork slots
per root: max_turns for "every", the listed turns for "turns", max_forks for "arpo";
`BranchConfig.num_rows`), each a full scan over the turns like a root
(experiments/results/branching/: a branching rollout costs 1.1-1.6x an independent rollout of
as many rows at N <= 4), and the update's teacher-forced pass reads every row's whole
history. So the branching variants get fewer tasks per step: FrozenLake (K = 8 turns)
vineppo 14 x 2 x 9 = 252 rows, tree_grpo and arpo 13 x 4 x 5 = 260; Sokoban (K = 12)
vineppo 10 x 2 x 13 = 260, tree_grpo and arpo 260 (ROWS_TOLERANCE: within 5% of GRPO's).
Sampled action tokens are not matched: a branch copies its prefix and samples only from its
fork on (30-36% fewer tokens than as many independent episodes), and a fork slot that its
root never reached is an empty row. Each step logs `train/action_tokens` (the tokens
trained on: under vineppo the roots' only) and `branch/forks`, so the realised budgets are in
the curves. Every run has the same wall-clock budget (MINUTES), which is the fair budget on
this CPU in the end; the table's `steps` say how many steps each variant took in it.

make_table's `episodes_to_reach` column counts T x G episodes per step, the roots only: do not
read it for the branching rows (use the steps and the curves against wall time).

Pairing: every variant runs the same seeds and is evaluated on the same held-out tasks
(`train.eval_seed`, EVAL_TASKS); the table's differences are paired by seed against grpo.

`BRANCHING_ENVS` picks the environments (default frozen_lake,sokoban), `BRANCHING_SEEDS` the
number of seeds (default 3), `BRANCHING_MINUTES` each run's wall-clock budget of training and
in-run evaluation (default 10: about 200 FrozenLake and 100 Sokoban GRPO steps alone on the
2-core CPU; the branching variants take fewer steps, and compile 1-2 minutes longer, inside the
budget).

Cost, one run at a time: 4 variants x 2 environments x 3 seeds = 24 runs x 10 minutes =
4.0 hours (about 4.5 with the final evaluations and start-ups).
"""

import os

from configs import base_policy
from rl4agents import config_utils, sweep

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = ("frozen_lake", "sokoban")
LR = 3e-4
EVAL_TASKS = 256
EVAL_EVERY = 15
# The GRPO batch: rows per step that every variant matches (within ROWS_TOLERANCE).
BASELINE_ROWS = 16 * 16
ROWS_TOLERANCE = 0.05
# The analysis command's arguments (module docstring).
BASELINE = "grpo"
STRIP = "^[a-z_]+,"
_TREE = {"rollout.branch.rule": "turns", "rollout.branch.turns": (1, 3)}
_ARPO = {"rollout.branch.rule": "arpo", "rollout.branch.max_forks": 2}
# variant -> env -> overrides (tasks and samples per step, the branching rule).
VARIANTS = {
    "grpo": {"frozen_lake": {}, "sokoban": {}},
    "vineppo": {
        env: {
            "rollout.num_tasks": tasks,
            "rollout.group_size": 2,
            "rollout.branch.rule": "every",
            "rollout.branch.num_branches": 1,
        }
        for env, tasks in (("frozen_lake", 14), ("sokoban", 10))
    },
    "tree_grpo": {
        env: {
            "rollout.num_tasks": 13,
            "rollout.group_size": 4,
            "rollout.branch.num_branches": 2,
            **_TREE,
        }
        for env in ENVS
    },
    "arpo": {
        env: {
            "rollout.num_tasks": 13,
            "rollout.group_size": 4,
            "rollout.branch.num_branches": 2,
            **_ARPO,
        }
        for env in ENVS
    },
}


def get_sweep():
    envs = _learning.envs_from("BRANCHING_ENVS", ENVS)
    seeds = int(os.environ.get("BRANCHING_SEEDS", "3"))
    minutes = float(os.environ.get("BRANCHING_MINUTES", "10"))
    points = []
    for env in envs:
        for credit, per_env in VARIANTS.items():
            points += sweep.product(
                sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                _learning.from_base(
                    env, BASE_POLICY, LR, minutes, EVAL_TASKS, EVAL_EVERY, **per_env[env]
                ),
                sweep.seeds(seeds),
            )
    return points
