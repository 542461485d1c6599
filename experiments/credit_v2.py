"""Credit study v2: six estimators from the base policy on two long-horizon environments, paired
seeds, a learning-rate sweep per estimator, 1,024 held-out tasks. Two stages, one sweep folder:

  # stage 1, the learning rates: every variant x environment x rate, seed 0
  python scripts/sweep.py experiments/credit_v2.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/credit_v2 --raw \
      --out=experiments/results/credit_v2/lr_stage --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' --lr_select=train/success \
      --curve_key=train/success,eval_test/greedy_success
  # commit experiments/results/credit_v2/lr_stage/ (its lr_sweep.csv is stage 2's input), then
  # stage 2, the seeds: the chosen rate of each variant x environment, seeds 0..4 (seed 0 is
  # stage 1's run, kept: same directory)
  CREDIT_V2_STAGE=seeds python scripts/sweep.py experiments/credit_v2.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/credit_v2 --raw \
      --out=experiments/results/credit_v2 \
      --metric=eval_test.greedy_success --baseline=grpo --strip='^[a-z_]+,' \
      --lr_from=experiments/results/credit_v2/lr_stage/lr_sweep.csv --allow_mixed \
      --curve_key=eval_test/greedy_success,train/success
  # the same without the tuning seed (seeds 1-4 only)
  python scripts/make_table.py ... --exclude='seed=0$' --out=experiments/results/credit_v2/seeds1to4

(`--allow_mixed`: stage 2's runs are made at a later commit than stage 1's, the one that
committed lr_sweep.csv; table.md lists what differs, which must be the commit alone.)

Every run starts from the base policy (BASE_POLICY, default configs/base_policy.py's `CHECKPOINT`)
with that environment's settings (configs/base_policy.py:<env>) and the learning studies'
loss overrides (maze: per-episode aggregation, no entropy bonus; `experiments/learning_base_v3.py`);
maze samples 8 tasks x 8 episodes a step (ROLLOUT), the batch with which GRPO learned it.
The estimators that need a critic get a separate one whose decoder starts as a copy of the base
policy's (`init.critic="policy"`) and whose value projection starts at zero.

Design:
- **A fixed number of updates per environment (STEPS), not a wall-clock budget.** The critic
  variants cost more per step (a second model), so a shared time budget would give them fewer
  updates; every variant gets the same updates and episodes. Sokoban's 150 is about what its
  18-minute GRPO runs from the rebuild of v5 made (164-184 steps; held-out greedy success rose
  from 0.45 to 0.5-0.6 in the first 45-75 steps and slowly after). Maze's 480: at 16 tasks x 16
  samples its 18-minute runs made about 62 updates and did not learn; at 8 x 8 they made
  367-381 and gained +0.216 [+0.123, +0.300] with the in-run curves still rising at the end
  (`experiments/results/learning_v5_rebuild/recipe_batch8x8_maze/`), so this study gives maze
  about a third more updates than that.
- **One run at a time** (`--workers=1`): two runs at once on two cores take twice as long each,
  and a maze run peaks at about 10.5 GB.
- **Rollouts at temperature 1** (CREDIT_V2_TEMPERATURE changes it), a judgement from the first
  build of base v5 (`runs/base_policy_v5` is now its rebuild, another draw of the same recipe):
  at 0.5, after step 40 the median share of countdown's GRPO groups with no reward variance was
  0.81-0.94 (`experiments/results/learning_base_v5/diagnosis.md`), and a group without variance
  gives every estimator here but the critics nothing to assign. At 1 the groups collapse too,
  later and less on the environments measured: frozen_lake 0.69-0.81 after step 40 (and it
  learned as much as at 0.5), maze about a quarter (`experiments/results/learning_base_v5_t1/`).
  From the rebuild, both environments of this study learned at 1 (sokoban +0.073 [+0.035,
  +0.112], `experiments/results/learning_v5_rebuild/t1/`; maze at 8 x 8 above), with a
  quarter to three eighths of maze's groups and a third of sokoban's without variance late in
  the runs.
- **Learning rates chosen on training success, once.** Stage 1 runs seed 0 at each of LRS;
  make_table keeps, per variant x environment, the rate with the best training success over the
  last quarter of the run (never a held-out number) and writes lr_sweep.csv. Stage 2 reads that
  committed file (LR_FILE) and adds the seeds at the chosen rate only; its table keeps the same
  choice (`--lr_from`), so the added seeds cannot change it. Seed 0 both chose the rate and
  counts in the 5-seed result, which favours the variants whose result depends most on the rate
  (the winner's curse); the table without it (`--exclude='seed=0$'`) is reported beside.
- **Pairing:** every variant runs the same seeds (the same rollout keys at step 0) and is
  evaluated on the same tasks (`train.eval_seed`), 256 in the curves, 1,024 at the end; runs are
  ordered seed by seed, so a stage cut short leaves complete pairs.

Cost, one run at a time on the 2-core CPU, at the pace of the rebuild's GRPO runs with their
in-run evaluations (about 6 s a sokoban step at 16 x 16, 2.9 s a maze step at 8 x 8): about 16
minutes a sokoban run and 23 a maze run for grpo, rloo, gigpo and empg; the critic variants
train and run a second model, which adds up to the policy's own cost (not yet measured at these
sizes); plus the final evaluation on 1,024 tasks. Stage 1: 6 variants x 2 environments x 3
rates = 36 runs, about 13-17 hours. Stage 2: 6 x 2 x 4 more seeds = 48 runs, about 17-23 hours.
"""

import os

from configs import base_policy
from rl4agents import config_utils, results, sweep

_here = os.path.dirname(os.path.abspath(__file__))
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
TEMPERATURE = float(os.environ.get("CREDIT_V2_TEMPERATURE", "1.0"))
ENVS = ("sokoban", "maze")
# variant -> (credit name, dotted overrides); the variant is the row label after --strip.
VARIANTS = {
    "grpo": ("grpo", {}),
    "rloo": ("rloo", {}),
    "ppo_gae": ("ppo_gae", {"model.value_head": "separate", "init.critic": "policy"}),
    "turn_gae": ("turn_gae", {"model.value_head": "separate", "init.critic": "policy"}),
    "gigpo": ("gigpo", {"credit.gigpo.gamma": 0.95, "credit.gigpo.invalid_penalty": 0.0}),
    "empg": ("empg", {}),
}
LRS = (1e-4, 3e-4, 1e-3)
STAGES = ("lr", "seeds")
SEEDS = 5  # stage 2
STEPS = {"sokoban": 150, "maze": 480}
EVAL_EVERY = {"sokoban": 15, "maze": 48}  # ten points per curve
ROLLOUT = {"maze": {"rollout.num_tasks": 8, "rollout.group_size": 8}}  # else the env's default
EVAL_TASKS = 1024  # the final evaluation
CURVE_TASKS = 256  # the in-run evaluations of the curves
LR_FILE = os.path.join(_here, "results", "credit_v2", "lr_stage", results.LR_SWEEP_NAME)


def shared(env: str) -> dict:
    """The overrides every run of `env` has."""
    return {
        "init.params": BASE_POLICY,
        "train.num_steps": STEPS[env],
        "train.max_minutes": 0.0,  # no wall-clock limit: every run makes STEPS updates
        "train.eval_every": EVAL_EVERY[env],
        "train.eval_tasks": CURVE_TASKS,
        "train.final_eval_tasks": EVAL_TASKS,
        "train.eval_at_start": True,  # every curve starts at the base policy
        "train.eval_ood": False,
        "log.collapse_metrics": True,
        "rollout.temperature": TEMPERATURE,
        **ROLLOUT.get(env, {}),
        **_v3.OVERRIDES.get(env, {}),
    }


def _run(env: str, variant: str, lr: float, seed: int) -> list[sweep.Point]:
    credit, overrides = VARIANTS[variant]
    return sweep.product(
        sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
        sweep.fixed({**shared(env), **overrides}),
        sweep.sweep_values("optim.lr", [lr]),
        sweep.seeds(1, start=seed),
    )


def chosen_rates(path: str | None = None) -> dict[tuple[str, str], float]:
    """(variant, env) -> the learning rate stage 1 chose, from its committed lr_sweep.csv
    (`path`, else CREDIT_V2_LR_FILE, else LR_FILE)."""
    path = path or os.environ.get("CREDIT_V2_LR_FILE", LR_FILE)
    found = results.read_lr_choice(path)
    missing = [(v, e) for e in ENVS for v in VARIANTS if (v, e) not in found]
    if missing:
        raise ValueError(
            f"{path!r} chooses no learning rate for {missing}; allowed: the lr_sweep.csv of "
            "stage 1 over every variant and environment"
        )
    return {key: float(lr) for key, lr in found.items()}


def get_sweep():
    stage = os.environ.get("CREDIT_V2_STAGE", "lr")
    if stage not in STAGES:
        raise ValueError(f"CREDIT_V2_STAGE={stage!r}; allowed: one of {list(STAGES)}")
    points = []
    if stage == "lr":
        for env in ENVS:
            for variant in VARIANTS:
                for lr in LRS:
                    points += _run(env, variant, lr, 0)
        return points
    rates = chosen_rates()
    # Stage 1's runs stay in the plan (the rates not chosen too: lr_sweep.csv lists them).
    for env in ENVS:
        for variant in VARIANTS:
            for lr in LRS:
                points += _run(env, variant, lr, 0)
    for seed in range(1, SEEDS):
        for env in ENVS:
            for variant in VARIANTS:
                points += _run(env, variant, rates[(variant, env)], seed)
    return points
