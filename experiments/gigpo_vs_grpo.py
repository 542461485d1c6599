"""GiGPO against GRPO from the base policy on long-horizon tasks (arXiv 2505.10978 reports +12
points on ALFWorld and +9 on WebShop over GRPO with the same budget).

  python scripts/sweep.py experiments/gigpo_vs_grpo.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/gigpo_vs_grpo --raw \
      --out=experiments/results/gigpo_vs_grpo --metric=eval_test.greedy_success \
      --baseline=grpo --strip='^[a-z_]+,' \
      --curve_key=eval_test/greedy_success,train/frac_steps_grouped,train/step_group_size,\
train/frac_groups_singleton
  python experiments/gigpo_vs_grpo.py --sweep=experiments/results/gigpo_vs_grpo/raw \
      --out=experiments/results/gigpo_vs_grpo

The second command writes `grouped.md` and `grouped.csv`: per environment, over the GiGPO
runs, the share of valid steps in anchor groups larger than one, the mean anchor-group size
and the share of anchor groups that hold one step (the paper reports that share of groups,
under 35% throughout its ALFWorld run), over the whole run, its first EDGE steps and its last
EDGE steps (`grouped_share`).

GiGPO's step groups exist only where states repeat across a task's samples: every GiGPO run
logs `train/frac_steps_grouped` (the share of valid steps whose anchor state another sample of the
same task also reached, i.e. in an anchor group larger than one) and `train/step_group_size`.
Both estimators share everything else, the paper's protocol: N = 8 samples per task, gamma 0.95
for the step returns, no extra invalid-action penalty (the environments charge their own), and
rollouts at temperature 1 (the paper's, and that of the learning runs whose settings both
environments take, below).

Web_shop, the WebShop stand-in, and sokoban, the long-horizon task whose states repeat most
across a task's samples (few distinct positions, many turns), run here, each with the settings
of its learning runs (`experiments/learning_base_v3.py`'s overrides; SETTINGS, LR), shared by
both estimators:
- web_shop at a learning rate of 1e-4 instead of 3e-4: at 3e-4 its greedy success fell within
  the first six updates and its batch success never rose, at 1e-4 batch success went from 0.06
  to 0.13-0.15 (`experiments/results/learning_v5_rebuild/`, `pilot_lr1e-4_web_shop/`);
- sokoban at 3e-4, where GRPO from this base improved held-out greedy success
  (`experiments/results/learning_v5_rebuild/t1/`).

Household, the ALFWorld stand-in, is left out by default (`GIGPO_ENVS` adds it, with its
sub-goal reward in SETTINGS): the base policy (the rebuild of v5) never succeeds there, greedily
or sampled (0 of 256 held-out tasks), and a GRPO pilot with the sub-goal reward made 17 updates
in 18 minutes (every episode runs to the 24-turn limit) without one success in training or on
512 held-out tasks (`experiments/results/learning_v5_rebuild/pilot_progress_household/`). On
success alone neither estimator could move; a comparison there measures nothing.

The credit study v2 (`experiments/credit_v2.py`) compares the same two estimators on sokoban
and maze under another protocol (a learning rate tuned for each, a fixed number of updates,
rollouts at temperature 1); this study keeps the learning runs' wall-clock budget.

Cost on a 2-core CPU: 2 variants x 2 environments x 5 seeds = 20 runs x 20 minutes, one at a
time (`--workers=1`, as the learning runs: a wall-clock budget shared with another run on two
cores would buy fewer updates) = 6.7 hours, plus each run's final evaluation on 512 tasks.
"""

import argparse
import os
import sys

# The project root on the path when run as a script (`configs` is not an installed package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import base_policy
from rl4agents import config_utils, results, sweep
from rl4agents.train import writers

_here = os.path.dirname(os.path.abspath(__file__))
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = tuple(os.environ.get("GIGPO_ENVS", "web_shop,sokoban").split(","))
TEMPERATURE = 1.0
VARIANTS = {"grpo": {}, "gigpo": {"credit.gigpo.gamma": 0.95, "credit.gigpo.invalid_penalty": 0.0}}
SEEDS = 5
LR = {"web_shop": 1e-4}  # else DEFAULT_LR
DEFAULT_LR = 3e-4
SETTINGS = {"household": {"env.household.progress_reward": 0.1}}
MINUTES = 20.0
STEPS = {"sokoban": 400, "maze": 300, "web_shop": 200, "household": 100}  # caps
# About six in-run evaluations of 128 tasks per run (their time counts against the budget);
# the final evaluation, after it, on FINAL_TASKS.
EVAL_EVERY = {"sokoban": 15, "maze": 8, "web_shop": 10, "household": 6}
CURVE_TASKS = 128
FINAL_TASKS = 512


def get_sweep():
    """Every environment's runs, seed by seed (grpo then gigpo for each seed), so a study cut
    short leaves complete pairs."""
    points = []
    for env in ENVS:
        for seed in range(SEEDS):
            for credit, overrides in VARIANTS.items():
                points += sweep.product(
                    sweep.configs([f"configs/base_policy.py:{env},{credit}"]),
                    sweep.fixed(
                        {
                            "init.params": BASE_POLICY,
                            "optim.lr": LR.get(env, DEFAULT_LR),
                            "train.num_steps": STEPS[env],
                            "train.eval_every": EVAL_EVERY[env],
                            "train.eval_tasks": CURVE_TASKS,
                            "train.final_eval_tasks": FINAL_TASKS,
                            "train.eval_at_start": True,  # curves start at the base policy
                            "train.max_minutes": MINUTES,
                            "train.eval_ood": False,
                            "rollout.temperature": TEMPERATURE,
                            **_v3.OVERRIDES.get(env, {}),
                            **SETTINGS.get(env, {}),
                            **overrides,
                        }
                    ),
                    sweep.seeds(1, start=seed),
                )
    return points


EDGE = 10  # steps at each end of a run for the early and late grouped shares
GROUPED_KEYS = {
    "grouped": "train/frac_steps_grouped",
    "group_size": "train/step_group_size",
    "singleton_groups": "train/frac_groups_singleton",
}


def run_grouped(rows: list[dict], edge: int = EDGE) -> dict | None:
    """One run's anchor-group statistics from its metrics.jsonl rows, None if it logged none:
    "steps" (steps that logged them), and for "grouped" (share of valid steps in an anchor group
    larger than one), "group_size" (mean anchor-group size over valid steps) and
    "singleton_groups" (share of anchor groups, not steps, that hold one step: the paper's
    measure) the mean over all those steps, over the first `edge` of them (`*_early`) and over
    the last `edge` (`*_late`)."""
    out: dict = {}
    for name, key in GROUPED_KEYS.items():
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        if not values:
            return None
        out["steps"] = len(values)
        out[name] = sum(values) / len(values)
        out[f"{name}_early"] = sum(values[:edge]) / len(values[:edge])
        out[f"{name}_late"] = sum(values[-edge:]) / len(values[-edge:])
    return out


def grouped_share(sweep_dir: str, edge: int = EDGE) -> list[dict]:
    """Per environment (plan order), over the complete runs that logged anchor groups (GiGPO's):
    "env", "runs", and the mean and sample std over runs (`*_std`, None for one run) of each
    `run_grouped` value."""
    plan = results.read_plan(sweep_dir)
    per_env: dict[str, list[dict]] = {}
    for r in plan:
        workdir = os.path.join(sweep_dir, r["dir"])
        if not results.is_complete(workdir):
            continue
        got = run_grouped(writers.read_metrics(os.path.join(workdir, results.METRICS_NAME)), edge)
        if got is not None:
            per_env.setdefault(r["env"], []).append(got)
    rows = []
    for env, runs in per_env.items():
        row = {"env": env, "runs": len(runs)}
        for key in [k for k in runs[0] if k != "steps"]:
            stat = results.mean_std([x[key] for x in runs])
            row[key], row[f"{key}_std"] = stat.mean, stat.std
        rows.append(row)
    return rows


def grouped_markdown(rows: list[dict], edge: int = EDGE) -> str:
    """`grouped_share`'s rows as a Markdown table: mean +- std over runs, 3 decimals."""

    def show(row, key):
        std = row[f"{key}_std"]
        return f"{row[key]:.3f}" + ("" if std is None else f" ± {std:.3f}")

    lines = [
        f"| env | GiGPO runs | steps in groups > 1 | first {edge} steps | last {edge} steps "
        f"| mean group size | first {edge} steps | last {edge} steps "
        f"| groups of one step | first {edge} steps | last {edge} steps |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [r["env"], str(r["runs"])]
        for name in GROUPED_KEYS:
            cells += [show(r, name), show(r, f"{name}_early"), show(r, f"{name}_late")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="GiGPO's anchor groups per environment.")
    p.add_argument("--sweep", required=True, help="sweep directory (holds sweep.json)")
    p.add_argument("--out", default="", help="write grouped.csv and grouped.md here")
    p.add_argument("--edge", type=int, default=EDGE, help="steps at each end of a run")
    args = p.parse_args(argv)
    if args.edge < 1:
        p.error(f"--edge={args.edge}; allowed: >= 1")
    try:
        rows = grouped_share(args.sweep, args.edge)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    md = grouped_markdown(rows, args.edge)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_csv(os.path.join(args.out, "grouped.csv"), rows)
        writers.write_text(os.path.join(args.out, "grouped.md"), md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
