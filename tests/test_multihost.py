"""Multi-process runs: `rl4agents.distributed`, and 2 processes that train like 1.

The slow test launches two local processes with 4 CPU devices each (JAX's CPU backend runs
cross-process collectives with gloo). The workers (tests/multihost_worker.py) run `loop.run`
for two steps over a mesh spanning both processes; this process repeats the two steps on its
own 8 devices and compares the metrics that process 0 logged and the parameters that both
processes checkpointed together. Set RL4AGENTS_MULTIHOST_LOG=path to keep the workers' output
(commands included) in a file.
"""

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rl4agents import checkpoint, distributed, sharding
from rl4agents.train import experiment, writers
from tests import multihost_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_PROCESSES = 2
LOCAL_DEVICES = 4
TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(workdir, log_dir) -> tuple[list, list[str]]:
    """Starts the worker processes; returns them and the command of each."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
        "PYTHONPATH": REPO,
    }
    port = _free_port()
    procs, commands = [], []
    for i in range(NUM_PROCESSES):
        cmd = [
            sys.executable,
            "-m",
            "tests.multihost_worker",
            f"--coordinator=localhost:{port}",
            f"--num_processes={NUM_PROCESSES}",
            f"--process_id={i}",
            f"--workdir={workdir}",
        ]
        out = open(log_dir / f"process_{i}.log", "w")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
        commands.append(
            f"JAX_PLATFORMS=cpu XLA_FLAGS={env['XLA_FLAGS']} " + " ".join(cmd[1:]).strip()
        )
    return procs, commands


def _reference(config):
    """The two steps `loop.run` takes, in this process on 8 devices: params and metrics."""
    devices = jax.devices()
    assert len(devices) == NUM_PROCESSES * LOCAL_DEVICES
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (-1, 1, 1), devices=devices)
    exp = experiment.build(config, mesh=mesh)
    state = exp.init_state(jax.random.fold_in(exp.root_key(), 2**31 - 1))  # as loop.run does
    metrics = []
    for _ in range(multihost_worker.STOP_AFTER):
        state, m = exp.train_step(state, exp.root_key())
        metrics.append(jax.device_get(m))
    return exp, jax.device_get(state.params), metrics


SLURM_2 = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}
CLUSTER_VARS = (*SLURM_2, "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE")


@pytest.fixture
def calls(monkeypatch):
    """Records `jax.distributed.initialize` calls instead of making them; no cluster env."""
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: recorded.append(kw))
    return recorded


def test_initialize__single_process_does_nothing(calls):
    assert distributed.detect_cluster() is None
    assert distributed.initialize() is False
    assert distributed.initialize("", 1, 0) is False
    assert calls == []


def test_initialize__explicit_settings_are_passed_on(calls):
    assert distributed.initialize("host0:1234", 2, 1) is True
    assert distributed.initialize("host0:1234") is True  # the rest from the environment
    assert calls == [
        {"coordinator_address": "host0:1234", "num_processes": 2, "process_id": 1},
        {"coordinator_address": "host0:1234", "num_processes": None, "process_id": None},
    ]
    with pytest.raises(ValueError, match=r"distributed.process_id=2 .* allowed: 0..1"):
        distributed.initialize("host0:1234", 2, 2)


def test_initialize__cluster_environment_lets_jax_detect(calls, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "123.0;tcp://10.0.0.1:5000")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")  # mpirun -n 1: one process
    assert distributed.detect_cluster() is None and distributed.initialize() is False
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert distributed.detect_cluster() == "ompi"
    for var in ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var)
    for var, value in SLURM_2.items():
        monkeypatch.setenv(var, value)
    assert distributed.detect_cluster() == "slurm"
    assert distributed.initialize() is True
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed.initialize("auto") is True  # forced: JAX's own detection
    assert calls == [{}, {}]


def test_to_host_and_any_process__single_process():
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (-1, 1, 1))
    x = jax.device_put(np.arange(16.0).reshape(8, 2), sharding.batch_sharding(mesh, 2))
    out = distributed.to_host({"x": x, "s": jax.numpy.float32(3.0)})
    np.testing.assert_array_equal(out["x"], np.arange(16.0).reshape(8, 2))
    assert out["s"] == 3.0 and isinstance(out["s"], np.ndarray)
    assert distributed.any_process([True, False]) == [True, False]
    assert distributed.is_main()


@pytest.mark.slow  # 1.5-3 min on 2 shared CPU cores: three processes compile the step
def test_two_processes__match_one_process_and_write_once(tmp_path):
    workdir = tmp_path / "run"
    t0 = time.perf_counter()
    procs, commands = _launch(workdir, tmp_path)
    try:
        config = multihost_worker.config()
        exp, params_ref, metrics_ref = _reference(config)  # while the workers compile
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    wall = time.perf_counter() - t0
    logs = [(tmp_path / f"process_{i}.log").read_text() for i in range(NUM_PROCESSES)]
    if os.environ.get("RL4AGENTS_MULTIHOST_LOG"):
        _save_log(os.environ["RL4AGENTS_MULTIHOST_LOG"], commands, logs, codes, wall)
    assert codes == [0] * NUM_PROCESSES, logs
    assert "process 0 of 2: 4 local devices, 8 in all" in logs[0]

    # Logged once, by process 0: one row per step (train) plus the step-2 evaluation.
    rows = writers.read_metrics(workdir / writers.METRICS_NAME)
    train = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval_test/greedy_success" in r]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in evals] == [2]
    assert 0 <= evals[0]["eval_test/greedy_success"] <= 1
    for row, ref in zip(train, metrics_ref, strict=True):
        for key in ("loss", "pg_loss", "reward", "entropy", "grad_norm"):
            # fp32 reductions in a different order across devices (as in test_train.py).
            np.testing.assert_allclose(
                row[f"train/{key}"], ref[key], rtol=1e-4, atol=1e-6, err_msg=key
            )
    # Printed once: the evaluation line and the summary come from process 0 only.
    assert "step 2: held-out greedy success" in logs[0]
    assert "held-out" not in logs[1] and "steps 2, wall" not in logs[1]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 2 and not summary["finished"]

    # Saved by both processes together: the step-2 parameters equal the 1-process ones.
    with checkpoint.Checkpointer(
        workdir / "checkpoints",
        config_json=exp.config_json,
        compat_keys=experiment.COMPAT_KEYS,
    ) as ckpt:
        assert ckpt.all_steps() == [2]
        state = ckpt.restore(2, exp.abstract_state())
    params = jax.device_get(state.params)
    # Adam divides by sqrt(v): reduction-order noise moves parameters by a few 1e-6 (as there).
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5), params, params_ref
    )
    assert int(state.step) == 2


def _save_log(path, commands, logs, codes, wall) -> None:
    """Writes the workers' commands, exit codes and output to `path`."""
    gloo = "[Gloo]"  # gloo's per-connection lines: many, and the same every run
    parts = [
        "# 2-process CPU run of tests/test_multihost.py (4 simulated devices per process)",
        "# command: RL4AGENTS_MULTIHOST_LOG="
        + path
        + " python -m pytest -p no:cacheprovider -m slow tests/test_multihost.py",
        f"# wall time of the test: {wall:.0f} s",
    ]
    for i, (cmd, log, code) in enumerate(zip(commands, logs, codes, strict=True)):
        kept = [line for line in log.splitlines() if gloo not in line]
        dropped = len(log.splitlines()) - len(kept)
        parts += [
            "",
            f"## process {i}: exit code {code}",
            f"$ {cmd}",
            *kept,
            f"({dropped} '[Gloo] ... connected to N peer ranks' lines left out)",
        ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
