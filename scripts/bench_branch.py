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

  python scripts/bench_branch.py --mode scoring [--rule every] [--branches 1,2,4,8]
      [--turns 4] [--model tiny] [--out experiments/results/branching/bench_scoring.csv]

Mode "scoring": the update's teacher-forced pass over the rows of one branching rollout of rule
`--rule` (context="full", the update's slots, the action slots scored as the losses read them),
with each branch row's shared prefix computed once per root (`views.fork_prefix`, sharing "on")
and by every row (sharing "off"): program "score" (the forward pass of `prepare_batch`) and
"score_grad" (forward and backward of a sum of the log-probs, as the loss's pass), jitted once
each. One CSV row per (N, program, sharing), with XLA's FLOP count of the compiled program; the
off / on ratios of the FLOPs, the call time and the temporaries are printed per (N, program).
Wall times on a shared machine are noisy: the FLOP ratio is the stable measure of the work saved.
"""

from __future__ import annotations

import csv
import functools
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
from rl4agents.train import step as step_lib  # noqa: E402
from rl4agents.train import views  # noqa: E402

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
SCORING_FIELDS = [
    "env",
    "rule",
    "N",
    "program",
    "sharing",
    "rows",
    "slots",
    "compile_s",
    "call_s",
    "gflops",
    "temp_mib",
]


def _measure(fn, args, rounds, flops=None):
    """(compile s, median call s, memory analysis, last output) of jitted `fn` on `args`;
    `flops` (a list): XLA's FLOP count of the compiled program is appended to it."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    if flops is not None:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        flops.append(float(cost.get("flops", float("nan"))))
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return compile_s, statistics.median(times[1:] or times), compiled.memory_analysis(), out


def _scoring_rows(args, env, env_params, cfg, graphdef, params) -> list[dict]:
    """Mode "scoring": the update's scoring pass with and without the forked prefix."""
    key = jax.random.key(0)
    rule = {"rule": args.rule}
    if args.rule == "turns":
        rule["turns"] = tuple(range(1, cfg.max_turns))
    elif args.rule in ("entropy", "arpo"):
        rule.update(max_forks=2, entropy_threshold=-1.0)
    out = []
    for n in [int(x) for x in args.branches.split(",")]:
        bc = branch.BranchConfig(num_branches=n, **rule)
        step_cfg = step_lib.StepConfig(
            graphdef=graphdef,
            env=env,
            env_params=env_params,
            rollout=cfg,
            credit_fn=None,
            needs_values=False,
            loss=step_lib.LossConfig(policy_fn=None),
            optimizer=None,
            shared_prompt=rollout_lib.make_layout(env, cfg).prompt,
            branch=bc,
        )
        forks = views.fork_prefix(step_cfg, full_batch=True)
        t = views.train_length(step_cfg)
        tree, _ = jax.jit(
            lambda k, p, bc=bc: branch.branch_rollout(k, graphdef, p, env, env_params, cfg, bc)
        )(key, params)
        tokens, valid = tree.tokens[:, :t], tree.valid_mask[:, :t]
        act = rollout_lib.action_slots(step_cfg.layout)
        slots = jax.numpy.asarray(np.broadcast_to(act, (tokens.shape[0], len(act))))

        def score(p, tok, val, sl, f):
            sc = rollout_lib.score_params(graphdef, p, tok, val, 1.0, False, sl, forks=f)
            return sc.logp.sum(), sc

        programs = {
            "score": lambda f, *a: score(*a, f)[1],
            "score_grad": lambda f, p, *a: jax.grad(lambda q: score(q, *a, f)[0])(p),
        }
        for name, fn in programs.items():
            times = {}
            for sharing, f in (("on", forks), ("off", None)):
                flops = []
                compile_s, call_s, mem, _ = _measure(
                    functools.partial(fn, f), (params, tokens, valid, slots), args.rounds, flops
                )
                times[sharing] = (call_s, flops[0], mem.temp_size_in_bytes)
                row = dict(
                    env=args.env,
                    rule=args.rule,
                    N=n,
                    program=name,
                    sharing=sharing,
                    rows=int(tokens.shape[0]),
                    slots=int(t),
                    compile_s=round(compile_s, 2),
                    call_s=round(call_s, 5),
                    gflops=round(flops[0] / 1e9, 4),
                    temp_mib=round(mem.temp_size_in_bytes / 2**20, 3),
                )
                out.append(row)
                print(row, flush=True)
            (t_on, f_on, m_on), (t_off, f_off, m_off) = times["on"], times["off"]
            print(
                f"N={n} {name}: off/on FLOPs {f_off / f_on:.2f}x, call time "
                f"{t_off / t_on:.2f}x, temporaries {m_off / max(m_on, 1):.2f}x",
                flush=True,
            )
    return out


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="frozen_lake")
    parser.add_argument("--branches", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3, help="calls per program (>= 2)")
    parser.add_argument("--context", default="full", choices=["full", "window"])
    parser.add_argument("--out", default=None, help="CSV path (default by mode)")
    parser.add_argument("--mode", default="rollout", choices=["rollout", "scoring"])
    parser.add_argument("--rule", default="every", choices=list(branch.RULES))
    parser.add_argument("--turns", type=int, default=4, help="rollout.max_turns")
    parser.add_argument("--model", default="tiny", help="model preset")
    args = parser.parse_args()
    if args.out is None:
        name = "bench.csv" if args.mode == "rollout" else "bench_scoring.csv"
        args.out = f"experiments/results/branching/{name}"
    if args.rounds < 2:
        parser.error(f"--rounds={args.rounds}; allowed: >= 2 (the first is a warm-up)")
    env = env_registry.make(args.env)
    env_params = env.default_params()
    cfg = rollout_lib.RolloutConfig(
        num_tasks=2,
        group_size=2,
        max_turns=args.turns,
        max_action_len=max(env.max_action_len, 4),
        context=args.context,
        window_turns=1,
    )
    model_cfg = policy_lib.make_config(args.model, env.tokenizer.vocab_size)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    key = jax.random.key(0)
    mib = 1 / 2**20
    rows_out = []
    print(f"jax {jax.__version__}, {jax.device_count()} devices, load {os.getloadavg()[0]:.2f}")
    if args.mode == "scoring":
        _write(
            args.out, SCORING_FIELDS, _scoring_rows(args, env, env_params, cfg, graphdef, params)
        )
        return
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
    _write(args.out, FIELDS, rows_out)


def _write(path: str, fields: list[str], rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
