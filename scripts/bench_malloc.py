"""The C allocator's settings on a training step: page faults, system time and step time.

  python scripts/bench_malloc.py --config=configs/base_policy.py:sokoban \
      --config.init.params=runs/base_policy_v5 --config.rollout.temperature=0.5 \
      --steps=8 --rounds=2 [--out=DIR]

XLA's CPU buffers come from the C library's malloc. With glibc's defaults a large block is
mapped fresh from the kernel and unmapped on release, so every step faults its buffers in
again, page by page, and the kernel zeroes each page: system time that does no training.
glibc reads its tunables (`GLIBC_TUNABLES`) once, when a process starts, so each setting runs
in its own process, one XLA CPU device, the settings alternating for `--rounds` rounds:
`--steps` timed training steps after two warm-up steps (the first compiles) of the config with
its `--config.KEY=VALUE` overrides, from its `init.params` when it has one. Prints, per
setting, the median step time, minor page faults per step, the system share of the process's
CPU time, and whether the steps' metrics equal the default's (an allocator must not change a
number). `--out` also writes `bench_malloc.csv` and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents.train import writers  # noqa: E402

# name -> GLIBC_TUNABLES value ("" = glibc's defaults).
SETTINGS = {
    "default": "",
    # Blocks up to 32 MiB (glibc's largest threshold) come from the heap, and freed memory
    # stays in it: a step reuses the pages the last step faulted in.
    "keep": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736",
    # The same, and the heap asks for transparent huge pages (2 MiB: 512 times fewer faults).
    "keep_huge": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736"
    ":glibc.malloc.hugetlb=1",
    "huge": "glibc.malloc.hugetlb=1",
}

CHILD = r"""
import json, resource, sys, time
import jax
from rl4agents import config_utils
from rl4agents.train import experiment, loop
steps, spec, overrides = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
c = config_utils.parse_command_config(spec, overrides)
exp = experiment.build(c)
state = exp.init_state(jax.random.fold_in(exp.root_key(), 2**31 - 1))
if c.init.params:
    state = loop._warm_start(exp, state, c.init.params)
root = exp.root_key()
out = {"times": [], "metrics": []}
for i in range(steps + 2):
    if i == 2:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    t = time.perf_counter()
    state, metrics = exp.train_step(state, root)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if i >= 2:
        out["times"].append(time.perf_counter() - t)
        out["metrics"].append(metrics)
r1 = resource.getrusage(resource.RUSAGE_SELF)
out["minflt"] = r1.ru_minflt - r0.ru_minflt
out["utime"] = r1.ru_utime - r0.ru_utime
out["stime"] = r1.ru_stime - r0.ru_stime
out["wall"] = time.perf_counter() - t0
out["t0"] = t0  # the monotonic clock at the first timed step, comparable across processes
print("RESULT " + json.dumps(out))
exp.close()
"""


def run_child(config: str, overrides: list[str], steps: int, tunables: str) -> dict:
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps), config, *overrides],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child failed ({tunables or 'default'}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/base_policy.py:sokoban")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--out", default="")
    argv = sys.argv[1:] if argv is None else list(argv)
    args, overrides = p.parse_known_args(argv)
    bad = [a for a in overrides if not a.startswith("--config.")]
    if bad:
        p.error(f"unknown arguments {bad}; allowed: the flags above and --config.KEY=VALUE")
    names = [s for s in args.settings.split(",") if s]
    unknown = [s for s in names if s not in SETTINGS]
    if unknown or "default" not in names:
        p.error(f"--settings={args.settings}; allowed: default plus any of {list(SETTINGS)}")
    if args.steps < 1 or args.rounds < 1:
        p.error(f"--steps={args.steps} --rounds={args.rounds}; allowed: >= 1 each")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            runs[n].append(run_child(args.config, overrides, args.steps, SETTINGS[n]))
            t = statistics.median(runs[n][-1]["times"])
            print(f"round {r + 1} {n:10s} median step {t:.2f} s", flush=True)
    reference = runs["default"][0]["metrics"]
    rows = []
    for n in names:
        times = [t for x in runs[n] for t in x["times"]]
        steps = sum(len(x["times"]) for x in runs[n])
        cpu = sum(x["utime"] + x["stime"] for x in runs[n])
        rows.append(
            {
                "setting": n,
                "glibc_tunables": SETTINGS[n],
                "median_step_s": round(statistics.median(times), 3),
                "vs_default": 0.0,
                "minor_faults_per_step": round(sum(x["minflt"] for x in runs[n]) / steps),
                "system_share": round(sum(x["stime"] for x in runs[n]) / cpu, 3),
                "cpu_s_per_step": round(cpu / steps, 2),
                "same_metrics": all(x["metrics"] == reference for x in runs[n]),
            }
        )
    base = rows[names.index("default")]["median_step_s"]
    for row in rows:
        row["vs_default"] = round(row["median_step_s"] / base, 3)
    print(writers.format_table(rows))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_csv(os.path.join(args.out, "bench_malloc.csv"), rows)
        writers.append_command(args.out, "scripts/bench_malloc.py", argv)


if __name__ == "__main__":
    main()
