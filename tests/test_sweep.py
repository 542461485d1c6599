"""Sweeps: expansion and names, override checks, the runner on a fake train script, tables."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from absl import flags

from rl4agents import results, sweep
from tests.hf_fixtures import write_tiny_llama
from tests.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASE = str(ROOT / "configs" / "base.py")
FROZEN_LAKE = str(ROOT / "configs" / "frozen_lake.py")


def _script(name: str):
    return load_script(name)


# Expansion and names.


def test_product__last_sweep_fastest_and_names():
    runs = sweep.expand(
        sweep.product(sweep.sweep_values("credit.name", ["grpo", "rloo"]), sweep.seeds(2)),
        base="configs/frozen_lake.py",
    )
    assert [r.name for r in runs] == [
        "frozen_lake/credit.name=grpo/seed=0",
        "frozen_lake/credit.name=grpo/seed=1",
        "frozen_lake/credit.name=rloo/seed=0",
        "frozen_lake/credit.name=rloo/seed=1",
    ]
    assert runs[3].overrides == {"credit.name": "rloo", "seed": 1}
    assert runs[3].dirname == "frozen_lake__credit.name=rloo__seed=1"
    assert runs[3].variant == ("credit.name=rloo",) and runs[3].seed == 1


def test_zip__pairs_values_and_rejects_unequal_lengths():
    runs = sweep.expand(
        sweep.zip_(
            sweep.sweep_values("credit.name", ["grpo", "ppo_gae"]),
            sweep.sweep_values("model.value_head", ["none", "shared"], in_name=False),
        ),
        base="configs/base.py",
    )
    assert [r.name for r in runs] == ["base/credit.name=grpo", "base/credit.name=ppo_gae"]
    assert runs[1].overrides == {"credit.name": "ppo_gae", "model.value_head": "shared"}
    with pytest.raises(
        ValueError, match=r"zip_ needs sweeps of equal length, got lengths \[2, 3\]"
    ):
        sweep.zip_(sweep.seeds(2), sweep.sweep_values("optim.lr", [1.0, 2.0, 3.0]))


def test_concat__each_run_carries_its_base_config():
    fl = sweep.product(sweep.configs(["configs/frozen_lake.py"]), sweep.fixed({"a.b": 1}))
    sok = sweep.product(sweep.configs(["configs/sokoban.py:ppo_gae"]), sweep.fixed({"a.b": 2}))
    runs = sweep.expand(sweep.product(fl + sok, sweep.seeds(2)))
    assert [r.name for r in runs] == [
        "frozen_lake/seed=0",
        "frozen_lake/seed=1",
        "sokoban:ppo_gae/seed=0",
        "sokoban:ppo_gae/seed=1",
    ]
    assert [r.config for r in runs][1:3] == ["configs/frozen_lake.py", "configs/sokoban.py:ppo_gae"]
    assert runs[2].overrides == {"a.b": 2, "seed": 0}
    assert runs[2].dirname == "sokoban-ppo_gae__seed=0"
    assert runs[2].variant == ("ppo_gae",) and runs[0].variant == ()


@pytest.mark.parametrize(
    "make, pattern",
    [
        (lambda: sweep.product(sweep.seeds(1), sweep.seeds(2)), r"'seed' set twice in one run"),
        (
            lambda: sweep.product(sweep.configs(["a.py"]), sweep.configs(["b.py"])),
            r"base config set twice in one run: 'a.py' and 'b.py'",
        ),
        (lambda: sweep.seeds(0), r"seeds\(num=0\): allowed: num >= 1"),
        (lambda: sweep.sweep_values("x", []), r"got no values"),
    ],
)
def test_helpers__bad_combinations_fail(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


def test_expand__names_must_be_unique():
    points = sweep.fixed({"optim.lr": 1.0}) + sweep.fixed({"optim.lr": 2.0})
    with pytest.raises(ValueError, match=r"two runs are both named 'base'"):
        sweep.expand(points, base="configs/base.py")


def test_expand__without_base_config_fails():
    with pytest.raises(ValueError, match=r"has no base config; set BASE"):
        sweep.expand(sweep.seeds(1))


def test_expand__rejects_unsupported_values():
    with pytest.raises(ValueError, match=r"x=\{'a': 1\}: unsupported value type dict"):
        sweep.expand(sweep.sweep_values("x", [{"a": 1}]), base="c.py")


def test_dirname__sanitised_and_bounded():
    assert sweep.dirname("sokoban:ppo_gae/env.x=a b/seed=1") == "sokoban-ppo_gae__env.x=a_b__seed=1"
    assert sweep.run_name("c.py", {"mesh.shape": (2, 1, 1)}, ["mesh.shape"]) == "c/mesh.shape=2,1,1"
    long = "x/" + "k=" + "v" * 400
    assert len(sweep.dirname(long)) == 200
    assert sweep.dirname(long) != sweep.dirname(long + "w")


def test_load_study__base_and_get_config(tmp_path):
    study = tmp_path / "my_study.py"
    study.write_text(
        "from rl4agents import sweep\n"
        f"BASE = {BASE!r}\n"
        "def get_sweep():\n"
        "    return sweep.seeds(2)\n"
    )
    s = sweep.load_study(str(study))
    assert (
        s.name == "my_study"
        and s.base == BASE
        and [r.name for r in s.runs]
        == [
            "base/seed=0",
            "base/seed=1",
        ]
    )
    own = tmp_path / "own.py"
    own.write_text(
        "from rl4agents import sweep\n"
        "from configs import base\n"
        "def get_config(arg=None):\n"
        "    return base.get_config()\n"
        "def get_sweep():\n"
        "    return sweep.seeds(1)\n"
    )
    s = sweep.load_study(str(own))
    assert s.runs[0].config == str(own)
    assert sweep.resolve(s.runs[0].config, s.runs[0].overrides).seed == 0
    bad = tmp_path / "bad.py"
    bad.write_text("BASE = 'x.py'\n")
    with pytest.raises(ValueError, match=r"defines no get_sweep\(\) function"):
        sweep.load_study(str(bad))


# Configs and overrides.


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"optim.lrr": 1e-3}, r"unknown config key 'optim.lrr'; did you mean 'optim.lr'"),
        ({"lr": 1e-3}, r"unknown config key 'lr'; did you mean 'optim.lr'"),
        ({"optim": 1}, r"'optim' is a config section, not a field"),
        ({"train.num_steps": 4.5}, r"train.num_steps=4.5 has type float; the field's type is int"),
        ({"train.num_steps": True}, r"train.num_steps=True has type bool; the field's type is int"),
        ({"log.progress": 0}, r"log.progress=0 has type int; the field's type is bool"),
        ({"credit.name": 3}, r"credit.name=3 has type int; the field's type is str"),
        ({"mesh.shape": 2}, r"mesh.shape=2 has type int; the field's type is tuple"),
        ({"optim.lr": None}, r"optim.lr=None: the field does not take None \(default 0.001\)"),
    ],
)
def test_resolve__bad_override_names_key_and_type(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        sweep.resolve(BASE, overrides)


def test_resolve__matches_the_command_line():
    overrides = {
        "optim.lr": 1,  # int widens to float
        "mesh.shape": [2, 1, 1],
        "log.plot_keys": ("train/success", "eval_test/greedy_success"),
        "log.progress": False,
        "credit.name": "ppo_gae",
        "train.max_minutes": 1e-5,
        "seed": 7,
    }
    config = sweep.resolve(FROZEN_LAKE + ":ppo_gae", overrides)
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.mesh.shape == (2, 1, 1) and config.model.value_head == "shared"
    via_flags = sweep.parse_command_config(FROZEN_LAKE + ":ppo_gae", sweep.override_args(overrides))
    assert sweep.config_diff(config.to_dict(), via_flags.to_dict()) == []
    assert sweep.config_diff({"a": {"b": (1, 2)}}, {"a": {"b": [1, 3]}}) == [
        "a.b: [1, 2] -> [1, 3]"
    ]


def test_resolve__none_and_fields_whose_default_is_none_from_the_command_line():
    """None turns an option off (value_clip, dual_clip_c); a field whose default is None
    (agg_scale, Sokoban's carve_steps) takes a value of its annotated type. ml_collections'
    command-line parser does neither alone."""
    overrides = {
        "loss.value_clip": None,
        "loss.ppo_clip.dual_clip_c": None,
        "loss.ppo_clip.agg_scale": 4.0,
        "env.sokoban.carve_steps": 20,
    }
    config = sweep.resolve(FROZEN_LAKE, overrides)
    assert config.loss.value_clip is None and config.loss.ppo_clip.dual_clip_c is None
    assert config.loss.ppo_clip.agg_scale == 4.0 and config.env.sokoban.carve_steps == 20
    via_flags = sweep.parse_command_config(FROZEN_LAKE, sweep.override_args(overrides))
    assert sweep.config_diff(config.to_dict(), via_flags.to_dict()) == []
    # Untouched, those fields keep their default None.
    default = sweep.parse_command_config(FROZEN_LAKE, [])
    assert default.loss.ppo_clip.agg_scale is None and default.loss.value_clip == 0.5
    # The annotated type is enforced: an int field refuses 2.5.
    with pytest.raises(flags.IllegalFlagValueError, match=r"invalid literal for int\(\).*'2\.5'"):
        sweep.parse_command_config(FROZEN_LAKE, ["--config.env.sokoban.carve_steps=2.5"])


def test_split_none_overrides__last_override_of_a_key_wins():
    from rl4agents import config_utils

    argv = ["p", "--config=f.py", "--config.a=None", "--config.b=None", "--config.b=2"]
    argv += ["--config.c", "None", "--config.a=1", "--config.a=None", "--workdir=w"]
    argv += ["--config.d=None", "--config.d", "-2", "--", "--config.e=None"]
    rest, keys = config_utils.split_none_overrides(argv)
    assert keys == ["a", "c"]  # b and d are set again after their None; after "--": no flags
    assert rest == [
        "p",
        "--config=f.py",
        "--config.b=2",
        "--config.a=1",  # absl applies it, then the later None
        "--workdir=w",
        "--config.d",
        "-2",
        "--",
        "--config.e=None",
    ]
    config = sweep.parse_command_config(FROZEN_LAKE, [])
    with pytest.raises(KeyError):
        config_utils.set_none(config, ["loss.nope"])
    with pytest.raises(ValueError, match="credit.grpo.eps does not take None"):
        config_utils.set_none(config, ["credit.grpo.eps"])
    with pytest.raises(ValueError, match="'loss' is a config section, not a field"):
        config_utils.set_none(config, ["loss"])


def test_nullable__declared_optional_fields_only():
    from rl4agents import config_utils
    from rl4agents.train import experiment

    assert config_utils.nullable("loss.ppo_clip.dual_clip_c")  # float | None
    assert config_utils.nullable("env.sokoban.carve_steps")  # int | None
    assert not config_utils.nullable("loss.ppo_clip.clip_low")
    assert not config_utils.nullable("optim.lr") and not config_utils.nullable("env.nope.x")
    # configs/base.py's own optional fields are those its range table lets be None.
    ranged = {k for k, bounds in experiment._RANGES.items() if bounds.get("allow_none")}
    assert ranged == set(config_utils.NULLABLE_FIELDS)


def test_resolve__missing_config_file_fails():
    with pytest.raises(ValueError, match=r"config file 'nope.py' \(from 'nope.py:x'\) does not"):
        sweep.resolve("nope.py:x", {})


# The runner, on a fake train script.

FAKE_TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys, time

    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    wd = args["workdir"]
    os.makedirs(wd, exist_ok=True)
    with open(os.path.join(wd, "calls.txt"), "a") as f:
        f.write(os.environ["XLA_FLAGS"] + "\\n")
    with open(os.path.join(wd, "pid.txt"), "w") as f:
        f.write(str(os.getpid()))
    behaviours = json.loads(os.environ.get("FAKE_BEHAVIOUR", "{}"))
    mode = next((b for k, b in behaviours.items() if k in wd), "ok")
    seed = int(args.get("config.seed", "0"))

    def summary(finished):
        with open(os.path.join(wd, "summary.json"), "w") as f:
            json.dump({"finished": finished, "steps": 2, "eval_test": {"greedy_success": seed}}, f)

    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "eval_test/greedy_success": 0.1}) + "\\n")
    if mode == "fail":
        print("error: boom", file=sys.stderr)
        sys.exit(3)
    if mode == "die_once" and not os.path.exists(os.path.join(wd, "marker")):
        open(os.path.join(wd, "marker"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        signal.signal(signal.SIGTERM, lambda *_: (summary(False), sys.exit(0)))
        time.sleep(120)
    summary(True)
    """
)


@pytest.fixture
def fake(tmp_path):
    """A study of 4 runs on configs/base.py, a fake train script, and the runner's arguments."""
    train = tmp_path / "fake_train.py"
    train.write_text(FAKE_TRAIN)
    study = tmp_path / "study.py"
    study.write_text(
        "from rl4agents import sweep\n"
        f"BASE = {BASE!r}\n"
        "def get_sweep():\n"
        "    return sweep.product(\n"
        "        sweep.fixed({'train.num_steps': 2}),\n"
        "        sweep.sweep_values('optim.lr', [0.1, 0.2]),\n"
        "        sweep.seeds(2),\n"
        "    )\n"
    )
    out = tmp_path / "out"
    return {
        "study": study,
        "out": out,
        "args": [str(study), f"--out={out}", "--workers=2", f"--train_script={train}"],
    }


def _calls(out: pathlib.Path, run_dir: str) -> int:
    path = out / run_dir / "calls.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_runner__devices_sets_each_runs_device_count(fake, monkeypatch, capsys):
    runner = _script("sweep")
    monkeypatch.setenv("FAKE_BEHAVIOUR", "{}")
    assert runner.main(fake["args"][:2] + ["--workers=1", "--devices=3", fake["args"][3]]) == 0
    flags = (fake["out"] / "base__optim.lr=0.1__seed=0" / "calls.txt").read_text().split()
    assert [f for f in flags if "device_count" in f] == ["--xla_force_host_platform_device_count=3"]
    with pytest.raises(SystemExit):
        runner.main(fake["args"] + ["--devices=-1"])
    assert "--devices=-1; allowed: >= 0" in capsys.readouterr().err


def test_worker_env__huge_pages_for_malloc_unless_the_user_set_tunables():
    runner = _script("sweep")
    env = runner.worker_env({"XLA_FLAGS": "--a=1 --xla_force_host_platform_device_count=8"}, 2)
    assert env["XLA_FLAGS"] == "--a=1 --xla_force_host_platform_device_count=2"
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert runner.worker_env({"GLIBC_TUNABLES": "mine"}, 1)["GLIBC_TUNABLES"] == "mine"


def test_runner__skips_complete_resumes_killed_reports_failed(fake, monkeypatch, capsys):
    runner = _script("sweep")
    out = fake["out"]
    killed, failing = "optim.lr=0.2__seed=1", "optim.lr=0.1__seed=1"
    monkeypatch.setenv("FAKE_BEHAVIOUR", json.dumps({killed: "die_once", failing: "fail"}))
    assert runner.main(fake["args"]) == 1
    text = capsys.readouterr().out
    log = out / f"base__{failing}" / "log.txt"
    assert f"FAILED base/{failing.replace('__', '/')}: exit code 3; log: {log}" in text
    assert "error: boom" in text  # the log's last line
    assert "killed by SIGKILL" in text
    assert "2 done, 0 skipped (already complete), 2 failed" in text
    ok_dir = "base__optim.lr=0.1__seed=0"
    assert results.is_complete(str(out / ok_dir))
    command = (out / ok_dir / "command.txt").read_text()
    assert "--config.optim.lr=0.1 --config.seed=0 --config.log.progress=False" in command
    config = json.loads((out / ok_dir / "config.json").read_text())
    assert config["optim"]["lr"] == 0.1 and config["train"]["num_steps"] == 2
    devices = max(1, (os.cpu_count() or 1) // 2)
    flags = (out / ok_dir / "calls.txt").read_text().split()
    assert [f for f in flags if "device_count" in f] == [
        f"--xla_force_host_platform_device_count={devices}"
    ]
    plan = json.loads((out / "sweep.json").read_text())
    assert [r["variant"] for r in plan["runs"]][::2] == [["optim.lr=0.1"], ["optim.lr=0.2"]]
    prov = json.loads((out / "provenance.json").read_text())  # the runner's own
    assert prov["sweep"]["runs"] == 4 and prov["argv"][1:] == fake["args"]
    assert prov["devices"] is None and prov["config"] is None  # each run has its own

    # Rerun: complete runs are skipped, the killed run resumes, the failing one fails again.
    assert runner.main(fake["args"]) == 1
    text = capsys.readouterr().out
    assert "1 done, 2 skipped (already complete), 1 failed" in text
    assert _calls(out, ok_dir) == 1 and _calls(out, f"base__{killed}") == 2
    assert results.is_complete(str(out / f"base__{killed}"))
    assert (log.read_text().count("=== ") == 4) and "exit code 3" in log.read_text()

    monkeypatch.setenv("FAKE_BEHAVIOUR", "{}")
    assert runner.main(fake["args"]) == 0
    assert "1 done, 3 skipped" in capsys.readouterr().out


def test_runner__dry_run_only_and_changed_config(fake, tmp_path, capsys):
    runner = _script("sweep")
    out = fake["out"]
    assert runner.main(fake["args"] + ["--dry_run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    assert "4 to run (0 resumed), 0 complete" in text and "--config.optim.lr=0.2" in text

    assert runner.main(fake["args"] + ["--only=lr=0.2"]) == 0
    text = capsys.readouterr().out
    assert "not selected" in text and "2 done" in text
    assert _calls(out, "base__optim.lr=0.1__seed=0") == 0
    assert runner.main(fake["args"] + ["--only=nothing"]) == 2
    assert "--only='nothing' matches no run" in capsys.readouterr().err

    # The same run names with a different fixed override: refused before anything runs.
    changed = tmp_path / "changed.py"
    changed.write_text(
        fake["study"].read_text().replace("'train.num_steps': 2", "'train.num_steps': 3")
    )
    assert runner.main([str(changed)] + fake["args"][1:]) == 2
    err = capsys.readouterr().err
    assert "started with a different config" in err and "train.num_steps: 2 -> 3" in err


def test_runner__a_key_added_after_a_run_started_is_no_change_at_its_default(
    fake, monkeypatch, capsys
):
    """A stored config without a key the project gained later (a run saved before it existed)
    matches a study that leaves the key at the base default, and not one that sets it."""
    runner = _script("sweep")
    monkeypatch.setenv("FAKE_BEHAVIOUR", "{}")
    assert runner.main(fake["args"]) == 0
    for path in fake["out"].glob("*/config.json"):
        stored = json.loads(path.read_text())
        assert stored["optim"].pop("skip_zero_grad") is False
        path.write_text(json.dumps(stored))
    capsys.readouterr()
    assert runner.main(fake["args"] + ["--dry_run"]) == 0
    assert "0 to run (0 resumed), 4 complete" in capsys.readouterr().out

    changed = fake["study"].parent / "changed.py"
    changed.write_text(
        fake["study"]
        .read_text()
        .replace("'train.num_steps': 2", "'train.num_steps': 2, 'optim.skip_zero_grad': True")
    )
    assert runner.main([str(changed)] + fake["args"][1:]) == 2
    assert "optim.skip_zero_grad: '<missing>' -> True" in capsys.readouterr().err


def test_runner__a_study_run_in_batches_keeps_one_plan(fake, tmp_path, monkeypatch, capsys):
    """A study whose runs depend on the environment (a subset per batch): each batch's plan
    keeps the earlier batches' runs first, so sweep.json names every run of the study."""
    runner = _script("sweep")
    monkeypatch.setenv("FAKE_BEHAVIOUR", "{}")
    study = tmp_path / "batched.py"
    study.write_text(
        "import os\n"
        "from rl4agents import sweep\n"
        f"BASE = {BASE!r}\n"
        "def get_sweep():\n"
        "    lrs = [float(x) for x in os.environ['LRS'].split(',')]\n"
        "    return sweep.product(\n"
        "        sweep.fixed({'train.num_steps': 2}),\n"
        "        sweep.sweep_values('optim.lr', lrs),\n"
        "        sweep.seeds(1),\n"
        "    )\n"
    )
    out = fake["out"]
    args = [str(study)] + fake["args"][1:]

    def dirs():
        return [r["dir"] for r in json.loads((out / "sweep.json").read_text())["runs"]]

    monkeypatch.setenv("LRS", "0.1")
    assert runner.main(args) == 0
    assert dirs() == ["base__optim.lr=0.1__seed=0"]
    monkeypatch.setenv("LRS", "0.2,0.1")  # a new run, and one the plan already has
    assert runner.main(args) == 0
    assert dirs() == ["base__optim.lr=0.2__seed=0", "base__optim.lr=0.1__seed=0"]
    monkeypatch.setenv("LRS", "0.3")
    assert runner.main(args) == 0
    assert dirs() == [
        "base__optim.lr=0.2__seed=0",
        "base__optim.lr=0.1__seed=0",
        "base__optim.lr=0.3__seed=0",
    ]
    # Another study's plan in the directory is replaced, not merged.
    plan = json.loads((out / "sweep.json").read_text())
    (out / "sweep.json").write_text(json.dumps({**plan, "study": "another_study"}))
    assert runner.main(args) == 0
    assert dirs() == ["base__optim.lr=0.3__seed=0"]
    capsys.readouterr()


def test_runner__bad_override_fails_before_running(fake, tmp_path, capsys):
    runner = _script("sweep")
    bad = tmp_path / "bad.py"
    bad.write_text(fake["study"].read_text().replace("'optim.lr'", "'optim.lrr'"))
    assert runner.main([str(bad)] + fake["args"][1:]) == 2
    err = capsys.readouterr().err
    assert "run base/optim.lrr=0.1/seed=0: unknown config key 'optim.lrr'" in err
    assert "did you mean 'optim.lr'" in err
    assert not fake["out"].exists()


def _study(tmp_path: pathlib.Path, body: str, name: str = "study.py") -> pathlib.Path:
    """A study file on configs/base.py with `body` (its get_sweep) after the header."""
    path = tmp_path / name
    path.write_text(f"from rl4agents import sweep\nBASE = {BASE!r}\n" + textwrap.dedent(body))
    return path


# Values that train.py refuses at start-up: refused when the sweep is planned, naming the run.
@pytest.mark.parametrize(
    "points, run, message",
    [
        (
            "sweep.sweep_values('credit.name', ['grpo', 'nope'])",
            "base/credit.name=nope",
            "credit.name='nope' is not allowed; allowed: [",
        ),
        ("sweep.sweep_values('optim.lr', [1e-3, 0.0])", "base/optim.lr=0.0", "optim.lr=0.0; "),
        (
            "sweep.sweep_values('mesh.shape', [(-1, 1, 1), (1, 1)])",
            "base/mesh.shape=1,1",
            "mesh.shape=(1, 1) must have one entry per axis in ('data', 'fsdp', 'tensor')",
        ),
        (
            "sweep.sweep_values('mesh.shape', [(0, 1, 1)])",
            "base/mesh.shape=0,1,1",
            "mesh.shape=(0, 1, 1); allowed: entries >= 1",
        ),
        (
            "sweep.sweep_values('mesh.shape', [(3, 1, 1)])",
            "base/mesh.shape=3,1,1",
            "rollout.num_tasks: batch of 256 episodes is not divisible by the mesh's data size 3",
        ),
        (
            "sweep.sweep_values('rollout.group_size', [4, 1])",
            "base/rollout.group_size=1",
            "rollout.group_size=1 is below 2, but credit.name='grpo' needs groups",
        ),
        (
            "sweep.sweep_values('credit.name', ['ppo_gae'])",
            "base/credit.name=ppo_gae",
            "credit.name='ppo_gae' needs a critic but model.value_head='none'",
        ),
        (
            "sweep.sweep_values('env.frozen_lake.size', [4, 1])",
            "base/env.frozen_lake.size=1",
            "size must be >= 2, got 1",
        ),
        (
            "sweep.sweep_values('rollout.max_action_len', [0])",
            "base/rollout.max_action_len=0",
            "rollout.max_action_len=0; allowed: >= 1",
        ),
        (
            "sweep.sweep_values('train.minibatches', [3])",
            "base/train.minibatches=3",
            "train.minibatches=3 does not divide the batch of 256 episodes",
        ),
    ],
    ids=[
        "credit_name",
        "lr",
        "mesh_axes",
        "mesh_zero",
        "mesh_batch",
        "group_size",
        "critic",
        "env_arg",
        "action_len",
        "minibatches",
    ],
)
def test_runner__bad_values_fail_at_plan_time(tmp_path, capsys, points, run, message):
    study = _study(tmp_path, f"def get_sweep():\n    return {points}\n")
    runner = _script("sweep")
    assert runner.main([str(study), f"--out={tmp_path / 'out'}", "--dry_run"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: run {run}: ") and message in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""  # one line, no plan


def test_runner__bad_value_fails_before_any_run_starts(fake, tmp_path, capsys):
    runner = _script("sweep")
    bad = tmp_path / "bad.py"
    bad.write_text(fake["study"].read_text().replace("[0.1, 0.2]", "[0.1, 0.0]"))
    assert runner.main([str(bad)] + fake["args"][1:]) == 2
    assert capsys.readouterr().err == "error: run base/optim.lr=0.0/seed=0: optim.lr=0.0; " + (
        "allowed: > 0\n"
    )
    assert not fake["out"].exists()  # not even the good runs started


@pytest.mark.parametrize(
    "spec, env, credit",
    [
        ("configs/frozen_lake.py", "frozen_lake", "grpo"),
        ("configs/sokoban.py:ppo_gae", "sokoban", "ppo_gae"),
        ("configs/countdown.py", "countdown", "grpo"),
    ],
)
def test_check_config__accepts_shipped_configs(spec, env, credit):
    config = sweep.resolve(str(ROOT / spec), {})
    assert (config.env.name, config.credit.name) == (env, credit)
    before = config.to_dict()
    assert sweep.check_config(config) is None
    assert config.to_dict() == before  # checked, not changed
    # the same config with one bad value of its environment's section is refused
    bad = sweep.resolve(str(ROOT / spec), {f"env.{env}.invalid_penalty": -0.1})
    with pytest.raises(ValueError, match=r"^invalid_penalty must be >= 0 .*got -0\.1$"):
        sweep.check_config(bad)


# Malformed study files: one line naming the file and the problem, exit status 2.
@pytest.mark.parametrize(
    "body, problem",
    [
        (
            "def get_sweep():\n    return {'seed': [0, 1]}\n",
            r"get_sweep\(\) returned a dict; allowed: a list of sweep\.Point",
        ),
        (
            "def get_sweep():\n    return [1, 2]\n",
            r"get_sweep\(\) returned a list with an element 1 \(int\); allowed: sweep\.Point",
        ),
        (
            "def get_sweep():\n    return sweep.sweep_values(3, [1])\n",
            r"get_sweep\(\) raised ValueError: sweep_values\(3, \.\.\.\): the key 3 has type "
            r"int; allowed: a dotted config key string",
        ),
        (
            "def get_sweep():\n    return sweep.fixed({3: 1})\n",
            r"override key 3 \(int\); allowed: a dotted config key string",
        ),
        ("def get_sweep(:\n    return []\n", r"does not load: SyntaxError: .*\(line 3\)"),
        (
            "import no_such_module_xyz\n",
            r"does not load: ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "def get_sweep():\n    return sweep.nope()\n",
            r"get_sweep\(\) raised AttributeError: .*'nope'",
        ),
    ],
    ids=["dict", "non_points", "key_type", "fixed_key", "syntax", "import", "raises"],
)
def test_runner__malformed_study_fails_in_one_line(tmp_path, capsys, body, problem):
    study = _study(tmp_path, body)
    runner = _script("sweep")
    assert runner.main([str(study), f"--out={tmp_path / 'out'}", "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: study file {str(study)!r}") and err.count("\n") == 1
    assert re.search(problem, err), err


def test_runner__malformed_study_from_the_command_line(tmp_path):
    study = _study(tmp_path, "def get_sweep():\n    return [sweep.seeds(2)]\n")
    cmd = [sys.executable, str(ROOT / "scripts" / "sweep.py"), str(study), "--dry_run"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: study file {str(study)!r}: get_sweep() returned a list")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_runner__interrupt_stops_workers_and_rerun_continues(fake):
    out = fake["out"]
    env = dict(os.environ, FAKE_BEHAVIOUR=json.dumps({"base": "hang"}))
    cmd = [sys.executable, str(ROOT / "scripts" / "sweep.py"), *fake["args"]]
    # A child inherits an ignored SIGINT (e.g. under `nohup ... &`); give it the default back
    # so that Python installs its Ctrl-C handler, as in an interactive shell. JAX, started in
    # this process, warns at any fork with Python code before the exec: one signal call is
    # no deadlock risk.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    pids = [
        out / d / "pid.txt" for d in ("base__optim.lr=0.1__seed=0", "base__optim.lr=0.1__seed=1")
    ]
    # Generous limits: on a loaded 2-core machine starting the runner alone takes ~30 s.
    deadline = time.monotonic() + 300
    while not all(p.exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(p.exists() for p in pids), "workers did not start"
    time.sleep(1.0)  # the fake installs its SIGTERM handler
    proc.send_signal(signal.SIGINT)
    text = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 130, text
    assert "Interrupted; rerun the same command to continue." in text
    for p in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.read_text()), 0)
        summary = json.loads((p.parent / "summary.json").read_text())
        assert summary["finished"] is False  # stopped cleanly by SIGTERM
    assert not (out / "base__optim.lr=0.2__seed=0").exists()

    env["FAKE_BEHAVIOUR"] = "{}"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 resumed" in done.stdout and "4 done, 0 skipped" in done.stdout


# Tables.


def _make_run(root, name, variant, env, seed, *, success, wall, finished=True, config=None):
    d = root / sweep.dirname(name)
    d.mkdir(parents=True)
    summary = {"finished": finished, "steps": 10, "wall_s": wall}
    if success is not None:
        summary["eval_test"] = {"greedy_success": success}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.json").write_text(json.dumps(config or {"seed": seed, "env": {"name": env}}))
    rows = [
        {"step": s, "eval_test/greedy_success": (success or 0) * s / 10, "train/success": 0.1}
        for s in (5, 10)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"name": name, "dir": d.name, "variant": variant, "env": env, "seed": seed}


def _write_plan(root, runs):
    (root / "sweep.json").write_text(json.dumps({"study": "demo_study", "runs": runs}))


@pytest.fixture
def table_sweep(tmp_path):
    root = tmp_path / "sweep"
    runs = []
    values = {
        ("grpo", "frozen_lake"): [0.6, 0.7, 0.8],
        ("rloo", "frozen_lake"): [0.5, 0.6, None],  # third seed incomplete
        ("grpo", "sokoban"): [0.2, 0.4, 0.3],
        ("rloo", "sokoban"): [0.25, 0.45, 0.35],
    }
    for (variant, env), successes in values.items():
        for seed, success in enumerate(successes):
            name = f"{env}/credit.name={variant}/seed={seed}"
            runs.append(
                _make_run(
                    root,
                    name,
                    ["base_arg", f"credit.name={variant}"],
                    env,
                    seed,
                    success=success,
                    wall=100.0 + 10 * seed + (50 if variant == "rloo" else 0),
                    finished=success is not None,
                )
            )
    runs.append(
        {
            "name": "sokoban/credit.name=rloo/seed=3",
            "dir": "never_started",
            "variant": ["base_arg", "credit.name=rloo"],
            "env": "sokoban",
            "seed": 3,
        }
    )
    _write_plan(root, runs)
    return root


def test_make_table__mean_std_n_bold_and_files(table_sweep, tmp_path, capsys):
    out = tmp_path / "results"
    args = [
        f"--sweep={table_sweep}",
        f"--out={out}",
        "--metric=eval_test.greedy_success,wall_s:min",
    ]
    assert _script("make_table").main(args) == 0
    md = (out / "table.md").read_text()
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    header = lines["| variant"]
    assert "frozen_lake: eval_test.greedy_success ↑" in header and "sokoban: wall_s ↓" in header
    # frozen_lake success: grpo 0.7 ± 0.1 (n=3) beats rloo 0.55 ± 0.0707 (n=2).
    grpo, rloo = lines["| credit.name=grpo"], lines["| credit.name=rloo"]
    assert grpo.split(" | ")[1:3] == ["**0.700 ± 0.100** (n=3)", "**110 ± 10** (n=3)"]
    assert rloo.split(" | ")[1:3] == ["0.550 ± 0.071 (n=2)", "155 ± 7 (n=2)"]
    # sokoban success: rloo 0.35 beats grpo 0.30.
    assert grpo.split(" | ")[3] == "0.300 ± 0.100 (n=3)"
    assert rloo.split(" | ")[3] == "**0.350 ± 0.100** (n=3)"
    assert "sample standard deviation (ddof=1)" in md
    assert "11 of 13 runs complete." in md and "Not included (2 runs):" in md
    assert "`frozen_lake/credit.name=rloo/seed=2`: incomplete, stopped at step 10" in md
    assert "`sokoban/credit.name=rloo/seed=3`: missing, never started" in md
    assert "![curves_frozen_lake](curves_frozen_lake.png)" in md
    assert "Not included (2 runs)" in capsys.readouterr().out

    with open(out / "table.csv") as f:
        cells = {(r["variant"], r["env"], r["metric"]): r for r in csv.DictReader(f)}
    cell = cells[("credit.name=rloo", "frozen_lake", "eval_test.greedy_success")]
    assert float(cell["mean"]) == pytest.approx(0.55) and cell["n"] == "2" and cell["best"] == "0"
    assert float(cell["std"]) == pytest.approx(0.0707107, rel=1e-5)
    assert cells[("credit.name=grpo", "frozen_lake", "wall_s")]["best"] == "1"
    with open(out / "runs.csv") as f:
        statuses = [r["status"] for r in csv.DictReader(f)]
    assert statuses.count("complete") == 11 and statuses.count("missing") == 1

    tex = (out / "table.tex").read_text()
    assert r"\multicolumn{2}{c}{frozen\_lake}" in tex
    assert r"credit.name=grpo & \textbf{0.700 $\pm$ 0.100} (3) & \textbf{110 $\pm$ 10} (3)" in tex
    assert r"eval\_test.greedy\_success $\uparrow$" in tex and "ddof=1" in tex
    for env in ("frozen_lake", "sokoban"):
        assert (out / f"curves_{env}.png").read_bytes()[:4] == b"\x89PNG"


def test_make_table__single_seed_has_no_std_and_cells_must_match(tmp_path):
    root = tmp_path / "sweep"
    runs = [
        _make_run(root, "a/seed=0", [], "fl", 0, success=0.5, wall=1.0),
        _make_run(root, "b/seed=0", ["x=1"], "fl", 0, success=0.25, wall=2.0),
    ]
    _write_plan(root, runs)
    out = tmp_path / "out"
    assert _script("make_table").main([f"--sweep={root}", f"--out={out}"]) == 0
    md = (out / "table.md").read_text()
    assert "| base | **0.500** (n=1) | - | **1.000** (n=1) |" in md
    assert "| x=1 | 0.250 (n=1) | - | 2.000 (n=1) |" in md

    # Two seeds of one row whose configs differ beyond the seed are refused.
    root = tmp_path / "mixed"
    runs = [
        _make_run(root, "a/seed=0", [], "fl", 0, success=0.5, wall=1.0, config={"size": 4}),
        _make_run(root, "b/seed=1", [], "fl", 1, success=0.5, wall=1.0, config={"size": 6}),
    ]
    _write_plan(root, runs)
    make_table = _script("make_table")
    with pytest.raises(ValueError, match=r"configs differ beyond the seed: \['size: 4 -> 6'\]"):
        make_table.aggregate(make_table.load_entries(str(root)), [("wall_s", "min")])


def test_stats_helpers():
    assert results.mean_std([1.0, 2.0, 3.0]) == results.Stat(2.0, 1.0, 3)
    assert results.mean_std([4.0, None, float("nan")]) == results.Stat(4.0, None, 1)
    assert results.mean_std([]) is None
    assert results.short_labels([("a", "x=1"), ("a", "x=2")]) == ["x=1", "x=2"]
    assert results.short_labels([("a",), ("a",)]) == ["base", "base"]
    xs, mean, lo, hi, n = results.curve_stats([[(1, 0.0), (2, 1.0)], [(1, 1.0)]])
    assert (xs, mean, lo, hi, n) == ([1, 2], [0.5, 1.0], [0.0, 1.0], [1.0, 1.0], [2, 1])
    assert results.parse_metric("wall_s:min") == ("wall_s", "min")
    with pytest.raises(ValueError, match=r"metric 'x:best': allowed"):
        results.parse_metric("x:best")


# Studies whose runs start from a pretrained checkpoint, and the variable naming its folder.
CHECKPOINT_STUDIES = {"real_model_rl.py": "REAL_MODEL_DIR"}


# Every committed study plans: it loads, and each of its runs' configs resolves and passes
# the start-up checks, so a study file cannot rot between the sessions that run it.


@pytest.mark.parametrize(
    "study", sorted(p.name for p in (ROOT / "experiments").glob("*.py")), ids=lambda s: s[:-3]
)
def test_committed_study__plans_and_every_config_passes_checks(study, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    if study in CHECKPOINT_STUDIES:  # its runs start from a checkpoint folder: a tiny one
        pytest.importorskip("transformers")
        write_tiny_llama(tmp_path / "model", ["guess 12 higher lower correct\n"] * 50)
        monkeypatch.setenv(CHECKPOINT_STUDIES[study], str(tmp_path / "model"))
    planned = sweep.load_study(f"experiments/{study}")
    assert planned.runs, f"{study} plans no runs"
    for run in planned.runs:
        sweep.check_config(sweep.resolve(run.config, run.overrides))


# End to end on the example study.


@pytest.mark.slow
def test_example_sweep__end_to_end(tmp_path):
    out, results = tmp_path / "sweep", tmp_path / "results"
    sweep_cmd = [
        sys.executable,
        "scripts/sweep.py",
        "experiments/example_sweep.py",
        f"--out={out}",
        "--workers=2",
    ]
    done = subprocess.run(sweep_cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 done, 0 skipped" in done.stdout
    table_cmd = [sys.executable, "scripts/make_table.py", f"--sweep={out}", f"--out={results}"]
    made = subprocess.run(table_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    md = (results / "table.md").read_text()
    assert "| grpo | " in md and "| ppo_gae | " in md and md.count("(n=2)") == 6
    assert "4 of 4 runs complete." in md
    assert (results / "curves_frozen_lake.png").exists()
    again = subprocess.run(sweep_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 done, 4 skipped" in again.stdout


def test_make_table__strip_merges_rows_across_environments(tmp_path):
    root = tmp_path / "sweep"
    runs = [
        _make_run(root, "fl,grpo/seed=0", ["fl8,grpo"], "frozen_lake", 0, success=0.5, wall=1.0),
        _make_run(root, "sk,grpo/seed=0", ["sok6,grpo"], "sokoban", 0, success=0.25, wall=2.0),
    ]
    _write_plan(root, runs)
    make_table = _script("make_table")
    entries = make_table.load_entries(str(root), strip=r"^(fl8|sok6),")
    assert [e.label for e in entries] == ["grpo", "grpo"]
    out = tmp_path / "out"
    args = [f"--sweep={root}", f"--out={out}", "--strip=^(fl8|sok6),"]
    assert make_table.main(args) == 0
    md = (out / "table.md").read_text()
    # One row spanning both environments (default metrics: success, a second metric, wall).
    assert "| grpo | 0.500 (n=1) | - | 1.000 (n=1) | 0.250 (n=1) | - | 2.000 (n=1) |" in md


def test_make_table__only_keeps_the_named_runs(tmp_path):
    root = tmp_path / "sweep"
    runs = [
        _make_run(root, "fl,grpo/seed=0", ["fl8,grpo"], "frozen_lake", 0, success=0.5, wall=1.0),
        _make_run(root, "fl,gigpo/seed=0", ["fl8,gigpo"], "frozen_lake", 0, success=0.25, wall=2.0),
    ]
    _write_plan(root, runs)
    make_table = _script("make_table")
    entries = make_table.load_entries(str(root), only="gigpo")
    assert [e.name for e in entries] == ["fl,gigpo/seed=0"]
    out = tmp_path / "out"
    assert make_table.main([f"--sweep={root}", f"--out={out}", "--only=gigpo"]) == 0
    md = (out / "table.md").read_text()
    assert "0.250 (n=1)" in md and "0.500" not in md


# Provenance in tables.


def _provenance(run_dir, commit, *, dirty=False, jax_version="0.10.2", count=8):
    record = {
        "git": {"commit": commit, "dirty": dirty},
        "packages": {"jax": jax_version},
        "devices": {"platform": "cpu", "count": count},
    }
    (run_dir / "provenance.json").write_text(json.dumps(record))


def test_make_table__provenance_footer_and_mixed_commits_refused(tmp_path, capsys):
    root, out = tmp_path / "sweep", tmp_path / "out"
    runs = [
        _make_run(root, "a/seed=0", [], "fl", 0, success=0.5, wall=1.0),
        _make_run(root, "a/seed=1", [], "fl", 1, success=0.7, wall=1.0),
        _make_run(root, "b/seed=0", ["x=1"], "fl", 0, success=0.2, wall=2.0),
    ]
    _write_plan(root, runs)
    c1, c2 = "c1" * 20, "d2" * 20
    for r in runs:
        _provenance(root / r["dir"], c1)
    make_table = _script("make_table")
    args = [f"--sweep={root}", f"--out={out}"]
    assert make_table.main(args) == 0
    md = (out / "table.md").read_text()
    assert "Provenance: commit c1c1c1c (clean), jax 0.10.2, 8 cpu devices (3 runs)." in md
    assert "warning" not in capsys.readouterr().err

    # Another commit: refused in one line naming both runs and commits, nothing written.
    _provenance(root / runs[2]["dir"], c2, dirty=True)
    shutil.rmtree(out)
    assert make_table.main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: runs 'a/seed=0' and 'b/seed=0' were made at different commits (c1c1c1c and "
        f"d2d2d2d); {make_table.MIXED_HINT}\n"
    )
    assert not out.exists()
    assert make_table.main([*args, "--allow_mixed"]) == 0
    md = (out / "table.md").read_text()
    assert "Provenance (2 kinds):" in md
    assert "- commit c1c1c1c (clean), jax 0.10.2, 8 cpu devices: `a/seed=0`, `a/seed=1`" in md
    assert "- commit d2d2d2d (uncommitted changes), jax 0.10.2, 8 cpu devices: `b/seed=0`" in md
    assert "Pooled with --allow_mixed:\n- runs 'a/seed=0' and 'b/seed=0' were made" in md
    assert "| x=1 | 0.200 (n=1) |" in md

    # A run without provenance.json (made before it was recorded) is unknown: one warning,
    # no refusal; a dirty tree is shown, not refused.
    _provenance(root / runs[2]["dir"], c1, dirty=True)
    (root / runs[1]["dir"] / "provenance.json").unlink()
    assert make_table.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "1 of 3 complete runs have no provenance.json" in err
    md = (out / "table.md").read_text()
    assert "- unknown (no provenance.json): `a/seed=1`" in md
    assert "Pooled with" not in md

    # No run with provenance.json (tables made before it was recorded): no footer at all.
    for r in runs:
        (root / r["dir"] / "provenance.json").unlink(missing_ok=True)
    assert make_table.main(args) == 0
    assert "Provenance" not in (out / "table.md").read_text()


def test_make_table__configs_must_agree_beyond_seed_and_varied_keys(tmp_path, capsys):
    root, out = tmp_path / "sweep", tmp_path / "out"
    runs = []
    for x, vh, seed in [(1, "none", 0), (1, "none", 1), (2, "shared", 0)]:
        config = {"seed": seed, "x": x, "vh": vh, "optim": {"lr": 0.1}}
        name = f"cfg/x={x}/seed={seed}"
        run = _make_run(root, name, [f"x={x}"], "fl", seed, success=0.5, wall=1.0, config=config)
        # vh varies with x but is not in the name (sweep_values(..., in_name=False)).
        run.update(config="cfg.py", overrides={"x": x, "vh": vh, "seed": seed})
        runs.append(run)
    _write_plan(root, runs)
    make_table = _script("make_table")
    assert make_table.varied_keys(runs) == {"x", "vh", "seed"}
    args = [f"--sweep={root}", f"--out={out}"]
    assert make_table.main(args) == 0  # x and vh are what the sweep varies
    assert "warning: 3 of 3 complete runs have no provenance.json" in capsys.readouterr().err
    # A key the sweep does not set differs (a default changed between the runs, say).
    config_path = root / runs[2]["dir"] / "config.json"
    config = json.loads(config_path.read_text())
    config["optim"]["lr"] = 0.2
    config_path.write_text(json.dumps(config))
    assert make_table.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: runs 'cfg/x=1/seed=0' and 'cfg/x=2/seed=0' (config 'cfg.py') have configs "
        "that differ beyond the seed and the keys the sweep varies: optim.lr: 0.1 -> 0.2; "
    )
    assert err.endswith("--allow_mixed to pool them anyway\n")
    assert make_table.main([*args, "--allow_mixed"]) == 0
    md = (out / "table.md").read_text()
    assert "Pooled with --allow_mixed:" in md and "optim.lr: 0.1 -> 0.2" in md
    assert "Provenance" not in md  # no run has provenance.json
