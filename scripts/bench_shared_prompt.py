"""The update with and without computing the shared prompt once per group, side by side.

  python scripts/bench_shared_prompt.py [--rounds 4]

Builds the benchmark's two GRPO steps (`scripts/bench.py --vs-peers`: the single-turn job,
4 prompts x 8 completions with a 64-token prompt, and the multi-turn FrozenLake job, 4 maps x
8 samples, 8 turns, 4 turn groups) twice, with `StepConfig.shared_prompt` = the layout's
prompt (as `train.share_prompt=True` sets it) and 0, on the same mesh as the benchmark (one
XLA CPU device per core). The two variants alternate call by call from the same state and
key, so each pair sees the same episodes; the losses must agree. Prints per-variant medians
(the first round, compilation, left out) and the speed-up.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
from benchlib import jobs, peer_lake, peer_single  # noqa: E402

from rl4agents import config_utils, sharding  # noqa: E402
from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402


def job(name: str):
    if name == "mt_grpo":
        env, cfg = peer_lake.PeerLake(), peer_lake.rollout_config(turn_groups=4)
    else:
        env = peer_single.RandomPrompt(max_completion=64, eos=True)
        cfg = rollout_lib.RolloutConfig(num_tasks=4, group_size=8, max_turns=1, max_action_len=64)
    return env, cfg


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="calls per variant (first: warm-up)")
    parser.add_argument("--jobs", default="grpo,mt_grpo")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds={args.rounds}; allowed: >= 2 (the first is a warm-up)")
    for name in args.jobs.split(","):
        if name not in ("grpo", "mt_grpo"):
            parser.error(f"--jobs={name!r} is no job; allowed: ['grpo', 'mt_grpo']")
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (jax.device_count(), 1, 1))
    model_cfg = policy_lib.make_config("bench", peer_single.VOCAB)
    print(f"jax {jax.__version__}, {jax.device_count()} devices, load {os.getloadavg()[0]:.2f}")
    print("| job | prompt slots / row slots | shared s (median) | unshared s | speed-up |")
    print("|---|---|---|---|---|")
    for name in args.jobs.split(","):
        env, rcfg = job(name)
        lay = rollout_lib.make_layout(env, rcfg)
        base = jobs.peer_step_config(env, rcfg, model_cfg, mesh)
        variants = {p: dataclasses.replace(base, shared_prompt=p) for p in (lay.prompt, 0)}
        exps = {p: jobs.make_experiment(c, model_cfg, mesh) for p, c in variants.items()}
        states = {p: e.init_state(jax.random.key(0)) for p, e in exps.items()}
        times = {p: [] for p in exps}
        key = jax.random.key(1)
        for r in range(args.rounds):
            losses = {}
            for p, exp in exps.items():
                t0 = time.perf_counter()
                states[p], metrics = exp.train_step(states[p], key)
                losses[p] = float(jax.block_until_ready(metrics["loss"]))
                if r:
                    times[p].append(time.perf_counter() - t0)
            a, b = losses.values()
            if abs(a - b) > 1e-4 * max(1.0, abs(b)):
                raise SystemExit(f"{name}: losses differ ({a} vs {b})")
        shared, unshared = (statistics.median(times[p]) for p in (lay.prompt, 0))
        train_len = lay.length - lay.obs
        print(
            f"| {name} | {lay.prompt} / {train_len} | {shared:.3f} | {unshared:.3f} | "
            f"{unshared / shared:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
