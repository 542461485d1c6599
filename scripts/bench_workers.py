"""Runs at a time on one host: N training processes sharing its cores against one alone.

  python scripts/bench_workers.py --config=configs/base_policy.py:countdown,grpo \
      --config.rollout.num_tasks=8 --config.rollout.group_size=8 --config.train.minibatches=4 \
      --workers=2 --steps=30 --rounds=2 [--out=DIR]

`scripts/sweep.py --workers=N` runs N training processes at a time, one XLA CPU device each.
Whether N at a time finish a study sooner than one at a time depends on how much of one
process's step leaves the cores idle (Python between the jitted calls, single-threaded
fusions, the environment's step) against how much the processes slow each other down where
they compete for cores and memory bandwidth. Each round runs the config (with its
`--config.KEY=VALUE` overrides and its `init.params` when it has one) in one process alone,
then in N identical processes at once (the same seed, so the same work): `--steps` timed
training steps after two warm-up steps (the first compiles), in processes set up as a sweep's
workers (one XLA CPU device, glibc's huge-page tunable); of the N at once, only the steps that
ran while all N were timing count. Prints per setting the median step
time and the throughput against one process alone, N x (median step alone) / (median step
together): above 1, a study of a fixed number of steps finishes that many times sooner with N
workers; a run with a wall-clock budget gets (median alone) / (median together) of the steps it
would get alone. `--out` also writes `bench_workers.csv` and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_malloc  # noqa: E402
import sweep as sweep_script  # noqa: E402

from rl4agents.train import writers  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(config: str, overrides: list[str], steps: int) -> subprocess.Popen:
    """One training process (bench_malloc's timed child) with a sweep worker's environment."""
    env = sweep_script.worker_env(dict(os.environ), devices=1)
    return subprocess.Popen(
        [sys.executable, "-c", bench_malloc.CHILD, str(steps), config, *overrides],
        env=env,
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> dict:
    """The child's result: per-step "times" and "metrics", CPU "utime"/"stime", "wall"."""
    out, err = proc.communicate()
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"training process failed:\n{err[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def run_together(config: str, overrides: list[str], steps: int, n: int) -> list[dict]:
    """n identical training processes started at once; their results in start order, each
    cut to the steps that ran while every process was in its timed steps (`overlapping`)."""
    procs = [start(config, overrides, steps) for _ in range(n)]
    return overlapping([finish(p) for p in procs])


def overlapping(results: list[dict]) -> list[dict]:
    """`results` with each one's "times" and "metrics" cut to the steps that lie wholly inside
    the span when every process was timing steps, [latest start, earliest end] on the shared
    monotonic clock ("t0" plus the step times), so a process that compiled sooner is not timed
    while it still had the cores to itself; "kept" lists the step indices kept. A process with
    no step inside keeps its first."""
    spans = [(r["t0"], r["t0"] + sum(r["times"])) for r in results]
    lo, hi = max(a for a, _ in spans), min(b for _, b in spans)
    out = []
    for r in results:
        ends = r["t0"] + np.cumsum(r["times"])
        keep = [
            i for i, (end, t) in enumerate(zip(ends, r["times"])) if end - t >= lo and end <= hi
        ]
        keep = keep or [0]
        times, metrics = [r["times"][i] for i in keep], [r["metrics"][i] for i in keep]
        out.append({**r, "times": times, "metrics": metrics, "kept": keep})
    return out


def _same(result: dict, reference: list[dict]) -> bool:
    """Whether a result's metrics equal `reference`'s at the steps it kept."""
    kept = result.get("kept", range(len(result["metrics"])))
    return len(result["metrics"]) == len(kept) and all(
        m == reference[i] for m, i in zip(result["metrics"], kept, strict=True)
    )


def summarize(alone: list[dict], together: list[list[dict]], n: int) -> list[dict]:
    """Table rows from the rounds' results.

    Args:
      alone: one child result per round (the process that ran alone).
      together: per round, the n child results of the processes that ran at once.
      n: processes at a time.

    Returns:
      Two rows (alone, then n at once): processes, median step seconds over every timed step
      of every process (for n at once, the steps `overlapping` kept), steps per second of all
      the processes together, throughput against one process alone, CPU seconds per step
      (all the timed steps), and whether every process's metrics equal the first alone run's
      at the same steps (identical work, so they must).
    """
    reference = alone[0]["metrics"]
    rows = []
    for label, results, k in (("alone", alone, 1), (f"{n} at once", sum(together, []), n)):
        times = [t for r in results for t in r["times"]]
        steps = len(times)
        cpu = sum(r["utime"] + r["stime"] for r in results)
        median = statistics.median(times)
        rows.append(
            {
                "setting": label,
                "processes": k,
                "median_step_s": round(median, 3),
                "steps_per_s": round(k / median, 3),
                "throughput_vs_alone": 0.0,
                "cpu_s_per_step": round(cpu / steps, 2),
                "same_metrics": all(_same(r, reference) for r in results),
            }
        )
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["throughput_vs_alone"] = round(row["steps_per_s"] / base, 3)
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/base_policy.py:countdown,grpo")
    p.add_argument("--workers", type=int, default=2, help="processes at a time (>= 2)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per process")
    p.add_argument("--rounds", type=int, default=2, help="rounds of (alone, N at once)")
    p.add_argument("--out", default="")
    argv = sys.argv[1:] if argv is None else list(argv)
    args, overrides = p.parse_known_args(argv)
    bad = [a for a in overrides if not a.startswith("--config.")]
    if bad:
        p.error(f"unknown arguments {bad}; allowed: the flags above and --config.KEY=VALUE")
    if args.workers < 2:
        p.error(f"--workers={args.workers}; allowed: >= 2 (one alone is the comparison)")
    if args.steps < 1 or args.rounds < 1:
        p.error(f"--steps={args.steps} --rounds={args.rounds}; allowed: >= 1 each")
    alone, together = [], []
    for r in range(args.rounds):
        alone.append(finish(start(args.config, overrides, args.steps)))
        together.append(run_together(args.config, overrides, args.steps, args.workers))
        t1 = statistics.median(alone[-1]["times"])
        tn = statistics.median(t for x in together[-1] for t in x["times"])
        print(f"round {r + 1}: median step alone {t1:.2f} s, {args.workers} at once {tn:.2f} s")
    rows = summarize(alone, together, args.workers)
    print(writers.format_table(rows))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_csv(os.path.join(args.out, "bench_workers.csv"), rows)
        writers.append_command(args.out, "scripts/bench_workers.py", argv)
    return rows


if __name__ == "__main__":
    main()
