"""The run lifecycle of `loop.run`: a rejected non-finite step stops the run without saving,
SIGTERM checkpoints and says so, a run that spent its wall-time budget is finished, the
progress bar's budget estimate, OOD rows at every evaluation, provenance.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import jax.numpy as jnp
import pytest

from rl4agents import checkpoint, provenance
from rl4agents.train import experiment, loop, writers
from tests import scripts
from tests.train.test_train import loop_config

# Every run here trains `loop_config()` (tests/train/test_train.py): its programs are built
# once per worker (tests/conftest.py), and compiled once (the persistent cache).
pytestmark = pytest.mark.usefixtures("reuse_builds")


def _files(d):
    """{relative path: bytes} of every file under `d`."""
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _saved(workdir):
    return sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())


def _with_step(monkeypatch, wrap):
    """Built experiments step with `wrap(train_step)` (the real step inside) for this test;
    the shared experiment keeps its compiled evaluations."""
    build = experiment.build

    def wrapped(config, mesh=None):
        exp = build(config, mesh=mesh)
        if "real_train_step" not in exp.__dict__:  # the shared experiment, built once
            monkeypatch.setitem(exp.__dict__, "real_train_step", exp.train_step)
            monkeypatch.setitem(exp.__dict__, "train_step", wrap(exp.train_step))
        return exp

    monkeypatch.setattr(experiment, "build", wrapped)


def test_loop__nonfinite_step_stops_without_saving(tmp_path, monkeypatch):
    # The step's guard (tests/train/test_guards.py) rejects step 3: its state is step 2's.
    # Here the real step runs and step 3's metrics say it was rejected.
    def wrap(step_fn):
        def step(state, root):
            new, metrics = step_fn(state, root)
            if int(new.step) == 3:
                metrics = {**metrics, "nonfinite": jnp.float32(1), "loss": jnp.float32("nan")}
            return new, metrics

        return step

    _with_step(monkeypatch, wrap)
    workdir = tmp_path / "run"
    summary = loop.run(loop_config(**{"checkpoint.max_to_keep": 1}), str(workdir), quiet=True)
    reason = summary["stopped"]
    assert reason.startswith("non-finite loss at step 3 (loss=nan, grad_norm="), reason
    assert reason.endswith("; parameters kept from step 2; last good checkpoint: step 2")
    assert not summary["finished"] and not summary["interrupted"] and summary["steps"] == 2
    assert _saved(workdir) == [2]  # step 2 kept: nothing saved after it
    assert json.loads((workdir / "summary.json").read_text()) == summary
    rows = writers.read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    assert rows[-1]["train/nonfinite"] == 1 and max(r["step"] for r in rows) == 3
    # Every evaluation step evaluates the OOD split too, with the test split's keys.
    test_row, ood_row = (r for r in rows if r["step"] == 2 and "train/loss" not in r)
    assert {k.split("/")[1] for k in test_row if "/" in k} == {
        k.split("/")[1] for k in ood_row if "/" in k
    }
    assert "eval_test/greedy_success" in test_row and "eval_ood/greedy_success" in ood_row
    record = provenance.read(str(workdir))
    assert record["start_step"] == 0 and record["config"]["train"]["num_steps"] == 4


def test_loop__sigterm_saves_a_checkpoint_and_says_so(tmp_path, monkeypatch, capsys):
    def wrap(step_fn):
        def step(state, root):
            out = step_fn(state, root)
            os.kill(os.getpid(), signal.SIGTERM)  # `loop._StopRequest` turns it into a flag
            return out

        return step

    _with_step(monkeypatch, wrap)
    workdir = tmp_path / "run"
    summary = loop.run(loop_config(), str(workdir))
    assert summary["interrupted"] and summary["terminated"] and not summary["finished"]
    assert summary["steps"] == 1 and _saved(workdir) == [1]
    on_disk = json.loads((workdir / "summary.json").read_text())
    assert on_disk["interrupted"] is True and on_disk["terminated"] is True
    assert "Terminated at step 1; checkpoint saved, rerun to resume." in capsys.readouterr().out


def test_loop__run_that_spent_its_budget_is_finished_on_rerun(tmp_path, capsys):
    config = loop_config(**{"train.max_minutes": 1e-6})  # spent by the first step
    workdir = tmp_path / "run"
    summary = loop.run(config, str(workdir), quiet=True)
    assert summary["finished"] and summary["steps"] == 1 and "eval_ood" in summary
    before = _files(workdir)
    again = loop.run(config, str(workdir))
    assert again == {**summary, "interrupted": False}
    assert "Already finished at step 1" in capsys.readouterr().out
    assert _files(workdir) == before


def test_loop__failed_save_stops_at_once_and_keeps_the_good_checkpoint(tmp_path, monkeypatch):
    save, calls = checkpoint.Checkpointer.save, []

    def full_disk_at_4(self, step, state, **kwargs):
        calls.append(step)
        if step == 4:
            raise checkpoint.CheckpointError("checkpoint save of step 4 failed: disk full")
        return save(self, step, state, **kwargs)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", full_disk_at_4)
    workdir = tmp_path / "run"
    with pytest.raises(checkpoint.CheckpointError, match="step 4 failed: disk full"):
        loop.run(loop_config(), str(workdir), quiet=True)
    assert calls == [2, 4]  # no second attempt
    assert _saved(workdir) == [2] and not (workdir / "summary.json").exists()


def test_nonfinite_reason__names_the_environment_and_the_quantity():
    label = "frozen_lake"  # Experiment.env_label of loop_config()
    rewards = {"nonfinite": 1.0, "nonfinite_rewards": 3.0, "loss": float("nan"), "grad_norm": 1.0}
    assert loop._nonfinite_reason(label, 6, rewards, 5) == (
        "non-finite reward from environment 'frozen_lake' at step 7 (3 episodes; loss=nan, "
        "grad_norm=1); parameters kept from step 6; last good checkpoint: step 5"
    )
    state = {"nonfinite": 1.0, "nonfinite_state": 1.0, "loss": 0.5, "grad_norm": 2.0}
    assert loop._nonfinite_reason(label, 0, state, None) == (
        "non-finite updated parameters or optimizer state at step 1 (loss=0.5, grad_norm=2); "
        "parameters kept from step 0; last good checkpoint: none"
    )
    grad = {"nonfinite": 1.0, "loss": -2.7e38, "grad_norm": float("inf")}
    assert loop._nonfinite_reason(label, 2, grad, 2).startswith("non-finite grad_norm at step 3")


def test_sft_metrics__the_warm_start_workdirs_metrics_for_the_curves(tmp_path):
    assert loop._sft_metrics(loop_config()) is None
    sft = loop_config(**{"init.params": str(tmp_path)})
    assert loop._sft_metrics(sft) is None  # no metrics.jsonl there
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "sft/nll": 2.0}\n')
    assert loop._sft_metrics(sft) == str(tmp_path / "metrics.jsonl")


def test_budget_end__extrapolates_the_pace_since_the_first_step():
    # 10 steps in 100 s since step 1 at 20 s: 0.1 step/s; 780 s left at step 11 (120 s).
    assert loop.budget_end(11, 120.0, (1, 20.0), 900.0, 1500) == 11 + 78 + 1
    assert loop.budget_end(11, 120.0, (1, 20.0), 900.0, 50) == 50  # num_steps comes first
    assert loop.budget_end(1, 20.0, (1, 20.0), 900.0, 1500) is None  # no pace yet
    assert loop.budget_end(30, 950.0, (1, 20.0), 900.0, 1500) == 30  # spent: ends here
    assert loop._clock(900) == "15:00" and loop._clock(3725) == "1:02:05"


def _train_cli(workdir, *flags):
    return subprocess.Popen(
        scripts.train_argv(
            workdir, "--config.train.num_steps=1000", "--config.train.eval_every=1000", *flags
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # a minute of compiling in a subprocess
def test_train_cli__sigterm_exits_143_with_a_checkpoint(tmp_path):
    proc = _train_cli(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, out + err
    step = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert f"Terminated at step {step}; checkpoint saved, rerun to resume." in out
    assert _saved(tmp_path)[-1] == step and "Traceback" not in err
