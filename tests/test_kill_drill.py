"""Kill drill: a `scripts/train.py` run killed with SIGKILL mid-run resumes to the results of
an uninterrupted run, bit for bit (metrics rows, final evaluation and final training state).

SIGKILL gives the run no chance to save: it resumes from its last completed checkpoint, and
the kill may land anywhere, also in an asynchronous checkpoint save or a metrics write.
"""

import json
import random
import signal
import subprocess
import time

import pytest

from tests.test_determinism import ROOT, assert_same_run, metric_rows, train_cmd, train_env

NUM_STEPS = 32  # the kill lands by step 16: half the run is left as a margin for a slow poll
# Checkpoints every 3 steps: the kill often lands between a save's start and its commit.
FLAGS = (
    f"--config.train.num_steps={NUM_STEPS}",
    "--config.train.eval_every=8",
    "--config.checkpoint.every=3",
)


def _train(workdir, cache):
    out = subprocess.run(
        train_cmd(workdir, *FLAGS),
        cwd=ROOT,
        env=train_env(cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _train_rows(workdir):
    """Steps of the train rows in `workdir`'s metrics.jsonl so far."""
    try:
        return [r["step"] for r in metric_rows(workdir) if "train/loss" in r]
    except (OSError, json.JSONDecodeError):  # not yet written, or a row half written
        return []


@pytest.mark.slow  # three processes; the first compiles (~25 s), the others read its cache
def test_sigkill_at_a_random_step__resumes_to_the_uninterrupted_run(tmp_path):
    # One compilation cache for the three processes: the reference run fills it, so the
    # killed run is killed in training, not in compiling (the cache is not under test here).
    cache = tmp_path / "jax-cache"
    _train(tmp_path / "full", cache)

    kill_after = random.Random(0).randint(4, NUM_STEPS // 2)  # fixed seed: the same each run
    part = tmp_path / "part"
    proc = subprocess.Popen(
        train_cmd(part, *FLAGS),
        cwd=ROOT,
        env=train_env(cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 900
        while len(_train_rows(part)) < kill_after and proc.poll() is None:
            assert time.monotonic() < deadline, "the run wrote no train rows in 900 s"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before the kill ({proc.returncode})"
    killed_at = _train_rows(part)
    assert kill_after <= len(killed_at) < NUM_STEPS, killed_at
    assert not (part / "summary.json").exists()

    _train(part, cache)  # resumes from its last committed checkpoint
    assert_same_run(tmp_path / "full", part)
    assert [r["step"] for r in metric_rows(part) if "train/loss" in r] == list(
        range(1, NUM_STEPS + 1)
    )
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    resumed = json.loads((part / "summary.json").read_text())
    assert resumed["finished"] and resumed["steps"] == NUM_STEPS
    for split in ("eval_train", "eval_test", "eval_ood"):
        assert resumed[split] == full[split], split
