"""Speed benchmarks: our default experiment, and the peers' jobs side by side with ours.

  python scripts/bench.py                       # default config: compile, rollout, env, step
  python scripts/bench.py --quick               # smoke run (small shapes, one repeat)
  python scripts/bench.py --vs-peers --repeats 3 --json out.json
  python scripts/bench.py --real-model=DIR --repeats 5 --json out.json   # ours vs transformers

`--vs-peers` runs the peer benchmark's jobs (TRL/PyTorch, Tunix, plain JAX; one tiny Qwen2
shape, vocab 512, float32, random init) and the same jobs in rl4agents, interleaved per round:
single-turn generation (32 prompts x 64 tokens, 64 new tokens, temperature 1, no EOS), a
single-turn GRPO step (4 prompts x 8, reward = share of token 7), the multi-turn FrozenLake
rollout (4 maps x 8 samples, 8 turns, 16 action tokens, full history) and its GRPO step.
`--real-model=DIR` loads a Hugging Face folder (e.g. SmolLM2-135M-Instruct) in rl4agents and in
PyTorch/transformers and times both, float32 and bf16, interleaved per round: sampling
`--real-sizes` P prompts of L tokens -> T new tokens, and one GRPO update on G rows of L + T
tokens (`benchlib/real_model.py`).
Peer jobs need the peers' virtual environments under `--peers-dir` (set up as their README
says: `trl`, `tunix`, `jax`); a missing one is skipped with a message. The peer scripts are
copied to `--scratch` and run there.
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from benchlib import jobs, peer_lake, peer_single, peers, real_model  # noqa: E402
from flax import nnx  # noqa: E402

from rl4agents import config_utils, envs, sharding  # noqa: E402
from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402
from rl4agents.train import experiment as experiment_lib  # noqa: E402

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def load_config(path: str, quick: bool):
    path, _, arg = path.partition(":")
    spec = importlib.util.spec_from_file_location("bench_config", os.path.join(_REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(arg or None)
    if quick:
        with c.unlocked():
            ndev = jax.device_count()
            c.rollout.num_tasks, c.rollout.group_size, c.rollout.max_turns = ndev, 2, 2
    return c


def _fmt_s(t: dict | None) -> str:
    if not t:
        return "-"
    return f"{t['median_s']:.3f} ({t['min_s']:.3f}-{t['max_s']:.3f})"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


# ----- default mode -----------------------------------------------------------------------


def bench_default(args, config, exp) -> dict:
    sc = exp.step_cfg
    lay = rollout_lib.make_layout(sc.env, sc.rollout)
    log(
        f"config {args.config}: B={sc.rollout.batch_size} K={lay.turns} A={lay.action} "
        f"O={lay.obs} P={lay.prompt} T={lay.length}, vocab {exp.model_cfg.vocab_size}, "
        f"mesh {dict(exp.mesh.shape)}"
    )
    out = dict(
        config=args.config,
        layout=lay._asdict(),
        batch=sc.rollout.batch_size,
        params=policy_lib.count_params(nnx.split(policy_lib.Policy(exp.model_cfg, nnx.Rngs(0)))[1]),
    )
    log("rollout: compile + steady state")
    rollout_fn = jobs.make_rollout_fn(sc.graphdef, sc.env, sc.env_params, sc.rollout, exp.mesh)
    params = exp.init_state(jax.random.key(1)).params
    timing, counts = jobs.time_rollout(rollout_fn, params, args.repeats, jax.random.key(2))
    out["rollout"] = dict(timing.as_dict(), **counts)
    log(f"  first {timing.first_s:.2f} s, median {timing.median:.4f} s")
    log("train step: compile + steady state")
    timing, metrics = jobs.time_train_step(exp, args.repeats)
    out["train_step"] = dict(timing.as_dict(), metrics=metrics)
    log(f"  first {timing.first_s:.2f} s, median {timing.median:.4f} s")
    num_envs, num_steps = (64, 2) if args.quick else (1024, 8)
    out["env"] = {}
    for name in ("frozen_lake", "sokoban"):
        log(f"env alone: {name}, {num_envs} instances x {num_steps} steps")
        kwargs = envs.registry.validate(name, config_utils.to_dict(config.env[name]))
        env = sc.env if name == config.env.name else envs.make(name, **kwargs)
        out["env"][name] = jobs.env_throughput(
            env, num_envs, num_steps, args.repeats, jax.random.key(3)
        )
    return out


def bench_meshes(args, config) -> dict:
    """The config's train step on each mesh of `--meshes`, timed in one run, with ratios."""
    shapes = [tuple(int(x) for x in m.split("x")) for m in args.meshes.split(",")]
    out = {}
    for shape in shapes:
        n = int(np.prod(shape))
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), shape, devices=jax.devices()[:n])
        exp = experiment_lib.build(config, mesh=mesh)
        log(f"train step on mesh {shape} ({n} devices): compile + steady state")
        timing, _ = jobs.time_train_step(exp, args.repeats)
        out["x".join(map(str, shape))] = timing.as_dict()
        log(f"  first {timing.first_s:.2f} s, median {timing.median:.4f} s")
    base = next(iter(out))
    rows = [
        [name, _fmt_s(t), f"{t['first_s']:.1f}", f"{out[base]['median_s'] / t['median_s']:.2f}x"]
        for name, t in out.items()
    ]
    print(_table(["mesh", "train step s, median (min-max)", "compile s", f"speed vs {base}"], rows))
    return out


def bench_seeds(args, exp) -> dict:
    """S seeds of one config: one vmapped train step vs S separate steps, interleaved."""
    n = args.seeds
    vstep = experiment_lib.jit_train_step_seeds(exp.step_cfg, exp.mesh)
    singles = [exp.init_state(jax.random.key(s)) for s in range(n)]
    keys = [jax.random.key(s) for s in range(n)]
    stacked = jax.tree.map(
        lambda *x: jnp.stack(x), *[exp.init_state(jax.random.key(s)) for s in range(n)]
    )
    vkeys = jax.random.split(jax.random.key(0), n)

    def run_single():
        nonlocal singles
        out = []
        for s in range(n):
            singles[s], m = exp.train_step(singles[s], keys[s])
            out.append(m)
        jax.block_until_ready(out)

    def run_vmapped():
        nonlocal stacked
        stacked, m = vstep(stacked, vkeys)
        jax.block_until_ready(m)

    t = time.perf_counter()
    run_single()
    compile_single = time.perf_counter() - t
    t = time.perf_counter()
    run_vmapped()
    compile_vmapped = time.perf_counter() - t
    single_s, vmapped_s = [], []
    for r in range(args.repeats):
        for fn, acc in ((run_single, single_s), (run_vmapped, vmapped_s)):
            t = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t)
        log(f"seeds repeat {r}: {n} separate {single_s[-1]:.2f}s, vmapped {vmapped_s[-1]:.2f}s")
    res = {
        "config": args.config,
        "seeds": n,
        "first_call_separate_s": round(compile_single, 2),
        "first_call_vmapped_s": round(compile_vmapped, 2),
        "separate_median_s": round(float(np.median(single_s)), 3),
        "vmapped_median_s": round(float(np.median(vmapped_s)), 3),
    }
    res["speedup_vmapped"] = round(res["separate_median_s"] / res["vmapped_median_s"], 3)
    return res


def print_default(res: dict) -> None:
    r, s = res["rollout"], res["train_step"]
    lay = res["layout"]
    print(
        f"\nDefault config {res['config']}: {res['batch']} episodes x {lay['turns']} turns, "
        f"{lay['length']} slots, {res['params']:,} parameters"
    )
    rows = [
        ["train step: first call (trace+compile+run)", f"{s['first_s']:.2f} s", ""],
        ["train step: compile (first - median)", f"{s['first_s'] - s['median_s']:.2f} s", ""],
        ["train step: steady state", _fmt_s(s), "s/step"],
        ["rollout: first call (trace+compile+run)", f"{r['first_s']:.2f} s", ""],
        ["rollout: compile (first - median)", f"{r['first_s'] - r['median_s']:.2f} s", ""],
        ["rollout: steady state", _fmt_s(r), "s/batch"],
        ["rollout: sampled action tokens/s", f"{r['action_tokens_per_s']:,.0f}", "tok/s"],
        ["rollout: valid context tokens/s", f"{r['context_tokens_per_s']:,.0f}", "tok/s"],
        ["rollout: slots processed/s (B x T)", f"{r['slots_per_s']:,.0f}", "slots/s"],
        ["rollout: env steps/s (alive turns)", f"{r['env_steps_per_s']:,.0f}", "steps/s"],
        ["rollout: episodes/s", f"{r['episodes_per_s']:,.0f}", "episodes/s"],
    ]
    for name, e in res["env"].items():
        rows.append(
            [
                f"env alone: {name} reset ({e['num_envs']} vmapped)",
                f"{e['resets_per_s']:,.0f}",
                "resets/s",
            ]
        )
        rows.append(
            [
                f"env alone: {name} step ({e['num_envs']} x {e['num_steps']} scanned)",
                f"{e['steps_per_s']:,.0f}",
                "steps/s",
            ]
        )
    print(_table(["measurement", "value", "unit"], rows))


# ----- our versions of the peer jobs ------------------------------------------------------


@dataclasses.dataclass
class OurJob:
    name: str
    label: str
    run: Callable[[int], tuple]  # repeats -> (Timing, counts or metrics)
    first_s: float | None = None


def _bench_model(vocab_size: int) -> policy_lib.ModelConfig:
    return policy_lib.make_config("bench", vocab_size)


def our_jobs(mesh, turn_groups: int = 1) -> dict[str, OurJob]:
    """The four peer jobs in rl4agents (compiled lazily on their first run); the multi-turn
    ones run their turns in `turn_groups` groups with growing KV caches."""
    model_cfg = _bench_model(peer_single.VOCAB)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    params = jax.device_put(params, sharding.replicated(mesh))
    out = {}

    def rollout_job(name, label, env, rcfg, task_keys=None):
        fn = jobs.make_rollout_fn(
            graphdef, env, env.default_params(), rcfg, mesh, task_keys=task_keys
        )
        state = {"i": 0}

        def run(repeats):
            state["i"] += 1
            timing, counts = jobs.time_rollout(
                fn, params, repeats, jax.random.fold_in(jax.random.key(7), state["i"])
            )
            return timing, counts

        out[name] = OurJob(name, label, run)

    def step_job(name, label, env, rcfg):
        step_cfg = jobs.peer_step_config(env, rcfg, model_cfg, mesh)
        exp = jobs.make_experiment(step_cfg, model_cfg, mesh)
        state = {"i": 0}

        def run(repeats):
            state["i"] += 1
            return jobs.time_train_step(exp, repeats, seed=state["i"])

        out[name] = OurJob(name, label, run)

    # (a) single-turn: 32 x (64 prompt + 64 new) tokens, EOS off; GRPO 4 x 8, EOS live.
    gen_env = peer_single.RandomPrompt(max_completion=64, eos=False)
    rollout_job(
        "gen", "rl4agents rollout (1 turn, 64 tokens)", gen_env, peer_single.gen_rollout_config()
    )
    step_job(
        "grpo",
        "rl4agents train_step (1 turn)",
        peer_single.RandomPrompt(max_completion=64, eos=True),
        rollout_lib.RolloutConfig(num_tasks=4, group_size=8, max_turns=1, max_action_len=64),
    )
    # (b) multi-turn FrozenLake: 4 maps x 8 samples, 8 turns, 16 action tokens.
    lake = peer_lake.PeerLake()
    mt_cfg = peer_lake.rollout_config(turn_groups)
    rollout_job(
        "mt_rollout",
        f"rl4agents rollout (jitted, KV cache kept, {turn_groups} turn groups)",
        lake,
        mt_cfg,
        task_keys=peer_lake.task_keys(peer_lake.NUM_MAPS),
    )
    step_job(
        "mt_grpo", f"rl4agents train_step (multi-turn, {turn_groups} turn groups)", lake, mt_cfg
    )
    return out


_ORDER = {  # peer jobs then ours, per job family (the interleaving of one round)
    "gen": ("trl_gen", "jax_decode", "tunix_gen"),
    "grpo": ("trl_grpo_nogc", "torch_manual", "tunix_grpo", "jax_grpo"),
    "mt_rollout": ("trl_mt_rollout", "tunix_mt_rollout"),
    "mt_grpo": ("trl_mt_grpo", "torch_mt_manual", "tunix_mt_grpo"),
}


def bench_vs_peers(args, mesh) -> dict:
    selected = set(args.peer_jobs.split(",")) if args.peer_jobs else None
    by_name = {j.name: j for j in peers.PEER_JOBS}
    scripts_src = peers.find_scripts([args.peers_src])
    run_peers = {}
    for job in peers.PEER_JOBS:
        if args.skip_peers or (selected is not None and job.name not in selected):
            continue
        if scripts_src is None:
            log(f"skip {job.name}: peer scripts not found (pass --peers-src)")
        elif not peers.available(args.peers_dir, job):
            log(
                f"skip {job.name}: no venv at {os.path.join(args.peers_dir, job.venv)} "
                "(set it up as the peers' README says, or pass --peers-dir)"
            )
        else:
            run_peers[job.name] = job
    scripts = peers.stage_scripts(scripts_src, args.scratch) if run_peers else None
    ours = our_jobs(mesh, args.turn_groups)
    families = [f for f in _ORDER if not args.only or f in args.only.split(",")]
    results = {name: [] for name in [*ours, *run_peers]}
    for rnd in range(args.rounds):
        for fam in families:
            for name in _ORDER[fam]:
                if name not in run_peers:
                    continue
                log(f"round {rnd + 1}/{args.rounds}: peer {name} ({by_name[name].label})")
                r = peers.run(
                    run_peers[name],
                    args.peers_dir,
                    scripts,
                    args.repeats,
                    args.peer_timeout,
                    args.peer_threads,
                )
                if "error" in r:
                    log(f"  {name} failed: {r['error']}")
                else:
                    log(f"  median {r['median_s']:.3f} s (first {r['first_s']})")
                results[name].append(r)
            log(f"round {rnd + 1}/{args.rounds}: ours {fam} ({ours[fam].label})")
            timing, extra = ours[fam].run(args.repeats)
            r = dict(timing.as_dict(), **extra)
            if rnd:  # compiled in round 1; later first calls are warm
                r["warm_first_s"] = r.pop("first_s")
            log(f"  median {timing.median:.4f} s (first {timing.first_s:.2f} s)")
            results[fam].append(r)
    return dict(
        families=families,
        peers_src=scripts_src and os.path.relpath(scripts_src, _REPO),
        peer_jobs_run=sorted(run_peers),
        per_round=results,
        summary=summarize(results, families),
    )


def _pool(rounds: list[dict]) -> dict | None:
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return None
    times = [t for r in ok for t in r["times_s"]]
    firsts = [r["first_s"] for r in ok if r.get("first_s") is not None]
    pooled = dict(
        median_s=statistics.median(times),
        min_s=min(times),
        max_s=max(times),
        n=len(times),
        first_s=firsts[0] if firsts else None,
    )
    keys = ("env_steps", "action_tokens", "context_tokens", "mean_return", "valid_action_frac")
    for k in (*keys, "mean_turns"):
        if k in ok[0]:
            pooled[k] = statistics.median(r[k] for r in ok)
    return pooled


def summarize(results: dict, families: list[str]) -> dict:
    summary = {}
    for fam in families:
        ours = _pool(results.get(fam, []))
        rows = {}
        for name in _ORDER[fam]:
            theirs = _pool(results.get(name, []))
            row = dict(peer=theirs, recorded_median_s=peers.RECORDED[name])
            if ours:
                if theirs:
                    row["speedup"] = theirs["median_s"] / ours["median_s"]
                    row["speedup_best"] = theirs["min_s"] / ours["min_s"]
                row["speedup_vs_recorded"] = peers.RECORDED[name] / ours["median_s"]
            rows[name] = row
        summary[fam] = dict(ours=ours, peers=rows)
    targets = []
    for fam, peer, need in peers.TARGETS:
        if fam not in summary or not summary[fam]["ours"]:
            continue
        row = summary[fam]["peers"][peer]
        live = row.get("speedup")
        got = live if live is not None else row.get("speedup_vs_recorded")
        targets.append(
            dict(
                job=fam,
                peer=peer,
                target=need,
                speedup=got,
                live=live is not None,
                met=bool(got is not None and got >= need),
            )
        )
    summary["targets"] = targets
    return summary


_UNITS = {  # family: (work per call, unit) for the rate column
    "gen": (32 * 64, "new tok/s"),
    "grpo": (32 * 64, "compl. tok/s"),
    "mt_rollout": (None, "env steps/s"),
    "mt_grpo": (None, ""),
}


def _rate(fam: str, pooled: dict, env_steps: float | None = None) -> str:
    """Work per second at the median time: tokens, or env steps for the multi-turn rollout."""
    work, unit = _UNITS[fam]
    if fam == "mt_rollout":
        work = env_steps
    return f"{work / pooled['median_s']:,.0f} {unit}" if work else "-"


def print_vs_peers(res: dict) -> None:
    labels = {j.name: j.label for j in peers.PEER_JOBS}
    titles = {
        "gen": "Single-turn generation: 32 prompts x 64 tokens -> 64 new tokens (s/call)",
        "grpo": "Single-turn GRPO step: 4 prompts x 8 completions of <= 64 tokens (s/step)",
        "mt_rollout": "Multi-turn FrozenLake rollout: 32 episodes, <= 8 turns x 16 tok. (s/batch)",
        "mt_grpo": "Multi-turn FrozenLake GRPO step: rollout + update (s/step)",
    }
    for fam in res["families"]:
        s = res["summary"][fam]
        ours = s["ours"]
        print(f"\n{titles[fam]}")
        rows = []
        if ours:
            first = f"{ours['first_s']:.2f}" if ours.get("first_s") is not None else "-"
            rows.append(
                [
                    "rl4agents (ours)",
                    first,
                    _fmt_s(ours),
                    _rate(fam, ours, ours.get("env_steps")),
                    "1.00x",
                    "",
                ]
            )
        for name, row in s["peers"].items():
            p = row["peer"]
            speed = f"{row['speedup']:.2f}x" if row.get("speedup") else "not run"
            rec = row["recorded_median_s"]
            rec_s = f"{rec:.3f}"
            if row.get("speedup_vs_recorded"):
                rec_s += f" ({row['speedup_vs_recorded']:.2f}x)"
            if p:
                steps = None
                if fam == "mt_rollout":
                    steps = round(p.get("mean_turns", 0) * 32) if p.get("mean_turns") else None
                first = f"{p['first_s']:.2f}" if p.get("first_s") is not None else "-"
                rows.append(
                    [
                        f"{labels[name]} [{name}]",
                        first,
                        _fmt_s(p),
                        _rate(fam, p, steps),
                        speed,
                        rec_s,
                    ]
                )
            else:
                rows.append([f"{labels[name]} [{name}]", "-", "-", "-", speed, rec_s])
        print(
            _table(
                [
                    "engine",
                    "first call s",
                    "median s (min-max)",
                    "rate",
                    "ours faster by",
                    "recorded s (ours faster by)",
                ],
                rows,
            )
        )
    if res["summary"]["targets"]:
        print("\nTargets (printed, not asserted):")
        for t in res["summary"]["targets"]:
            how = "live" if t["live"] else "vs recorded figure"
            got = "n/a" if t["speedup"] is None else f"{t['speedup']:.2f}x"
            verdict = "met" if t["met"] else "NOT met"
            print(f"  {t['job']:<10} >= {t['target']:.0f}x {t['peer']}: {got} ({how}) -> {verdict}")


# ----- main -------------------------------------------------------------------------------


def matmul_rate(mesh, repeats: int = 5) -> dict:
    """The machine's dense f32 matmul rate (GFLOP/s, all devices of `mesh` together) on the
    benchmark model's three matmul shapes (d_model -> gate+up, d_ff -> d_model, d_model ->
    d_model), 8,192 rows per device, jitted and sharded like the rollout's batch."""
    cfg = _bench_model(peer_single.VOCAB)
    rows = 8192 * mesh.size
    out = {}
    for k, n in ((cfg.d_model, 2 * cfg.d_ff), (cfg.d_ff, cfg.d_model), (cfg.d_model, cfg.d_model)):
        x = jax.device_put(jnp.ones((rows, k)) * 0.01, sharding.batch_sharding(mesh, 2))
        w = jax.device_put(jnp.ones((k, n)) * 0.01, sharding.replicated(mesh))
        fn = jax.jit(lambda x, w: x @ w)
        timing, _ = jobs.time_calls(lambda i, fn=fn, x=x, w=w: fn(x, w), repeats)
        out[f"{k}x{n}"] = 2 * rows * k * n / timing.min / 1e9
    return out


def compute_floors(res: dict, mesh) -> dict:
    """Lower bounds on each job's time: its dense matmul work (every context token through the
    model once while sampling, plus forward and backward, ~3x, over the final sequences in a
    GRPO step; attention, softmax and everything else left out) at the best measured matmul
    rate. The prompt the 8 samples of a task share counts once per task (it needs computing
    only once, as our rollout and update do); its slots count as tokens, so the floor stays a
    lower bound. A target whose required time is below its job's floor cannot be met here."""
    cfg = _bench_model(peer_single.VOCAB)
    _, params = nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(cfg, nnx.Rngs(0))))
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    per_token = 2 * sum(x.size for path, x in flat if "kernel" in sharding.path_str(path))
    rates = matmul_rate(mesh)
    best = max(rates.values())
    mt = res["summary"].get("mt_rollout", {}).get("ours") or {}
    mt_tokens = mt.get("context_tokens")  # valid tokens of the 32 episodes (random weights)
    # 4 tasks x 8 samples: 28 of the 32 episodes repeat their task's prompt (64 slots
    # single-turn, 72 multi-turn)
    grpo_once = 32 * 128 - 28 * 64
    tokens = {"gen": 32 * 128, "grpo": 4 * grpo_once}
    if mt_tokens:
        lake = peer_lake.PeerLake()
        mt_once = mt_tokens - 28 * rollout_lib.make_layout(lake, peer_lake.rollout_config()).prompt
        tokens.update(mt_rollout=mt_once, mt_grpo=4 * mt_once)
    floors = {}
    for fam, n in tokens.items():
        gflop = per_token * n / 1e9
        floors[fam] = dict(tokens=n, gflop=gflop, floor_s=gflop / best)
    return dict(
        matmul_gflops=rates,
        best_gflops=best,
        flop_per_token=per_token,
        floors=floors,
    )


def print_floors(res: dict) -> None:
    fl = res["floors"]
    rates = ", ".join(f"{k}: {v:.0f}" for k, v in fl["matmul_gflops"].items())
    print(
        f"\nCompute floors: dense f32 matmul rate measured now (GFLOP/s, all devices) {rates}; "
        f"{fl['flop_per_token'] / 1e6:.2f} MFLOP per token (matmuls only)"
    )
    rows = []
    for fam, f in fl["floors"].items():
        ours = res["summary"].get(fam, {}).get("ours")
        target = next((t for t in peers.TARGETS if t[0] == fam), None)
        need = "-"
        peer_row = res["summary"].get(fam, {}).get("peers", {}).get(target[1]) if target else None
        if peer_row and peer_row.get("peer"):
            peer_s = peer_row["peer"]["median_s"]
            req = peer_s / target[2]
            verdict = "below the floor" if req < f["floor_s"] else "above the floor"
            need = f"{req:.3f} ({target[2]:.0f}x {target[1]}; {verdict})"
        rows.append(
            [
                fam,
                f"{f['tokens']:,}",
                f"{f['gflop']:.1f}",
                f"{f['floor_s']:.3f}",
                _fmt_s(ours) if ours else "-",
                f"{ours['median_s'] / f['floor_s']:.2f}x" if ours else "-",
                need,
            ]
        )
    print(
        _table(
            [
                "job",
                "token passes",
                "GFLOP",
                "floor s",
                "ours s",
                "ours / floor",
                "target needs s",
            ],
            rows,
        )
    )


def meta(args) -> dict:
    return dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable), *sys.argv]),
        jax=jax.__version__,
        backend=jax.default_backend(),
        device_count=jax.device_count(),
        devices=[str(d) for d in jax.devices()],
        cpu_count=os.cpu_count(),
        loadavg_start=os.getloadavg(),
        python=platform.python_version(),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        repeats=args.repeats,
        rounds=args.rounds,
        peer_threads=args.peer_threads,
    )


def _check_args(ap: argparse.ArgumentParser, args) -> tuple:
    """Every argument's value, before anything is measured or written: (config, experiment)
    of --config, or (None, None) with --vs-peers."""
    fail = ap.error
    for name, low in (("repeats", 1), ("rounds", 1), ("seeds", 0), ("turn_groups", 1)):
        if getattr(args, name) < low:
            fail(f"--{name.replace('_', '-')}={getattr(args, name)}; allowed: >= {low}")
    if args.peer_threads < 0:
        fail(f"--peer-threads={args.peer_threads}; allowed: >= 1, or 0 (their default)")
    if not args.peer_timeout > 0:
        fail(f"--peer-timeout={args.peer_timeout}; allowed: > 0")
    for family in filter(None, args.only.split(",")):
        if family not in _ORDER:
            fail(f"--only={family!r} is no job family; allowed: {list(_ORDER)}")
    names = [j.name for j in peers.PEER_JOBS]
    for name in filter(None, args.peer_jobs.split(",")):
        if name not in names:
            fail(f"--peer-jobs={name!r} is no peer job; allowed: {names}")
    for shape in args.meshes.split(",") if args.meshes else []:
        sizes = shape.split("x")
        if len(sizes) != 3 or not all(x.isdigit() and int(x) >= 1 for x in sizes):
            fail(f"--meshes={shape!r}; allowed: DATAxFSDPxTENSOR sizes >= 1, e.g. 1x1x1,8x1x1")
        if int(np.prod([int(x) for x in sizes])) > jax.device_count():
            fail(f"--meshes={shape!r} needs more than the {jax.device_count()} devices here")
    if args.json:
        config_utils.check_output_file("--json", args.json)
    if args.real_model:
        if not os.path.isfile(os.path.join(args.real_model, "config.json")):
            fail(f"--real-model={args.real_model!r}: no config.json; allowed: a model folder")
        try:
            args.real_sizes = real_model.Sizes(*(int(x) for x in args.real_sizes.split(",")))
        except (ValueError, TypeError) as e:
            fail(f"--real-sizes={args.real_sizes!r}: {e}; allowed: P,L,T,G integers")
        dtypes = tuple(d for d in args.real_dtypes.split(",") if d)
        if not dtypes or any(d not in real_model.DTYPES for d in dtypes):
            allowed = ", ".join(real_model.DTYPES)
            fail(f"--real-dtypes={args.real_dtypes!r}; allowed: a comma list of {allowed}")
        args.real_dtypes = dtypes
        return None, None
    if args.vs_peers:
        return None, None
    path = args.config.partition(":")[0]
    if not os.path.isfile(os.path.join(_REPO, path)):
        fail(f"--config={args.config!r}: no such file; allowed: a config file[:arg] in the repo")
    try:
        config = load_config(args.config, args.quick)
        if not args.meshes:
            return config, experiment_lib.build(config)
        shape = tuple(int(x) for x in args.meshes.split(",")[0].split("x"))
        devices = jax.devices()[: int(np.prod(shape))]
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), shape, devices=devices)
        experiment_lib.build(config, mesh=mesh)  # the first one bench_meshes builds
        return config, None
    except (ValueError, KeyError) as e:  # the config's argument, or a config that does not build
        fail(f"--config={args.config!r}: {e}")


def _write_json(res: dict, path: str, **kwargs) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, **kwargs)


def main(argv=None) -> int:
    ap = config_utils.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "--config",
        default="configs/frozen_lake.py",
        help="config file[:arg] for the default mode (relative to the repo)",
    )
    ap.add_argument("--vs-peers", action="store_true", help="run the peer jobs and ours")
    ap.add_argument(
        "--real-model",
        default="",
        help="a Hugging Face model folder: generation and a GRPO step, ours vs transformers",
    )
    ap.add_argument(
        "--real-sizes",
        default="8,64,32,8",
        help="--real-model: P prompts, L prompt tokens, T new tokens, G GRPO rows",
    )
    ap.add_argument(
        "--real-dtypes",
        default="float32,bfloat16",
        help="--real-model: compute dtypes to time, comma-separated (float32, bfloat16)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    ap.add_argument("--rounds", type=int, default=1, help="--vs-peers: interleaved rounds")
    ap.add_argument("--quick", action="store_true", help="smoke mode: small shapes, 1 repeat")
    ap.add_argument("--json", default="", help="write the raw numbers to this file")
    ap.add_argument(
        "--peers-dir",
        default=os.path.join(tempfile.gettempdir(), "peers"),
        help="root of the peers' venvs (<dir>/trl, <dir>/tunix, <dir>/jax)",
    )
    ap.add_argument(
        "--peers-src",
        default=os.environ.get("RL4AGENTS_PEERS_SRC", ""),
        help="folder of the peer scripts (mt_common.py); default: $RL4AGENTS_PEERS_SRC",
    )
    ap.add_argument(
        "--scratch",
        default=os.path.join(tempfile.gettempdir(), "peers_run"),
        help="scratch copy of the peer scripts (they run there)",
    )
    ap.add_argument("--peer-jobs", default="", help="comma list of peer jobs (default: all)")
    ap.add_argument(
        "--only",
        default="",
        help="--vs-peers: comma list of job families: gen,grpo,mt_rollout,mt_grpo",
    )
    ap.add_argument("--skip-peers", action="store_true", help="--vs-peers: run only ours")
    ap.add_argument(
        "--turn-groups",
        type=int,
        default=4,
        help="--vs-peers: rollout.turn_groups of our multi-turn jobs (1 = one cache of T slots)",
    )
    ap.add_argument(
        "--seeds",
        type=int,
        default=0,
        help="time S seeds as one vmapped train step against S separate steps (--config)",
    )
    ap.add_argument(
        "--meshes",
        default="",
        help="time the --config train step on each mesh, e.g. 1x1x1,8x1x1 (data x fsdp x "
        "tensor); simulate devices with XLA_FLAGS=--xla_force_host_platform_device_count=8",
    )
    ap.add_argument("--peer-timeout", type=float, default=900.0, help="seconds per peer run")
    ap.add_argument(
        "--peer-threads",
        type=int,
        default=0,
        help="set OMP_NUM_THREADS for the peer runs (0: their default, one thread per core); "
        "use 1 on a machine another job keeps busy, where PyTorch's spinning threads "
        "otherwise slow HF generate down 10-50x",
    )
    args = ap.parse_args(argv)
    config, exp = _check_args(ap, args)
    if args.quick:
        args.repeats = 1
    res = dict(meta=meta(args))
    log(
        f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    if args.real_model:
        res["real_model"] = real_model.run(
            args.real_model, args.real_sizes, args.repeats, dtypes=args.real_dtypes, log=log
        )
        res["meta"]["loadavg_end"] = os.getloadavg()
        res["meta"]["wall_s"] = round(time.perf_counter() - _T0, 1)
        print(real_model.table(res["real_model"]))
        if args.json:
            _write_json(res, args.json, indent=1, default=float)
            log(f"wrote {args.json}")
        return 0
    if args.vs_peers:
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (-1, 1, 1))
        res["vs_peers"] = bench_vs_peers(args, mesh)
        log("measuring the dense matmul rate for the compute floors")
        res["vs_peers"]["floors"] = compute_floors(res["vs_peers"], mesh)
    elif args.meshes:
        res["meshes"] = bench_meshes(args, config)
        if args.json:
            _write_json(res, args.json, indent=2)
        return 0
    elif args.seeds:
        res["seeds"] = bench_seeds(args, exp)
        print(json.dumps(res["seeds"], indent=2))
        if args.json:
            _write_json(res, args.json, indent=2)
        return 0
    else:
        res["default"] = bench_default(args, config, exp)
    res["meta"]["loadavg_end"] = os.getloadavg()
    res["meta"]["wall_s"] = round(time.perf_counter() - _T0, 1)
    print(
        f"\nrl4agents bench: {res['meta']['date']}, jax {jax.__version__}, "
        f"{jax.device_count()} {jax.default_backend()} devices, {os.cpu_count()} cores, "
        f"repeats {args.repeats}"
    )
    load = (res["meta"]["loadavg_start"][0], res["meta"]["loadavg_end"][0])
    # The end figure includes this benchmark's own processes, so only the start one tells
    # whether something else was running.
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"note: load average {load[0]:.2f} at start ({load[1]:.2f} at end, this run "
            f"included) on {os.cpu_count()} cores: other processes shared the machine, so "
            "absolute times are inflated (compare engines measured in the same run)"
        )
    if "default" in res:
        print_default(res["default"])
    if "vs_peers" in res:
        print_vs_peers(res["vs_peers"])
        print_floors(res["vs_peers"])
    if args.json:
        _write_json(res, args.json, indent=1, default=float)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
