"""scripts/sft.py and its --workdir: refused at start-up, before any demonstration is collected,
when it is not a writable directory path or already holds a run's output (an RL run, an SFT
run, a checkpoint); a refusal is one line `error: --workdir=...`, exit status 2, and leaves
every file as it was (contents and mtimes). A run writes its output beside nothing else of
a run's, and publishes it only once complete.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A run of a few seconds once compiled: 8 demonstrations, 2 steps, 4 evaluation tasks.
TINY = [
    "--config=configs/frozen_lake.py",
    "--config.sft.num_demos=8",
    "--config.sft.steps=2",
    "--config.sft.batch_size=2",
    "--config.train.eval_tasks=4",
    "--config.rollout.num_tasks=2",
    "--config.rollout.group_size=2",
    "--config.log.progress=False",
]
OUTPUTS = {"metrics.jsonl", "tb", "params", "curves.png", "provenance.json", "summary.json"}
# One XLA CPU device, whatever the host or the test session (conftest.py's 8): the tiny
# batches need no mesh divisibility.
ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


# Runs scripts/sft.py with os.access answering as for a user other than root for the folder
# argv[1] (mode 0o500): root writes anywhere, so its permission bits alone test nothing.
AS_USER = """import os, runpy, sys
ro, access = sys.argv.pop(1), os.access


def as_user(path, mode, **kw):
    return access(path, mode, **kw) and not (os.path.abspath(path) == ro and mode & os.W_OK)


os.access = as_user
sys.path.insert(0, "scripts")
runpy.run_path("scripts/sft.py", run_name="__main__")
"""


def _sft(workdir, *flags, prefix=("scripts/sft.py",)):
    return subprocess.run(
        [sys.executable, *prefix, *TINY, f"--workdir={workdir}", *flags],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        # A hang guard, not a speed limit: the ~40 s slow-test run took over 300 s on a
        # machine shared with other test sessions.
        timeout=900,
    )


def _snapshot(root):
    """Every entry under `root` (and `root` itself): its mtime and, for a file, its bytes."""
    out = {".": os.stat(root).st_mtime_ns}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            path = os.path.join(d, n)
            data = open(path, "rb").read() if os.path.isfile(path) else None
            out[os.path.relpath(path, root)] = (os.stat(path).st_mtime_ns, data)
    return out


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _refused(out, *substrings):
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: --workdir="), lines
    for s in substrings:
        assert s in lines[0], lines
    return lines[0]


SFT_RUN = {  # what a finished scripts/sft.py run leaves (file contents are stand-ins)
    "metrics.jsonl": '{"step": 2, "sft/nll": 2.3}\n',
    "tb/events.out.tfevents.1.host": "events",
    "params/config.json": "{}",
    "params/2/_CHECKPOINT_METADATA": "{}",
    "curves.png": "png",
    "summary.json": json.dumps({"env": "frozen_lake", "params": "w/params"}),
}
RL_RUN = {  # what scripts/train.py leaves
    "checkpoints/config.json": "{}",
    "checkpoints/4/_CHECKPOINT_METADATA": "{}",
    "metrics.jsonl": '{"step": 4, "train/reward": 0.5}\n',
    "tb/events.out.tfevents.1.host": "events",
    "curves.png": "png",
    "summary.json": json.dumps({"finished": True, "steps": 4}),
}

# (name, prior contents of the workdir, substrings of the error line)
HOLDS = [
    ("rl_run", RL_RUN, ["scripts/train.py run", "checkpoints/", "metrics.jsonl", "new"]),
    ("finished_sft_run", SFT_RUN, ["finished SFT run", "params/", "--config.init.params="]),
    ("metrics_only", {"metrics.jsonl": "{}\n"}, ["metrics.jsonl", "new"]),
    ("summary_only", {"summary.json": "{}"}, ["summary.json"]),
    ("params_only", {"params/config.json": "{}"}, ["params/"]),
    ("tb_only", {"tb/events.out.tfevents.1.host": "events"}, ["tb/"]),
    ("curves_only", {"curves.png": "png"}, ["curves.png"]),
    ("a_checkpoint_folder", {"config.json": "{}", "2/_METADATA": "{}"}, ["config.json", "2/"]),
]


@pytest.mark.parametrize("name,files,substrings", HOLDS, ids=[h[0] for h in HOLDS])
def test_workdir_with_run_output__refused_in_one_line_nothing_changed(
    tmp_path, name, files, substrings
):
    work = tmp_path / "w"
    _write(work, {**files, "notes.txt": "mine\n"})
    before = _snapshot(tmp_path)
    line = _refused(_sft(work), f"--workdir={str(work)!r}", *substrings)
    assert "\n" not in line
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["empty", "a_file", "under_a_file", "unwritable"])
def test_bad_workdir_path__refused_in_one_line_naming_the_flag(tmp_path, case):
    (tmp_path / "afile").write_text("keep me\n")
    work, expect = {
        "empty": ("", "--workdir=''"),
        "a_file": (tmp_path / "afile", f"--workdir={str(tmp_path / 'afile')!r} is a file"),
        "under_a_file": (tmp_path / "afile" / "w", "is under the file"),
        "unwritable": (tmp_path / "ro" / "w", "not writable"),
    }[case]
    prefix = ("scripts/sft.py",)
    if case == "unwritable":
        (tmp_path / "ro").mkdir(mode=0o500)
        if os.geteuid() == 0:
            prefix = ("-c", AS_USER, str(tmp_path / "ro"))
    before = _snapshot(tmp_path)
    _refused(_sft(work, prefix=prefix), expect, "allowed:")
    assert _snapshot(tmp_path) == before


@pytest.mark.slow  # a real SFT run through the script: ~40 s, mostly compiling
def test_run__publishes_complete_output_then_reruns_are_refused(tmp_path):
    work = tmp_path / "w"
    # A user's file stays; an interrupted run's incomplete output is discarded.
    _write(work, {"notes.txt": "mine\n", ".sft_incomplete/metrics.jsonl": "{}\n"})
    out = _sft(work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert set(os.listdir(work)) == OUTPUTS | {"notes.txt"}
    assert (work / "notes.txt").read_text() == "mine\n"
    summary = json.loads((work / "summary.json").read_text())
    assert summary["params"] == str(work / "params")
    assert os.path.isfile(work / "params" / "config.json") and os.path.isdir(work / "params/2")
    rows = [json.loads(r) for r in (work / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {1, 2} and "sft/nll" in rows[0]
    prov = json.loads((work / "provenance.json").read_text())  # rl4agents.provenance
    assert prov["config"]["sft"]["steps"] == 2 and prov["argv"][0] == "scripts/sft.py"

    before = _snapshot(tmp_path)
    _refused(_sft(work), "finished SFT run")  # the same command again
    _refused(_sft(work, "--config.model.d_model=32"), "finished SFT run")  # another config
    assert _snapshot(tmp_path) == before
