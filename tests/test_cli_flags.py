"""The scripts refuse a bad command-line input at start-up: one line `error: ...` on stderr,
exit status 2, no traceback, and nothing written.

Each case fails before any compilation (each subprocess pays only the imports), so the whole
file takes seconds. `{tmp}` in a flag is the test's temporary directory, which holds `afile`
(an existing file), `sweep/` (a one-run sweep directory as scripts/sweep.py leaves it) and
two flag files.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FL = "--config=configs/frozen_lake.py"

# (script, flags, a substring of the error line)
CASES = [
    ("random_baseline", [FL, "--episodes=0"], "--episodes=0; allowed: >= 1"),
    ("random_baseline", ["--config=configs/nope.py"], "no config file 'configs/nope.py'"),
    ("random_baseline", ["--config", "configs/nope.py"], "no config file 'configs/nope.py'"),
    (
        "train",
        ["--config", "configs/frozen_lake.py", "--workdir={tmp}/w", "--config.train.nope=1"],
        "unknown config key 'train.nope'",
    ),
    # FILE:ARG is a config file with an argument (the check stops at the episodes, not here)
    (
        "random_baseline",
        ["--config=configs/ablation.py:sokoban6,grpo", "--episodes=0"],
        "--episodes=0; allowed: >= 1",
    ),
    ("train", ["--config=configs/nope.py:x", "--workdir={tmp}/w"], "no config file"),
    ("train", [FL, "--workdir={tmp}/w", "--config.train.num_steps=abc"], "num_steps"),
    ("train", [FL], "--workdir"),
    ("train", [FL, "--workdir={tmp}/afile"], "--workdir='{tmp}/afile' is a file"),
    ("train", [FL, "--workdir={tmp}/afile/run"], "is under the file '{tmp}/afile'"),
    ("train", [FL, "--workdir="], "--workdir=''; allowed: a folder"),
    ("train", [FL, "--workdir={tmp}/w", "extra"], "unexpected arguments ['extra']"),
    ("train", [FL, "--workdir={tmp}/w", "--config.mesh.shape=(0,1,1)"], "entries >= 1"),
    ("eval", ["--workdir={tmp}/w", "--num_tasks=abc"], "num_tasks"),
    ("random_baseline", [FL, "--split=dev"], "--split=dev: value should be one of"),
    ("sft", [FL, "--workdir={tmp}/afile"], "--workdir='{tmp}/afile' is a file"),
    ("sft", [FL, "--workdir={tmp}/w", "--config.sft.lr=-1"], "sft.lr=-1.0; allowed: > 0"),
    # None turns off a field declared optional; any other field refuses it.
    (
        "sft",
        [FL, "--workdir={tmp}/w", "--config.sft.lr=None"],
        "--config.sft.lr=None: sft.lr does not take None; allowed: a value of its type (float",
    ),
    ("train", [FL, "--workdir={tmp}/w", "--config.optim.nope=None"], "'optim.nope'"),
    # A flag file's lines are the command line's own: the same None handling and checks.
    (
        "sft",
        [FL, "--workdir={tmp}/w", "--flagfile={tmp}/sft_lr_none.flags"],
        "--config.sft.lr=None: sft.lr does not take None",
    ),
    (
        "train",
        ["--flagfile={tmp}/value_clip_none.flags", "--workdir={tmp}/w"],
        "train.num_steps=0; allowed: >= 1",  # past the None, which the field takes
    ),
    ("train", [FL, "--workdir={tmp}/w", "--flagfile={tmp}/nope.flags"], "Unable to open flagfile"),
    ("sft", [FL, "--workdir={tmp}/w", "--config.sft.keep=some"], "sft.keep='some' is not allowed"),
    (
        "memory_table",
        ["--out={tmp}/m.md", "--config.env.household.bogus=1"],
        "unknown config key 'env.household.bogus'",
    ),
    ("memory_table", ["--out={tmp}/m.md", "--detail=qwen2_7b:1,8"], "--detail='qwen2_7b:1,8'"),
    ("mesh_equivalence", ["--out="], "--out=''; allowed: a file path"),
    ("env_table", ["--out={tmp}/e", "--envs=maze,nope"], "--envs='nope' has no configs/nope.py"),
    (
        "sweep",
        ["experiments/example_sweep.py", "--out={tmp}/s", "--workers=0"],
        "--workers=0; allowed: >= 1",
    ),
    ("sweep", ["experiments/example_sweep.py", "--out={tmp}/afile"], "is a file"),
    ("make_table", ["--sweep={tmp}/none", "--out={tmp}/t"], "is not a sweep directory"),
    (
        "make_table",
        ["--sweep={tmp}/sweep", "--out={tmp}/t", "--metric=eval_test.greedy_succes"],
        "--metric='eval_test.greedy_succes' is in no complete run's summary.json",
    ),
    ("bench", ["--meshes=8x1", "--json={tmp}/b.json"], "--meshes='8x1'; allowed:"),
    ("collect_run", ["--workdir={tmp}/none", "--out={tmp}/c", "--name=x"], "has no metrics"),
    # A config file's own failure: one line naming the file, not ml_collections' traceback.
    (
        "train",
        ["--config={tmp}/syntax.py", "--workdir={tmp}/w"],
        "config file '{tmp}/syntax.py' failed to import: SyntaxError: expected ':' (line 1)",
    ),
    (
        "train",
        ["--config={tmp}/raises.py", "--workdir={tmp}/w", "--config.train.num_steps=1"],
        "config file '{tmp}/raises.py': get_config() raised RuntimeError: boom",
    ),
    (
        "sft",
        ["--config={tmp}/none.py:x", "--workdir={tmp}/w", "--config.train.num_steps=1"],
        "config file '{tmp}/none.py': get_config('x') returned None; allowed:",
    ),
    # Values the fields' checks refuse before any work (a fuzzed command line found each).
    (
        "train",
        [FL, "--workdir={tmp}/w", "--config.rollout.temperature=inf"],
        "rollout.temperature=inf; allowed: a finite number > 0",
    ),
    (
        "train",
        [FL, "--workdir={tmp}/w", "--config.credit.grpo.eps=nan"],
        "credit.grpo.eps=nan; allowed: a finite number",
    ),
    (
        "train",
        [FL, "--workdir={tmp}/w", "--config.seed=12345678901234567890"],
        "seed=12345678901234567890; allowed: in [0, 4294967295] (a 32-bit seed)",
    ),
    (
        "train",
        [FL, "--workdir={tmp}/w", "--config.model.num_layers=100000"],
        "model.num_layers=100000; allowed: <= 1024",
    ),
    (
        "train",
        [FL, "--workdir={tmp}/w", "--config.mesh.axes=('a','b','c')"],
        "mesh.axes=('a', 'b', 'c'); allowed: a tuple of distinct names among ('data',",
    ),
]


def _make_sweep(root):
    run = root / "run0"
    run.mkdir(parents=True)
    summary = {"finished": True, "steps": 4, "wall_s": 1.0, "eval_test": {"greedy_success": 0.5}}
    (run / "summary.json").write_text(json.dumps(summary))
    plan = [{"name": "run/seed=0", "dir": "run0", "variant": [], "env": "fl", "seed": 0}]
    (root / "sweep.json").write_text(json.dumps({"study": "demo", "runs": plan}))


def _files(root):
    return {
        os.path.relpath(os.path.join(d, n), root): os.stat(os.path.join(d, n)).st_mtime_ns
        for d, dirs, names in os.walk(root)
        for n in dirs + names
    }


@pytest.mark.parametrize(
    "script,flags,message", CASES, ids=[f"{s}:{' '.join(f)}" for s, f, _ in CASES]
)
def test_bad_flag__one_line_exit_2_nothing_written(tmp_path, script, flags, message):
    (tmp_path / "afile").write_text("keep me\n")
    (tmp_path / "syntax.py").write_text("def get_config(arg=None)\n    return None\n")
    (tmp_path / "raises.py").write_text("def get_config():\n    raise RuntimeError('boom')\n")
    (tmp_path / "none.py").write_text("def get_config(arg=None):\n    pass\n")
    (tmp_path / "sft_lr_none.flags").write_text("--config.sft.lr=None\n")
    (tmp_path / "value_clip_none.flags").write_text(
        f"{FL}:ppo_gae\n--config.loss.value_clip=None\n--config.train.num_steps=0\n"
    )
    _make_sweep(tmp_path / "sweep")
    before = _files(tmp_path)
    flags = [f.format(tmp=tmp_path) for f in flags]
    out = subprocess.run(
        [sys.executable, f"scripts/{script}.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and message.format(tmp=tmp_path) in lines[0], lines
    assert _files(tmp_path) == before
    assert (tmp_path / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize(
    "script, flags, shown",
    [
        (
            "train",
            ["--help"],
            ["--config=FILE[:ARG]", "--workdir", "config keys of configs/base.py", "seed = 0"],
        ),
        (
            "train",
            ["--config=configs/sokoban.py:ppo_gae", "--workdir=x", "-h"],
            ["config keys of configs/sokoban.py:ppo_gae", "credit.name = 'ppo_gae'  (one of ["],
        ),
        ("eval", ["--help"], ["--workdir", "--split", "--num_tasks"]),
    ],
)
def test_help__exit_0_flags_and_config_keys(tmp_path, script, flags, shown):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, f"scripts/{script}.py"), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(("Train an agent", "Evaluate a run")), out.stdout[:200]
    for text in shown:
        assert text in out.stdout, text
    if script == "train":  # the registries' names are the allowed values
        assert "env.name = " in out.stdout and "loss.policy = 'ppo_clip'  (one of ['" in out.stdout
