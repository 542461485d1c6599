"""A published loss comparison in miniature: importance sampling (IS), PPO and CISPO policy
losses from the base policy on FrozenLake, 5 seeds each. The comparison this copies (the
Tinker cookbook's, 2026) reports that the three losses reach the same final accuracy with very
different spread between seeds, IS the largest.

  python scripts/sweep.py experiments/loss_t3.py \
      --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/loss_t3 --raw \
      --out=experiments/results/loss_t3 \
      --metric=eval_test.greedy_success --baseline=ppo_clip \
      --curve_key=eval_test/greedy_success,train/ratio_mean,train/pg_clipfrac
  python experiments/loss_t3.py --sweep=runs/sweeps/loss_t3 --early=30

The losses (docs/methods.md, sections 5.1 and 5.3), with rho = pi_theta / pi_old the token
ratio and A the GRPO advantage, all aggregated "token-mean":

  IS      loss.policy=cispo, loss.cispo.ratio_high=None: l = -sg(rho) A log pi_theta, whose
          gradient -rho A grad log pi_theta is that of the unclipped IS objective -rho A
          (no bound on rho, no lower bound either: CISPO's ratio_low is None by default)
  PPO     loss.policy=ppo_clip: clip 0.2 / 0.2 (and the dual clip at 3 for A < 0)
  CISPO   loss.policy=cispo, loss.cispo.ratio_high=5.0: the IS weight capped at 5 (MiniMax-M1,
          arXiv 2506.13585), every token keeps its gradient

The three give the same update while rho = 1, so each batch is split into MINIBATCHES = 4
sequential updates (from the second on, rho leaves 1 and the losses differ); everything else
is the known-good FrozenLake setting of experiments/learning_base_v3.py (lr 3e-4, entropy
bonus 0.05, 16 tasks x 16 samples).

The quantities to report (this file's `seed_spread`, run as above):
  final   held-out greedy success at the end of each run (summary.json
          `eval_test.greedy_success`, EVAL_TASKS tasks): mean and seed std per loss;
  early   the seed std of the in-run held-out greedy success at step EARLY_STEP = 30, the
          second in-run evaluation (every 15 steps), in the first sixth of a 10-minute run:
          early enough that the runs still differ, late enough to be past the first updates.
make_table gives the same final means with paired differences against PPO and the curves.
Every seed is one observation; the evaluation tasks are the same for every run
(`train.eval_seed`), so the spread is between training runs, not between task samples.

`LOSS_T3_SEEDS` sets the number of seeds (default 5), `LOSS_T3_MINUTES` each run's
wall-clock budget of training and in-run evaluation (default 10: about 200 FrozenLake steps
alone on the 2-core CPU, half of experiments/learning_base_v3.py's 18-minute runs).

Cost, one run at a time: 3 losses x 5 seeds = 15 runs x 10 minutes = 2.5 hours (about 2.8
with the final evaluations and start-ups).
"""

import argparse
import os
import sys

# The project root on the path when run as a script (`configs` is not an installed package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import base_policy
from rl4agents import config_utils, results, sweep
from rl4agents.train import writers

_learning = config_utils.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning.py"), "learning_study"
)
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENV = "frozen_lake"
LR = 3e-4
MINIBATCHES = 4
EVAL_TASKS = 256
EVAL_EVERY = 15
EARLY_STEP = 30
# The analysis command's argument (module docstring).
BASELINE = "ppo_clip"
# loss -> the overrides that name its runs
LOSSES = {
    "is": {"loss.policy": "cispo", "loss.cispo.ratio_high": None},
    "ppo": {"loss.policy": "ppo_clip"},
    "cispo": {"loss.policy": "cispo", "loss.cispo.ratio_high": 5.0},
}
CURVE_KEY = "eval_test/greedy_success"
FINAL_KEY = "eval_test.greedy_success"


def get_sweep():
    seeds = int(os.environ.get("LOSS_T3_SEEDS", "5"))
    minutes = float(os.environ.get("LOSS_T3_MINUTES", "10"))
    points = []
    for named in LOSSES.values():
        points += sweep.product(
            sweep.configs([f"configs/base_policy.py:{ENV}"]),
            *[sweep.sweep_values(k, [v]) for k, v in named.items()],
            _learning.from_base(
                ENV,
                BASE_POLICY,
                LR,
                minutes,
                EVAL_TASKS,
                EVAL_EVERY,
                **{"train.minibatches": MINIBATCHES},
            ),
            sweep.seeds(seeds),
        )
    return points


def seed_spread(sweep_dir: str, early_step: int = EARLY_STEP) -> list[dict]:
    """Per variant of a sweep: the final held-out success over seeds and the seed spread early.

    Args:
      sweep_dir: an --out of scripts/sweep.py (holds sweep.json).
      early_step: the in-run evaluation step whose spread is reported (a multiple of
        `train.eval_every`).

    Returns:
      One dict per variant, in plan order: "variant" (the row label, as make_table's),
      "seeds" (complete runs), "final_mean" and "final_std" (`eval_test.greedy_success` of
      summary.json: mean and sample std, ddof=1, over the complete runs), "early_mean",
      "early_std" and "early_seeds" (the same for `eval_test/greedy_success` at `early_step`
      in metrics.jsonl, over the runs that logged it, complete or not). A std is None with
      fewer than 2 values, a mean None with none.
    """
    plan = results.read_plan(sweep_dir)
    labels = results.short_labels([tuple(r["variant"]) for r in plan])
    final: dict[str, list[float]] = {}
    early: dict[str, list[float]] = {}
    for r, label in zip(plan, labels, strict=True):
        final.setdefault(label, [])
        early.setdefault(label, [])
        workdir = os.path.join(sweep_dir, r["dir"])
        if results.is_complete(workdir):
            value = results.get_dotted(results.read_summary(workdir), FINAL_KEY)
            if value is not None:
                final[label].append(float(value))
        metrics = os.path.join(workdir, sweep.METRICS_NAME)
        if os.path.exists(metrics):
            at = [
                row[CURVE_KEY]
                for row in writers.read_metrics(metrics)
                if row.get("step") == early_step and CURVE_KEY in row
            ]
            early[label] += at[-1:]
    rows = []
    for label in final:
        f, e = results.mean_std(final[label]), results.mean_std(early[label])
        rows.append(
            {
                "variant": label,
                "seeds": len(final[label]),
                "final_mean": None if f is None else f.mean,
                "final_std": None if f is None else f.std,
                "early_mean": None if e is None else e.mean,
                "early_std": None if e is None else e.std,
                "early_seeds": len(early[label]),
            }
        )
    return rows


def markdown(rows: list[dict], early_step: int) -> str:
    """`seed_spread`'s rows as a Markdown table (values to 3 decimals, "-" for None)."""

    def show(v):
        return "-" if v is None else f"{v:.3f}"

    lines = [
        f"| loss | seeds | final success | final seed std | step {early_step} success "
        f"| step {early_step} seed std | seeds at step {early_step} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {show(r['final_mean'])} | {show(r['final_std'])} "
            f"| {show(r['early_mean'])} | {show(r['early_std'])} | {r['early_seeds']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Final success and seed spread per loss.")
    p.add_argument("--sweep", required=True, help="sweep directory (holds sweep.json)")
    p.add_argument("--early", type=int, default=EARLY_STEP, help="the early evaluation step")
    args = p.parse_args(argv)
    try:
        rows = seed_spread(args.sweep, args.early)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows, args.early))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
