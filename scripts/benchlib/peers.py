"""Running the peer benchmark scripts (TRL/PyTorch, Tunix, plain JAX) as subprocesses.

Each peer job is one command of the peer benchmark (see its README): a script run with the
Python of its virtual environment, printing one JSON line whose `times_s` holds the timed
repeats. `PEER_JOBS` lists them with the rl4agents job each is compared with, and
`RECORDED` holds the medians the peers reported for the same machine in their own results,
shown when a peer cannot be run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import time


@dataclasses.dataclass(frozen=True)
class PeerJob:
    name: str
    venv: str  # folder name under the peers' venv root
    argv: tuple[str, ...]  # script and arguments (--repeats N is appended)
    ours: str  # the rl4agents job it is compared with
    label: str
    result_key: str = "result"  # where the timings sit in the JSON line


PEER_JOBS = (
    PeerJob("trl_gen", "trl", ("trl_bench.py", "gen"), "gen", "HF transformers generate"),
    PeerJob("jax_decode", "jax", ("jax_decode.py",), "gen", "plain JAX scan decode", "decode"),
    PeerJob("tunix_gen", "tunix", ("tunix_bench.py", "gen"), "gen", "Tunix Sampler"),
    PeerJob(
        "trl_grpo_nogc",
        "trl",
        ("trl_bench.py", "grpo", "--no-gc"),
        "grpo",
        "TRL GRPOTrainer (grad. ckpt off)",
    ),
    PeerJob("torch_manual", "trl", ("trl_bench.py", "manual"), "grpo", "hand-rolled PyTorch GRPO"),
    PeerJob("tunix_grpo", "tunix", ("tunix_bench.py", "grpo"), "grpo", "Tunix GRPOLearner"),
    PeerJob(
        "jax_grpo", "jax", ("jax_decode.py", "--grpo"), "grpo", "hand-rolled plain-JAX GRPO", "grpo"
    ),
    PeerJob(
        "trl_mt_rollout",
        "trl",
        ("trl_multiturn.py", "rollout"),
        "mt_rollout",
        "TRL-style PyTorch loop (HF generate)",
    ),
    PeerJob(
        "tunix_mt_rollout",
        "tunix",
        ("tunix_multiturn.py", "rollout"),
        "mt_rollout",
        "Tunix TrajectoryCollectEngine x32",
    ),
    PeerJob(
        "trl_mt_grpo",
        "trl",
        ("trl_multiturn.py", "grpo"),
        "mt_grpo",
        "TRL GRPOTrainer + rollout_func",
    ),
    PeerJob(
        "torch_mt_manual",
        "trl",
        ("trl_multiturn.py", "manual"),
        "mt_grpo",
        "hand-rolled PyTorch multi-turn GRPO",
    ),
    PeerJob(
        "tunix_mt_grpo",
        "tunix",
        ("tunix_multiturn.py", "grpo"),
        "mt_grpo",
        "Tunix agentic GRPOLearner",
    ),
)

# Pooled medians (s per call/step) the peers recorded on the same 2-core CPU.
RECORDED = {
    "trl_gen": 0.613,
    "jax_decode": 0.477,
    "tunix_gen": 0.522,
    "trl_grpo_nogc": 1.114,
    "torch_manual": 1.191,
    "tunix_grpo": 2.112,
    "jax_grpo": 2.541,
    "trl_mt_rollout": 4.10,
    "tunix_mt_rollout": 9.74,
    "trl_mt_grpo": 6.07,
    "torch_mt_manual": 5.84,
    "tunix_mt_grpo": 22.18,
}

# Targets: (our job, peer job, minimum speed-up).
TARGETS = (
    ("mt_rollout", "trl_mt_rollout", 5.0),
    ("mt_grpo", "trl_mt_grpo", 3.0),
    ("gen", "trl_gen", 2.0),
)


def find_scripts(candidates: list[str]) -> str | None:
    """First folder among `candidates` that holds the peer scripts."""
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "mt_common.py")):
            return os.path.abspath(c)
    return None


def stage_scripts(src: str, scratch: str) -> str:
    """Copy the peer scripts to `scratch` (never run them in place); returns the copy."""
    os.makedirs(scratch, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".py") or name.endswith(".sh"):
            shutil.copyfile(os.path.join(src, name), os.path.join(scratch, name))
    return scratch


def python_of(venv_root: str, job: PeerJob) -> str:
    return os.path.join(venv_root, job.venv, "bin", "python")


def available(venv_root: str, job: PeerJob) -> bool:
    return os.access(python_of(venv_root, job), os.X_OK)


def run(
    job: PeerJob, venv_root: str, scripts: str, repeats: int, timeout: float, threads: int = 0
) -> dict:
    """Run one peer job; returns first_s, times_s, median_s, ... or an `error`.

    `threads` > 0 sets OMP_NUM_THREADS for the run (PyTorch's intra-op threads). The peers ran
    with PyTorch's default (one thread per core); on a machine another job keeps busy, those
    threads spin at every barrier and HF generate slows down by 10-50x, so a shared machine
    needs `threads=1` for a meaningful PyTorch figure.
    """
    argv = [python_of(venv_root, job), *job.argv]
    if job.name == "jax_grpo":  # decode once, then the GRPO steps are the timed repeats
        argv += ["--repeats", "1", "--grpo-steps", str(repeats)]
    else:
        argv += ["--repeats", str(repeats)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # peers: default devices
    if threads > 0:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            argv, cwd=scripts, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout:.0f} s")
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(error=f"exit {proc.returncode}: {' | '.join(tail)}")
    raw = json.loads(lines[-1])
    res = raw[job.result_key]
    times = res["times_s"]
    first = next(
        (res[k] for k in ("warmup_s", "compile_plus_first_s", "first_step_s") if k in res), None
    )
    out = dict(
        first_s=first,
        times_s=times,
        median_s=statistics.median(times),
        min_s=min(times),
        max_s=max(times),
        process_wall_s=round(wall, 2),
    )
    for k in ("mean_turns", "gen_tokens_per_batch", "env_steps_per_s", "gen_tok_per_s"):
        if k in res:
            out[k] = res[k]
    out["raw"] = raw
    return out
