"""Determinism: two fresh processes train the same tiny run to bit-identical results.

What changes results, measured on this file's tiny run (`scripts/train.py`, the same seed):
- Nothing else does: two processes with the same code, config, seed, device count and
  XLA_FLAGS write equal `metrics.jsonl` rows (wall_time aside) and equal final training
  states, bit for bit, with or without JAX's persistent compilation cache (this test
  compiles in each process; tests/test_kill_drill.py reads programs from the cache).
- The device count does: 1 host device against 8 gives the same rows to ~1e-7 relative
  (train/loss 2.2e-7, train/entropy 9e-8, train/grad_norm 7e-8; near-zero quantities such
  as train/pg_loss ~1e-8 differ by their own size) and parameters to 1.9e-6 after 4 steps:
  fp32 reductions split over devices add in another order. `scripts/train.py` makes one
  XLA CPU device per core (`scripts/_cores.py`), so on CPU the core count changes results
  unless `--xla_force_host_platform_device_count` is set.
- XLA_FLAGS that change code generation do too: without the tests' two speed flags
  (`--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false`, set in
  tests/conftest.py), 8 devices give train/loss 2.2e-7 and train/grad_norm 2.7e-7 relative
  apart, parameters 2.3e-6 apart. Compare runs under the same flags (and the same JAX).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Frozen lake with one layer, 8 episodes a step, 3 turns: ~10 s of compiling, then fast steps.
TINY_FLAGS = (
    "--config=configs/frozen_lake.py",
    "--config.rollout.num_tasks=4",
    "--config.rollout.group_size=2",
    "--config.rollout.max_turns=3",
    "--config.model.num_layers=1",
    "--config.train.eval_tasks=8",
    "--config.train.ood_max_turns=0",
    "--config.train.max_minutes=0",
    "--config.log.progress=False",
)
# The tests' XLA flags (tests/conftest.py), stated here: the results depend on them.
XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_cpu_use_fusion_emitters=false"
)


def train_env(cache_dir=None):
    """The environment of a `scripts/train.py` subprocess: fixed XLA flags, and JAX's
    persistent compilation cache in `cache_dir` (None: no cache, every program compiled)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["XLA_FLAGS"] = XLA_FLAGS
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def train_cmd(workdir, *flags):
    """`scripts/train.py` on the tiny run in `workdir`, with extra `--config.*` flags."""
    return [sys.executable, "scripts/train.py", *TINY_FLAGS, f"--workdir={workdir}", *flags]


def metric_rows(workdir):
    """`workdir`'s metrics.jsonl rows without their wall_time, in file order."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def final_state(workdir):
    """{leaf path: numpy array} of the last checkpoint's training state (params, optimizer
    state, step), read without a restore target."""
    import orbax.checkpoint as ocp

    ckpt = os.path.join(workdir, "checkpoints")
    step = max(int(s) for s in os.listdir(ckpt) if s.isdigit())
    tree = ocp.StandardCheckpointer().restore(os.path.join(ckpt, str(step), "default"))
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(leaf) for p, leaf in leaves}


def assert_same_run(a, b):
    """Equal metric rows and final training state, bit for bit."""
    rows_a, rows_b = metric_rows(a), metric_rows(b)
    assert len(rows_a) == len(rows_b) and rows_a, (len(rows_a), len(rows_b))
    for ra, rb in zip(rows_a, rows_b):
        assert ra == rb, {
            k: (ra.get(k), rb.get(k)) for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k)
        }
    state_a, state_b = final_state(a), final_state(b)
    assert state_a.keys() == state_b.keys() and any("params" in k for k in state_a)
    for key in state_a:
        # Bit patterns, so that -0.0 and 0.0 (or two NaNs) are told apart as they should be.
        assert state_a[key].dtype == state_b[key].dtype, key
        assert state_a[key].tobytes() == state_b[key].tobytes(), key


@pytest.mark.slow  # two processes that each compile the tiny run: ~50 s
def test_two_fresh_processes__same_metrics_and_parameters_bit_for_bit(tmp_path):
    steps = ("--config.train.num_steps=4", "--config.train.eval_every=2")
    for name in ("a", "b"):
        out = subprocess.run(
            train_cmd(tmp_path / name, *steps, "--config.checkpoint.every=2"),
            cwd=ROOT,
            env=train_env(),  # no compilation cache: each process compiles for itself
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    rows = metric_rows(tmp_path / "a")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]
    assert any(r["step"] == 4 and "eval_test/greedy_success" in r for r in rows)
    assert_same_run(tmp_path / "a", tmp_path / "b")
