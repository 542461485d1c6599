"""Time and memory of a branching rollout per branching factor N, next to independent episodes.

  python scripts/bench_branch.py [--env frozen_lake] [--branches 1,2,4,8] [--rounds 3]
      [--out experiments/results/branching/bench.csv]

For each N: `rollout.branch.branch_rollout` with rule "every" (N continuations from every turn
of each root, the VinePPO setting) on a small config (tiny model, 2 tasks x 2 samples, 4 turns),
and a plain `rollout` of the same number of rows (every row sampled from its prompt), each
jitted once. Reports the rows, the compile time, the median wall time per call over `rounds`
calls after the first, the sampled action tokens (a branch samples only after its fork) and
XLA's memory analysis of the compiled program (temporaries, arguments and outputs), one CSV row
per (N, program).
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rl4agents import config_utils  # noqa: E402
from rl4agents.envs import registry as env_registry  # noqa: E402
from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import branch  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402

FIELDS = [
    "env",
    "context",
    "N",
    "program",
    "rows",
    "compile_s",
    "call_s",
    "sampled_tokens",
    "temp_mib",
    "argument_mib",
    "output_mib",
]


def _measure(fn, args, rounds):
    """(compile s, median call s, memory analysis, last output) of jitted `fn` on `args`."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return compile_s, statistics.median(times[1:] or times), compiled.memory_analysis(), out


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="frozen_lake")
    parser.add_argument("--branches", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3, help="calls per program (>= 2)")
    parser.add_argument("--context", default="full", choices=["full", "window"])
    parser.add_argument("--out", default="experiments/results/branching/bench.csv")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds={args.rounds}; allowed: >= 2 (the first is a warm-up)")
    env = env_registry.make(args.env)
    env_params = env.default_params()
    cfg = rollout_lib.RolloutConfig(
        num_tasks=2,
        group_size=2,
        max_turns=4,
        max_action_len=max(env.max_action_len, 4),
        context=args.context,
        window_turns=1,
    )
    model_cfg = policy_lib.make_config("tiny", env.tokenizer.vocab_size)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    key = jax.random.key(0)
    mib = 1 / 2**20
    rows_out = []
    print(f"jax {jax.__version__}, {jax.device_count()} devices, load {os.getloadavg()[0]:.2f}")
    for n in [int(x) for x in args.branches.split(",")]:
        bc = branch.BranchConfig(rule="every", num_branches=n)
        rows = cfg.batch_size * (1 + cfg.max_turns * n)
        plain_cfg = rollout_lib.RolloutConfig(
            **{**cfg.__dict__, "num_tasks": rows // cfg.group_size}
        )
        programs = {
            "branch": lambda k, p, bc=bc: branch.branch_rollout(
                k, graphdef, p, env, env_params, cfg, bc
            )[0],
            "independent": lambda k, p, c=plain_cfg: rollout_lib.rollout(
                k, graphdef, p, env, env_params, c
            ),
        }
        for name, fn in programs.items():
            compile_s, call_s, mem, traj = _measure(fn, (key, params), args.rounds)
            row = dict(
                env=args.env,
                context=args.context,
                N=n,
                program=name,
                rows=int(traj.tokens.shape[0]),
                compile_s=round(compile_s, 2),
                call_s=round(call_s, 4),
                sampled_tokens=int(np.asarray(traj.action_mask).sum()),
                temp_mib=round(mem.temp_size_in_bytes * mib, 2),
                argument_mib=round(mem.argument_size_in_bytes * mib, 2),
                output_mib=round(mem.output_size_in_bytes * mib, 2),
            )
            rows_out.append(row)
            print(row, flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows_out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
