"""RAGEN's "echo trap" in miniature (arXiv 2504.20073): under GRPO the reward variance within
groups and the policy's entropy collapse before success does, and the paper's remedies delay
or prevent it. Four variants from base policy v5, side by side:

  grpo          the baseline: GRPO, PPO's clip at 0.2 / 0.2
  top_p_var     grpo keeping only the highest reward-variance groups that hold 90% of the
                batch's variance (`sampling.filter=top_p_variance`, RAGEN-2's rule)
  critic        ppo_gae with a separate critic whose decoder starts as a copy of the base
                policy's (`init.critic=policy`), RAGEN's "critic incorporation"
  clip_higher   grpo with the upper clip at 0.28 (DAPO's clip-higher, RAGEN's decoupled clip)

  python scripts/sweep.py experiments/echo_trap.py --workers=1 --devices=1
  python scripts/make_table.py --sweep=runs/sweeps/echo_trap --raw \
      --out=experiments/results/echo_trap --metric=eval_test.greedy_success,wall_s:min \
      --baseline=grpo --strip='^[a-z_]+,' --curve_key=eval_test/greedy_success,\
train/zero_std_groups,train/entropy,train/reward_std,train/mi/gap
  python experiments/echo_trap.py --sweep=experiments/results/echo_trap/raw \
      --out=experiments/results/echo_trap

The second command reads the collapse signature off each run (`signature`): the step at which
the share of groups without reward variance reaches ZERO_STD_LEVEL, entropy and reward std
fall to ENTROPY_FRACTION of their start, batch success falls SUCCESS_DROP below its peak, and
held-out greedy success SUCCESS_DROP below the start policy's, every per-step series a centred
mean over WINDOW steps; `signature.md` gives per variant the median steps and how often the
variance collapsed first, `signature.png` the curves.

Why these settings: each environment starts from the GRPO run of base v5 (its rebuild,
`runs/base_policy_v5`) in which the trap was seen, with that run's settings (each environment's
overrides of `experiments/learning_base_v3.py`, its batch, temperature and in-run evaluation,
SETTINGS):
- countdown: the one-seed pilot of `experiments/learning_recipes.py` with `RECIPE=batch8x8`
  (8 tasks x 8 samples a step, temperature 1; `experiments/results/learning_v5_rebuild/`,
  `pilot_batch8x8_countdown/`). The share of groups whose samples all got the same reward rose
  from about half over the first 60 steps to 0.88 by steps 120-180 and 0.93-0.96 after step
  600; entropy per action token fell from 0.83 to 0.15 by step 150; batch success stopped at
  about 0.3 by step 100, and held-out greedy success peaked at step 60 and fell below the base's
  from step 420 on (-0.039 [-0.076, -0.002] at the end, 944 steps);
- frozen_lake: the v5 learning study at temperature 0.5 (`experiments/learning_base_v5.py`),
  where from the first build of v5 0.69-0.81 of the groups had no variance after step 40.
Three changes are shared by all four variants, the baseline included:
- a fixed number of steps (STEPS) instead of the 18-minute wall-clock budget: the variants do
  not cost the same per step (the critic adds a model), and the trap is a function of updates,
  so every variant gets the same updates. STEPS covers the pilot's collapse and the fall of its
  greedy success on countdown, and three to four times the steps after which frozen_lake's
  groups had emptied;
- `train.minibatches = 4`: each batch is split into four sequential updates. With one update per
  batch the ratio is exactly 1 when the loss is taken, so a clip (0.2 or 0.28) never acts and
  clip-higher would be GRPO itself; from the second minibatch on the ratio leaves 1.
- `log.collapse_metrics` and `log.mi_proxy`: every step logs the collapse signature,
  `zero_std_groups` (share of groups with no reward variance), `entropy`, `reward_std` and
  `reward_group_std` (mean within-group std), and RAGEN-2's mutual-information proxy `mi/gap`
  (how much more likely each episode's actions are under its own prompt than under another
  task's: near 0 when the outputs no longer depend on the input), beside `filter/kept_frac`
  for the filter. The proxy is one more teacher-forced pass over twice the batch.
Every run also evaluates the base policy at step 0 (`train.eval_at_start`), so each curve
starts where training did. The final evaluation is on FINAL_TASKS held-out tasks, the same
tasks for every run of an environment, so make_table's differences against grpo are paired by
seed and task set.

`ECHO_ENVS` picks the environments (default countdown,frozen_lake: the two where the trap
showed), `ECHO_SEEDS` the number of seeds (default 3), `BASE_POLICY` the start.
Runs are ordered seed by seed, so an interrupted study has complete pairs.

Cost, one run at a time on the 2-core CPU, estimated from the runs the settings come from
(countdown's pilot 1.1 s a step, frozen_lake's learning runs about 5.5 s; the proxy's extra pass
adds to that, the critic more): countdown 4 variants x 3 seeds x 12-20 minutes = about 3 hours,
frozen_lake 4 x 3 x 15-25 minutes = about 4 hours.
"""

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys

import numpy as np

# The project root on the path when run as a script (`configs` is not an installed package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import base_policy
from rl4agents import config_utils, results, sweep
from rl4agents.train import writers

_here = os.path.dirname(os.path.abspath(__file__))
_learning = config_utils.load_module(os.path.join(_here, "learning.py"), "learning_study")
_full = config_utils.load_module(os.path.join(_here, "learning_full_budget.py"), "full_budget")
_v3 = config_utils.load_module(os.path.join(_here, "learning_base_v3.py"), "learning_base_v3")
BASE_POLICY = os.environ.get("BASE_POLICY", base_policy.CHECKPOINT)
ENVS = ("countdown", "frozen_lake")
# env -> the settings of the run in which the trap was seen, on top of the learning study's
SETTINGS = {
    "countdown": {
        "rollout.temperature": 1.0,
        "rollout.num_tasks": 8,
        "rollout.group_size": 8,
        "train.eval_every": 40,
    },
    "frozen_lake": {"rollout.temperature": 0.5},
}
MINIBATCHES = 4
FINAL_TASKS = 512
STEPS = {"countdown": 480, "frozen_lake": 150}
# The analysis command's arguments (module docstring).
BASELINE = "grpo"
STRIP = "^[a-z_]+,"
# variant -> (credit name, the override that names its runs (None: none), other overrides)
VARIANTS = {
    "grpo": ("grpo", None, {}),
    "top_p_var": (
        "grpo",
        ("sampling.filter", "top_p_variance"),
        {"sampling.top_p_variance.p": 0.9},
    ),
    "critic": ("ppo_gae", None, {"model.value_head": "separate", "init.critic": "policy"}),
    "clip_higher": ("grpo", ("loss.ppo_clip.clip_high", 0.28), {}),
}


def shared(env: str) -> dict:
    """The overrides every variant of `env` shares: the learning study's and SETTINGS[env],
    plus MINIBATCHES, the collapse metrics and the final evaluation's size. The step budget is
    set in `get_sweep` over the learning study's."""
    return {
        **_v3.OVERRIDES.get(env, {}),
        "init.params": BASE_POLICY,
        **SETTINGS[env],
        "train.minibatches": MINIBATCHES,
        "train.final_eval_tasks": FINAL_TASKS,
        "train.eval_at_start": True,
        "log.collapse_metrics": True,
        "log.mi_proxy": True,
    }


def get_sweep():
    seeds = int(os.environ.get("ECHO_SEEDS", "3"))
    points = []
    for env in _learning.envs_from("ECHO_ENVS", ENVS):
        runs = _full.env_sweep(env, shared(env), seeds=seeds, eval_every=_v3.EVAL_EVERY.get(env))
        budget = {"train.num_steps": STEPS[env], "train.max_minutes": 0.0}  # 0: no wall limit
        for run in runs:  # one seed at a time, every variant
            spec = run.config
            run = dataclasses.replace(run, config=None, overrides={**run.overrides, **budget})
            for credit, named, overrides in VARIANTS.values():
                variant = sweep.Point(
                    config=f"{spec},{credit}",
                    overrides={**(dict([named]) if named else {}), **overrides},
                    named=(named[0],) if named else (),
                )
                points += sweep.product([variant], [run])
    return points


# The collapse signature (`signature`): each per-step series is smoothed by a centred mean over
# WINDOW + 1 steps (WINDOW / 2 either side) before a crossing is read, so one unlucky batch does
# not count as a collapse and the smoothing does not delay a crossing.
WINDOW = 10
ZERO_STD_LEVEL = 0.8  # a collapsed batch: at least this share of groups without reward variance
ENTROPY_FRACTION = 0.5  # entropy collapsed: at or below this fraction of its first window's
SUCCESS_DROP = 0.05  # success fallen: this far below the start (held-out) or the peak (batch)
SIGNATURE_KEYS = {
    "zero_std": "train/zero_std_groups",
    "entropy": "train/entropy",
    "reward_std": "train/reward_std",
    "train_success": "train/success",
    "greedy": "eval_test/greedy_success",
}


def centred_mean(steps: list[int], values: list[float], window: int) -> list[float]:
    """values[i] replaced by the mean of the values logged at steps in
    [steps[i] - window // 2, steps[i] + window // 2] (steps ascending): a window in steps, not
    rows, so a gap in the log does not stretch it."""
    half = window // 2
    out, lo, hi, total = [], 0, 0, 0.0
    for step in steps:
        while hi < len(steps) and steps[hi] <= step + half:
            total += values[hi]
            hi += 1
        while steps[lo] < step - half:
            total -= values[lo]
            lo += 1
        out.append(total / (hi - lo))
    return out


def first_step(steps: list[int], values: list[float], hit) -> int | None:
    """The first step whose value satisfies `hit`, None if none does."""
    return next((s for s, v in zip(steps, values, strict=True) if hit(v)), None)


def smoothed(rows: list[dict], key: str, window: int) -> tuple[list[int], list[float]]:
    """(steps, centred means over `window` steps) of `key` in metrics rows, at the steps whose
    window lies inside the logged steps (from the first + window // 2 to the last -
    window // 2); empty if there are none."""
    pts = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None]
    if not pts:
        return [], []
    steps, values = [p[0] for p in pts], [p[1] for p in pts]
    means = centred_mean(steps, values, window)
    lo, hi = steps[0] + window // 2, steps[-1] - window // 2
    kept = [(s, v) for s, v in zip(steps, means, strict=True) if lo <= s <= hi]
    return [s for s, _ in kept], [v for _, v in kept]


def run_signature(rows: list[dict], window: int = WINDOW) -> dict:
    """The collapse signature of one run's metrics.jsonl rows.

    Every per-step series is a centred mean over `window` steps (`smoothed`). Returns a dict of
    steps (None where the event never happens):
      "zero_std_step": the first step whose share of zero-variance groups reaches
        ZERO_STD_LEVEL;
      "entropy_step": the first step whose entropy is at most ENTROPY_FRACTION x the first
        window's (None when that is 0);
      "reward_std_step": the same for the batch's reward std;
      "train_fall_step": the first step at which batch success is SUCCESS_DROP or more below
        its highest value so far;
      "greedy_fall_step": the first in-run evaluation after step 0 whose held-out greedy
        success is SUCCESS_DROP or more below the step-0 evaluation (the start policy's), and
        "greedy_prev_step" the evaluation before it (where it had not fallen yet): the fall
        happened between the two;
    and "greedy_start", "greedy_min", "greedy_last" (held-out greedy success at step 0, its
    lowest and its last in-run value), "entropy_start", "entropy_end", "zero_std_start",
    "zero_std_end" (first and last window), and "steps" (the last logged step).
    """
    out: dict = {}
    st, zs = smoothed(rows, SIGNATURE_KEYS["zero_std"], window)
    out["zero_std_step"] = first_step(st, zs, lambda v: v >= ZERO_STD_LEVEL)
    out["zero_std_start"], out["zero_std_end"] = (zs[0], zs[-1]) if zs else (None, None)
    for name in ("entropy", "reward_std"):
        st, sm = smoothed(rows, SIGNATURE_KEYS[name], window)
        start = sm[0] if sm else 0.0
        limit = ENTROPY_FRACTION * start
        out[f"{name}_step"] = first_step(st, sm, lambda v, c=limit: v <= c) if start > 0 else None
        if name == "entropy":
            out["entropy_start"], out["entropy_end"] = (sm[0], sm[-1]) if sm else (None, None)
    st, sm = smoothed(rows, SIGNATURE_KEYS["train_success"], window)
    peak = np.maximum.accumulate(sm).tolist() if sm else []
    out["train_fall_step"] = next(
        (s for s, v, m in zip(st, sm, peak, strict=True) if v <= m - SUCCESS_DROP), None
    )
    key = SIGNATURE_KEYS["greedy"]
    evals = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None]
    start = evals[0][1] if evals and evals[0][0] == 0 else None
    out["greedy_start"] = start
    out["greedy_min"] = min(v for _, v in evals) if evals else None
    out["greedy_last"] = evals[-1][1] if evals else None
    fall = (
        None
        if start is None
        else next((i for i, (_, v) in enumerate(evals) if i and v <= start - SUCCESS_DROP), None)
    )
    out["greedy_fall_step"] = None if fall is None else evals[fall][0]
    out["greedy_prev_step"] = None if fall is None else evals[fall - 1][0]
    out["steps"] = max((r["step"] for r in rows), default=0)
    return out


def signature(sweep_dir: str, window: int = WINDOW) -> list[dict]:
    """`run_signature` of every run of a sweep folder that logged steps (its raw/ copy works
    too), in plan order, with "variant" (make_table's row label with STRIP applied), "env",
    "seed" and "complete"."""
    plan = results.read_plan(sweep_dir)
    labels = results.short_labels([tuple(r["variant"]) for r in plan])
    out = []
    for r, label in zip(plan, labels, strict=True):
        workdir = os.path.join(sweep_dir, r["dir"])
        rows = writers.read_metrics(os.path.join(workdir, results.METRICS_NAME))
        if not rows:
            continue
        row = {
            "variant": re.sub(STRIP, "", label) or "base",
            "env": r["env"],
            "seed": r["seed"],
            "complete": results.is_complete(workdir),
        }
        out.append({**row, **run_signature(rows, window)})
    return out


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _before(runs: list[dict], early: str, late: str) -> str:
    """ "k/n": of the n runs in which `late` happened, the k in which `early` happened no later."""
    late_runs = [r for r in runs if r[late] is not None]
    k = sum(r[early] is not None and r[early] <= r[late] for r in late_runs)
    return f"{k}/{len(late_runs)}"


def _before_greedy(runs: list[dict]) -> str:
    """ "b / t / a": of the runs whose held-out greedy success fell, those whose zero-variance
    step came before the last evaluation ahead of the fall (b), between it and the fall's (t:
    the evaluations cannot order them) and after the fall or never (a)."""
    fell = [r for r in runs if r["greedy_fall_step"] is not None]
    z = [r["zero_std_step"] for r in fell]
    before = sum(s is not None and s <= r["greedy_prev_step"] for s, r in zip(z, fell))
    after = sum(s is None or s > r["greedy_fall_step"] for s, r in zip(z, fell))
    return f"{before} / {len(fell) - before - after} / {after}"


def summary_markdown(runs: list[dict]) -> str:
    """Per environment and variant, over its complete runs: the median step of each collapse
    event with the runs in which it happened; whether the share of zero-variance groups
    reached ZERO_STD_LEVEL no later than batch success fell (k of the runs where it fell) and
    before, between or after the evaluations that saw held-out greedy success fall; and the
    median held-out greedy success (in-run evaluations) at step 0 and at the end."""

    def show(v):
        return "-" if v is None else f"{v:.3f}"

    lines = [
        "| env | variant | runs | zero-variance step | entropy step | reward-std step "
        "| batch-success fall step | greedy fall step | variance first (batch) "
        "| variance before / with / after greedy fall | greedy, start -> end |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    keys = ("zero_std_step", "entropy_step", "reward_std_step", "train_fall_step")
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["complete"]:
            groups.setdefault((r["env"], r["variant"]), []).append(r)
    for (env, variant), rs in groups.items():
        cells = [env, variant, str(len(rs))]
        for key in (*keys, "greedy_fall_step"):
            hit = [r[key] for r in rs if r[key] is not None]
            cells.append(f"{_median(hit):g} ({len(hit)}/{len(rs)})" if hit else "never")
        cells.append(_before(rs, "zero_std_step", "train_fall_step"))
        cells.append(_before_greedy(rs))
        start = _median([r["greedy_start"] for r in rs])
        cells.append(f"{show(start)} -> {show(_median([r['greedy_last'] for r in rs]))}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_signature(sweep_dir: str, png: str, window: int = WINDOW) -> None:
    """One column per environment, rows: held-out greedy success (in-run evaluations), batch
    success, the share of zero-variance groups, entropy and reward std (the last four a centred
    mean over `window` steps); per variant the mean over its complete runs, band min-max."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with open(os.path.join(sweep_dir, sweep.PLAN_NAME)) as f:
        plan = json.load(f)["runs"]
    labels = [
        re.sub(STRIP, "", x) for x in results.short_labels([tuple(r["variant"]) for r in plan])
    ]
    envs = list(dict.fromkeys(r["env"] for r in plan))
    panels = ("greedy", "train_success", "zero_std", "entropy", "reward_std")
    fig = Figure(figsize=(6.5 * len(envs), 2.6 * len(panels)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), len(envs), squeeze=False)
    for col, env in enumerate(envs):
        for row, name in enumerate(panels):
            ax = axes[row][col]
            key = SIGNATURE_KEYS[name]
            for label in dict.fromkeys(labels):
                curves = []
                for r, lab in zip(plan, labels, strict=True):
                    done = results.is_complete(os.path.join(sweep_dir, r["dir"]))
                    if lab != label or r["env"] != env or not done:
                        continue
                    rows = writers.read_metrics(
                        os.path.join(sweep_dir, r["dir"], results.METRICS_NAME)
                    )
                    pts = [(x["step"], float(x[key])) for x in rows if x.get(key) is not None]
                    if not pts:
                        continue
                    st, vs = [p[0] for p in pts], [p[1] for p in pts]
                    if name != "greedy":
                        vs = centred_mean(st, vs, window)
                    curves.append(dict(zip(st, vs, strict=True)))
                if not curves:
                    continue
                common = sorted(set.intersection(*(set(c) for c in curves)))
                values = np.array([[c[s] for s in common] for c in curves])
                line = ax.plot(common, values.mean(0), label=f"{label} (n={len(curves)})")[0]
                if len(curves) > 1:
                    ax.fill_between(
                        common, values.min(0), values.max(0), color=line.get_color(), alpha=0.2
                    )
            what = key if name == "greedy" else f"{key}, centred mean over {window} steps"
            ax.set_title(f"{env}: {what}", fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if row == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The echo trap's collapse signature per run.")
    p.add_argument("--sweep", required=True, help="sweep directory (holds sweep.json)")
    p.add_argument("--out", default="", help="write signature.csv, signature.md, signature.png")
    p.add_argument("--window", type=int, default=WINDOW, help="smoothing window, in steps")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error(f"--window={args.window}; allowed: >= 1")
    try:
        runs = signature(args.sweep, args.window)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    md = summary_markdown(runs)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_csv(os.path.join(args.out, "signature.csv"), runs)
        writers.write_text(os.path.join(args.out, "signature.md"), md + "\n")
        plot_signature(args.sweep, os.path.join(args.out, "signature.png"), args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
