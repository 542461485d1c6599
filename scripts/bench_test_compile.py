"""Compile time of the test suite's tiny train step under XLA CPU flag sets.

  python scripts/bench_test_compile.py [--repeats 2]
  python scripts/bench_test_compile.py --layers 1,2   # the suite's flags, by model depth

Most of the default suite's time is XLA compiling small programs. This times the program most
tests build: the train step of `tests/train/test_train.py:tiny_config()` (FrozenLake 4x4, tiny
model, 2 layers) on 8 simulated CPU devices, at the optimisation level the suite uses
(`--xla_backend_optimization_level=0`, set in `tests/conftest.py`), with no compilation cache.
Each flag set runs in its own process (XLA reads its flags once), the sets alternate for
`--repeats` rounds. Prints tracing + lowering and compile seconds per run. With `--layers`, the
suite's own flags and the tiny config at each number of layers instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents import config_utils  # noqa: E402  (the one-line refusal of bad arguments)

BASE = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
FLAG_SETS = (
    "",
    "--xla_cpu_use_fusion_emitters=false",  # the suite's setting (tests/conftest.py)
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    "--xla_cpu_use_fusion_emitters=false --xla_cpu_use_thunk_runtime=false",
    "--xla_cpu_use_fusion_emitters=false --xla_cpu_experimental_ynn_fusion_type=",
)

SUITE_FLAGS = FLAG_SETS[1]

CHILD = """
import os, time, jax
jax.config.update("jax_num_cpu_devices", 8)
from tests.train.test_train import tiny_config
from rl4agents.train import experiment
layers = int(os.environ.get("BENCH_LAYERS", "0"))
exp = experiment.build(tiny_config(**({"model.num_layers": layers} if layers else {})))
state = exp.init_state(jax.random.key(0))
t = time.perf_counter(); lowered = exp.train_step.lower(state, exp.root_key())
lower = time.perf_counter() - t
t = time.perf_counter(); lowered.compile(); comp = time.perf_counter() - t
print(f"{lower:.2f} {comp:.2f}")
"""


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the flag sets")
    parser.add_argument(
        "--layers", default="", help="comma list of model depths, e.g. 1,2 (the suite's flags)"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}; allowed: >= 1")
    try:
        depths = [int(n) for n in args.layers.split(",")] if args.layers else []
    except ValueError:
        parser.error(f"--layers={args.layers!r}; allowed: a comma list of integers >= 1")
    if any(n < 1 for n in depths):
        parser.error(f"--layers={args.layers!r}; allowed: a comma list of integers >= 1")
    # (label, extra XLA flags, layers; 0 = the config's own)
    variants = [(f"{n} layer(s)", SUITE_FLAGS, n) for n in depths] or [
        (flags or "(O0 only)", flags, 0) for flags in FLAG_SETS
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    times = {label: [] for label, _, _ in variants}
    for r in range(args.repeats):
        for label, flags, layers in variants:
            env = {
                **os.environ,
                "XLA_FLAGS": f"{BASE} {flags}".strip(),
                "PYTHONPATH": root,
                "BENCH_LAYERS": str(layers),
            }
            out = subprocess.run(
                [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, cwd=root
            )
            if out.returncode != 0:
                raise SystemExit(f"{label} failed:\n{out.stderr[-2000:]}")
            lower, comp = map(float, out.stdout.strip().splitlines()[-1].split())
            times[label].append((lower, comp))
            print(f"round {r + 1}: {label}: lower {lower:.2f} s, compile {comp:.2f} s")
    head = "model depth (suite flags)" if depths else "extra XLA_FLAGS (after the O0 setting)"
    print(f"\n| {head} | trace + lower s | compile s |")
    print("|---|---|---|")
    for label, runs in times.items():
        lows = ", ".join(f"{a:.1f}" for a, _ in runs)
        comps = ", ".join(f"{b:.1f}" for _, b in runs)
        if depths:
            name = label
        else:
            name = "(none)" if label == "(O0 only)" else f"`{label}`"
        print(f"| {name} |", lows, "|", comps, "|")


if __name__ == "__main__":
    main()
