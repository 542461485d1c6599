"""Paired held-out evaluation of a study's runs against the policy they started from.

  python scripts/paired_eval.py --sweep=runs/sweeps/learning \
      --out=experiments/results/learning/study_15min --num_tasks=512

For every environment of the study, the start policy (the runs' `init.params`, or the
pretrained weights of their `model.checkpoint`; one per environment) and the latest checkpoint
of each finished run are evaluated, greedy and sampled, on the same `--num_tasks` fixed tasks
of `--split` (drawn with the runs' `train.eval_seed`, or with `--eval_seed` for a set of tasks
no in-run evaluation saw), task by task (`Experiment.task_outcomes_fn`; `--task_batch` plays
them a few at a time where all at once would not fit in memory).
Because every policy meets the same tasks, the change from the start policy is paired: its 95%
interval comes from a bootstrap that resamples seeds and tasks (`results.paired_bootstrap_ci`),
so it covers both the spread between training runs and the sampling of the evaluation tasks.

Writes to --out:
  per_task.csv   the raw outcomes: env, policy ("base" or "rl"), seed, task, greedy/sampled
                 success and reward (the table is a function of this file and nothing else);
  table.csv      env,base_test,rl_test,delta,delta_ci_low,delta_ci_high,seeds,eval_tasks,minutes
                 then rl_test per seed, sampled success (base, RL, and their paired change
                 with its 95% interval), the variant, steps, the p-value of a
                 two-sided sign-flip test over seeds, the runs' CPU-hours (process CPU
                 time, every thread, summed over seeds; the evaluation here not included) and
                 `base_digest`, the start policy's `checkpoint.params_digest` (two builds of
                 one checkpoint path differ there), and `eval_seed`, the seed that drew
                 the tasks (with --eval_seed, the curves' step 0 is the start policy on
                 those tasks, their later points the runs' own evaluations);
  table.md       the same as Markdown;
  curves.png     per environment: held-out greedy success at the runs' evaluations (mean over
                 seeds, min-max band; step 0 is the start policy on --num_tasks tasks) and the
                 training batches' success, from each run's metrics.jsonl;
  run_data/<env>_seed<k>/
                 each evaluated run's small files (RUN_FILES: its command, config, summary and
                 per-step metrics), so that the curves and every training statistic can be
                 remade after the sweep directory is gone.
A run that has not finished is left out and named on stderr. Environments evaluated before
(rows already in --out) are kept unless evaluated again (--no-keep: only this evaluation's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import base  # noqa: E402
from rl4agents import checkpoint as checkpoint_lib  # noqa: E402
from rl4agents import results  # noqa: E402
from rl4agents.train import experiment, writers  # noqa: E402

COLUMNS = results.LEARNING_COLUMNS
EXTRA = (
    "rl_test_per_seed",
    "base_sampled",
    "rl_sampled",
    "sampled_delta",
    "sampled_ci_low",
    "sampled_ci_high",
    "variant",
    "steps",
    "p_sign_flip",
    "cpu_hours",
    "base_digest",
    "eval_seed",
)


def load_config(workdir: str):
    """The run's resolved config (sweep's config.json) over today's defaults."""
    config = base.get_config()
    config.unlock()
    with open(os.path.join(workdir, results.CONFIG_NAME)) as f:
        config.update(json.load(f))
    return config


def start_policy(config) -> tuple[str, str] | None:
    """What a run starts from: ("init.params", path) for a saved policy, ("model.checkpoint",
    folder) for pretrained weights (LoRA adapters, if any, at zero), None for a random init."""
    if config.init.params:
        return ("init.params", config.init.params)
    checkpoint = config.model.get("checkpoint", "")
    return ("model.checkpoint", checkpoint) if checkpoint else None


def run_params(exp, config, workdir: str):
    """The parameters of the run's latest checkpoint, and its step.

    `exp` is built from another run of the same environment (the programs are shared); the
    checkpoint is checked against this run's own `config`.
    """
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        config_json=config.to_json_best_effort(sort_keys=True, indent=2),
        compat_keys=experiment.COMPAT_KEYS,
        compat_defaults=experiment.COMPAT_DEFAULTS,
    )
    try:
        step = ckpt.latest_step()
        state = ckpt.restore(step, exp.abstract_state())
    finally:
        ckpt.close()
    return state.params, step


def outcomes(
    exp, params, split: str, num_tasks: int, batch: int = 0, seed: int | None = None
) -> dict[str, np.ndarray]:
    """Per-task outcomes of `params` on the `num_tasks` tasks that `seed` draws from `split`
    (None: the run's `train.eval_seed`, the tasks of its own evaluations)."""
    fn = exp.task_outcomes_fn(split, num_tasks, batch)
    seed = exp.config.train.eval_seed if seed is None else seed
    return {k: np.asarray(v) for k, v in jax.device_get(fn(params, seed)).items()}


RUN_FILES = ("command.txt", "config.json", "summary.json", results.METRICS_NAME)


def save_run_data(workdir: str, out: str, env: str, seed) -> str:
    """Copies the RUN_FILES that `workdir` has into `out`/run_data/`env`_seed`seed`/ (replacing
    an earlier copy's files; command.txt made `results.portable_command`) and returns that
    folder."""
    dest = os.path.join(out, "run_data", f"{env}_seed{seed}")
    os.makedirs(dest, exist_ok=True)
    for name in RUN_FILES:
        src = os.path.join(workdir, name)
        if not os.path.exists(src):
            continue
        if name == "command.txt":
            with open(src) as f, open(os.path.join(dest, name), "w") as g:
                g.write(results.portable_command(f.read()))
        else:
            shutil.copyfile(src, os.path.join(dest, name))
    return dest


def run_curves(workdir: str, split: str, start: float) -> tuple[list, list]:
    """(held-out greedy success per evaluation, with the start policy's at step 0; training
    success per step) of one run."""
    rows = writers.read_metrics(os.path.join(workdir, results.METRICS_NAME))
    key = f"eval_{split}/greedy_success"
    held_out = [(0, start)] + [(r["step"], r[key]) for r in rows if key in r]
    train = [(r["step"], r["train/success"]) for r in rows if "train/success" in r]
    return held_out, train


def plot(curves: dict, path: str, split: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(curves)
    cols = min(5, len(envs))
    rows = -(-len(envs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, env in zip(axes.flat, envs):
        held_out, train, base_level = curves[env]
        xs, mean, lo, hi, _ = results.curve_stats(train)
        ax.plot(xs, mean, color="C7", lw=0.8, label="training success (sampled)")
        xs, mean, lo, hi, _ = results.curve_stats(held_out)
        ax.plot(xs, mean, "o-", color="C0", ms=3, label=f"{split} greedy (mean of seeds)")
        ax.fill_between(xs, lo, hi, color="C0", alpha=0.25, label="min-max over seeds")
        ax.axhline(base_level, color="C3", ls="--", lw=1, label="base policy")
        ax.set_title(env, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("success", fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", required=True, help="A scripts/sweep.py output directory.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num_tasks", type=int, default=512)
    ap.add_argument("--split", default="test", choices=("train", "test", "ood"))
    ap.add_argument(
        "--task_batch",
        type=int,
        default=0,
        help="Play the tasks this many at a time (a divisor of --num_tasks; 0 = all at once), "
        "so memory is that of this many episodes; greedy outcomes are unchanged, sampled ones "
        "are drawn per batch, the same for every policy.",
    )
    ap.add_argument("--samples", type=int, default=10000, help="Bootstrap resamples.")
    ap.add_argument(
        "--eval_seed",
        type=int,
        default=None,
        help="Draw the tasks (and sampling keys) with this seed instead of the runs' "
        "train.eval_seed: a fresh set of held-out tasks that no run's in-run evaluation saw, "
        "for a confirmatory evaluation.",
    )
    ap.add_argument("--envs", default="", help="Comma-separated environments (default: all).")
    ap.add_argument(
        "--min_seeds", type=int, default=1, help="Leave out environments with fewer finished runs."
    )
    ap.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Keep the rows of environments not evaluated now from --out's table.csv and "
        "per_task.csv (--no-keep: write only this evaluation's).",
    )
    args = ap.parse_args()
    if args.num_tasks < 1:
        sys.exit(f"error: --num_tasks={args.num_tasks}; allowed: >= 1")
    if args.task_batch < 0 or (args.task_batch and args.num_tasks % args.task_batch):
        sys.exit(
            f"error: --task_batch={args.task_batch}; allowed: 0 (all at once) or a divisor of "
            f"--num_tasks={args.num_tasks}"
        )
    plan_path = os.path.join(args.sweep, results.PLAN_NAME)
    if not os.path.exists(plan_path):
        sys.exit(f"error: --sweep={args.sweep!r} holds no {results.PLAN_NAME}")
    with open(plan_path) as f:
        plan = json.load(f)
    by_env: dict[str, list[dict]] = {}
    for entry in plan["runs"]:
        workdir = os.path.join(args.sweep, entry["dir"])
        if not results.is_complete(workdir):
            print(f"skipped (not finished): {workdir}", file=sys.stderr)
            continue
        by_env.setdefault(entry["env"], []).append({**entry, "workdir": workdir})
    wanted = [e for e in args.envs.split(",") if e]
    if wanted:
        missing = sorted(set(wanted) - set(by_env))
        if missing:
            sys.exit(f"error: --envs names {missing}; allowed (finished runs): {sorted(by_env)}")
        by_env = {e: by_env[e] for e in wanted}
    for env in [e for e, runs in by_env.items() if len(runs) < args.min_seeds]:
        print(f"left out: {env} has {len(by_env.pop(env))} finished runs", file=sys.stderr)
    if not by_env:
        sys.exit(f"error: --sweep={args.sweep!r}: no finished run")
    os.makedirs(args.out, exist_ok=True)
    raw, table, curves = [], [], {}
    for env, runs in by_env.items():
        runs.sort(key=lambda r: r["seed"])
        first = load_config(runs[0]["workdir"])
        start = start_policy(first)
        if start is None:
            sys.exit(
                f"error: {runs[0]['workdir']}: no init.params and no model.checkpoint; allowed: "
                "runs that start from a saved policy or a pretrained checkpoint"
            )
        exp = experiment.build(first)
        if first.init.params:
            base_params = exp.saved_params(first.init.params)
        else:  # LoRA adapters start at zero: the pretrained model's own policy
            base_params = exp.pretrained_params()
        base_out = outcomes(
            exp, base_params, args.split, args.num_tasks, args.task_batch, args.eval_seed
        )
        for i in range(args.num_tasks):
            raw.append(_row(env, "base", "", i, base_out))
        rl_outs, minutes, steps, cpu_s = [], [], [], []
        for r in runs:
            config = load_config(r["workdir"])
            if start_policy(config) != start or config.train.eval_seed != first.train.eval_seed:
                sys.exit(
                    f"error: {r['workdir']}: another start policy or eval seed than "
                    f"{runs[0]['workdir']}; allowed: one of each per environment"
                )
            params, step = run_params(exp, config, r["workdir"])
            out = outcomes(exp, params, args.split, args.num_tasks, args.task_batch, args.eval_seed)
            for i in range(args.num_tasks):
                raw.append(_row(env, "rl", r["seed"], i, out))
            rl_outs.append(out)
            save_run_data(r["workdir"], args.out, env, r["seed"])
            summary = results.read_summary(r["workdir"]) or {}
            minutes.append(summary.get("wall_s", float("nan")) / 60)
            cpu_s.append(summary.get("process_cpu_s", float("nan")))
            steps.append(step)
        exp.close()
        info = {"minutes": minutes, "steps": steps, "cpu_s": cpu_s, "variant": runs[0]["variant"]}
        info["base_digest"] = checkpoint_lib.params_digest(base_params)
        info["eval_seed"] = first.train.eval_seed if args.eval_seed is None else args.eval_seed
        row = env_row(env, base_out, rl_outs, [r["seed"] for r in runs], info, args.samples)
        table.append(row)
        b = base_out["greedy_success"]
        # The in-run evaluations use the runs' own eval_tasks; step 0 is the start policy.
        per_run = [run_curves(r["workdir"], args.split, float(b.mean())) for r in runs]
        curves[env] = ([h for h, _ in per_run], [t for _, t in per_run], float(b.mean()))
        print(json.dumps(table[-1]), flush=True)
    if args.keep:
        kept = merge_rows(read_csv(os.path.join(args.out, "table.csv")), table)
        for row in kept[: len(kept) - len(table)]:
            print(f"kept from {args.out}: {row['env']}", file=sys.stderr)
            runs = env_workdirs(args.sweep, row["env"]) or saved_run_dirs(args.out, row["env"])
            base_level = float(row["base_test"])
            per_run = [run_curves(w, args.split, base_level) for w in runs]
            curves[row["env"]] = ([h for h, _ in per_run], [t for _, t in per_run], base_level)
        raw = merge_rows(read_csv(os.path.join(args.out, results.PER_TASK_NAME)), raw)
        # Rows written before a column existed show it empty.
        table = [{c: r.get(c, "") for c in COLUMNS + EXTRA} for r in kept]
        curves = {r["env"]: curves[r["env"]] for r in table if curves.get(r["env"], [[]])[0]}
    writers.write_csv(os.path.join(args.out, results.PER_TASK_NAME), raw)
    writers.write_csv(os.path.join(args.out, "table.csv"), table, COLUMNS + EXTRA)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(writers.format_table(table, list(COLUMNS + EXTRA)) + "\n")
    plot(curves, os.path.join(args.out, "curves.png"), args.split)
    improved = sum(float(r["delta_ci_low"]) > 0 for r in table)
    print(f"{improved} of {len(table)} environments improved (95% interval above 0)")
    cpu = sum(float(r["cpu_hours"]) for r in table)
    print(f"training: {cpu:.2f} CPU-hours (process CPU time of every run; NaN: a run without it)")


def env_row(
    env: str,
    base_out: dict[str, np.ndarray],
    rl_outs: list[dict[str, np.ndarray]],
    seeds: list,
    info: dict,
    samples: int,
) -> dict:
    """One row of table.csv from per-task outcomes.

    Args:
      env: the environment's name.
      base_out: the start policy's outcomes, "greedy_success" and "sampled_success" f[N].
      rl_outs: per seed (len S), the final policy's outcomes, the same keys, f[N] each, on the
        same N tasks as `base_out`.
      seeds: the S seeds, in the order of `rl_outs`.
      info: "minutes", "steps", "cpu_s" (per seed) and "variant" (a list of names) of the runs,
        "base_digest" (the start policy's `checkpoint.params_digest`; "" when absent) and
        "eval_seed" (the seed that drew the tasks; "" when absent).
      samples: bootstrap replicates of the paired interval.

    Returns:
      The row: COLUMNS then EXTRA. `delta` is the mean over seeds and tasks of the greedy
      success change; its interval is `results.paired_bootstrap_ci` (seeds and tasks resampled).
      `sampled_delta` and its interval are the same for sampled decoding (the policy the RL
      objective trains), on the same tasks.
    """
    a = np.stack([o["greedy_success"] for o in rl_outs]).astype(np.float64)  # f[S, N]
    b = np.asarray(base_out["greedy_success"], np.float64)  # f[N]
    if a.shape[1:] != b.shape:
        raise ValueError(
            f"{env}: the runs were evaluated on {a.shape[1:]} tasks, the base on {b.shape}"
        )
    mean, lo, hi = results.paired_bootstrap_ci(a, b, samples=samples, seed=0)
    per_seed = a.mean(axis=1) - b.mean()
    p = results.sign_flip_p(per_seed)
    a_s = np.stack([o["sampled_success"] for o in rl_outs]).astype(np.float64)
    b_s = np.asarray(base_out["sampled_success"], np.float64)
    s_mean, s_lo, s_hi = results.paired_bootstrap_ci(a_s, b_s, samples=samples, seed=0)
    return {
        "env": env,
        "base_test": round(float(b.mean()), 4),
        "rl_test": round(float(a.mean()), 4),
        "delta": round(float(mean), 4),
        "delta_ci_low": round(float(lo), 4),
        "delta_ci_high": round(float(hi), 4),
        "seeds": len(seeds),
        "eval_tasks": int(b.shape[0]),
        "minutes": round(float(np.max(info["minutes"])), 1),
        "rl_test_per_seed": " ".join(f"{v:.3f}" for v in a.mean(axis=1)),
        "base_sampled": round(float(np.mean(base_out["sampled_success"])), 4),
        "rl_sampled": round(float(a_s.mean()), 4),
        "sampled_delta": round(float(s_mean), 4),
        "sampled_ci_low": round(float(s_lo), 4),
        "sampled_ci_high": round(float(s_hi), 4),
        "variant": ",".join(info["variant"]) or "base",
        "steps": " ".join(str(s) for s in info["steps"]),
        "p_sign_flip": None if p is None else round(p, 4),
        "cpu_hours": round(float(np.sum(info["cpu_s"])) / 3600, 2),
        "base_digest": info.get("base_digest", ""),
        "eval_seed": info.get("eval_seed", ""),
    }


def merge_rows(old: list[dict], new: list[dict], key: str = "env") -> list[dict]:
    """The rows of `old` whose `key` no row of `new` has, then `new`: a re-evaluated environment
    replaces its old rows, the others are kept."""
    fresh = {r[key] for r in new}
    return [r for r in old if r[key] not in fresh] + list(new)


def env_workdirs(sweep_dir: str, env: str) -> list[str]:
    """The finished runs under `sweep_dir` whose config's environment is `env` (a study run
    in several batches: the plan names only the latest batch's runs)."""
    out = []
    for name in sorted(os.listdir(sweep_dir)):
        workdir = os.path.join(sweep_dir, name)
        if os.path.isdir(workdir) and results.is_complete(workdir):
            if load_config(workdir).env.name == env:
                out.append(workdir)
    return out


def saved_run_dirs(out: str, env: str) -> list[str]:
    """The run folders of `env` kept under `out`/run_data (`<env>_seed<k>`, each with its
    metrics.jsonl): the curves of rows evaluated from a sweep that is no longer on disk."""
    root = os.path.join(out, "run_data")
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(env)}_seed\d+")
    return [
        os.path.join(root, name)
        for name in sorted(os.listdir(root))
        if pattern.fullmatch(name)
        and os.path.exists(os.path.join(root, name, results.METRICS_NAME))
    ]


read_csv = results.read_csv  # rows of a CSV this script wrote, numbers as numbers


def _row(env: str, policy: str, seed, task: int, out: dict) -> dict:
    return {
        "env": env,
        "policy": policy,
        "seed": seed,
        "task": task,
        **{k: float(out[k][task]) for k in sorted(out)},
    }


if __name__ == "__main__":
    main()
