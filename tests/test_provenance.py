"""rl4agents.provenance (what a run records of where it came from) and scripts/_venv.sh's
install stamp (pip runs only when setup.py, constraints.txt, the extras or the switch change)."""

import datetime
import json
import os
import pathlib
import platform
import shutil
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import pytest

from rl4agents import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_collect__fields_match_this_process():
    config = ml_collections.ConfigDict({"seed": 3, "shape": (2, 4), "optim": {"lr": 1e-3}})
    t0 = time.perf_counter()
    head = _git(ROOT, "rev-parse", "HEAD")
    record = provenance.collect(config, argv=["scripts/train.py", "--workdir=runs/x"])
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed  # the git calls dominate
    assert record["schema"] == provenance.SCHEMA
    assert record["argv"] == ["scripts/train.py", "--workdir=runs/x"]
    assert record["config"] == {"seed": 3, "shape": [2, 4], "optim": {"lr": 1e-3}}
    # HEAD before or after (others may commit meanwhile in a shared checkout).
    assert record["git"]["commit"] in (head, _git(ROOT, "rev-parse", "HEAD"))
    assert isinstance(record["git"]["dirty"], bool)
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["packages"]["jax"] == jax.__version__
    assert set(record["packages"]) == set(provenance.PACKAGES)
    assert all(record["packages"].values())  # every one installed here
    assert record["devices"] == {
        "platform": jax.devices()[0].platform,
        "kind": jax.devices()[0].device_kind,
        "count": jax.device_count(),
        "local_count": jax.local_device_count(),
        "process_count": jax.process_count(),
    }
    stamp = datetime.datetime.fromisoformat(record["timestamp_utc"])
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.UTC) - stamp).total_seconds()) < 60
    assert provenance.collect()["argv"] == sys.argv  # the default
    assert provenance.collect(devices=False)["devices"] is None


def test_host__parses_cpuinfo_keeps_isa_flags_and_tolerates_absence(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text(
        "processor\t: 0\nmodel name\t: Some CPU 9000\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_tile ht\n\n"
        "processor\t: 1\nmodel name\t: Some CPU 9000\nflags\t\t: fpu avx\n"
    )
    record = provenance.host(str(x86))
    assert record["cpu_model"] == "Some CPU 9000"  # the first processor's
    assert record["isa"] == ["amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "fma", "sse4_2"]
    assert record["logical_cpus"] == os.cpu_count()
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp sve crc32\n")
    assert provenance.host(str(arm))["isa"] == ["asimd", "asimddp", "sve"]
    missing = provenance.host(str(tmp_path / "absent"))
    assert missing["cpu_model"] is None and missing["isa"] is None
    assert provenance.collect(devices=False)["host"]["machine"] == platform.machine()


def test_collect__env_is_jax_and_xla_only_and_names_no_machine(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/home/someone/dump --xla_cpu_a=1")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/home/someone/cache")
    monkeypatch.setenv("JAX_ENABLE_X64", "0")
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    record = provenance.collect(argv=["x"])
    assert record["env"]["XLA_FLAGS"] == "--xla_dump_to=<path> --xla_cpu_a=1"
    assert record["env"]["JAX_COMPILATION_CACHE_DIR"] == "<path>"
    assert record["env"]["JAX_ENABLE_X64"] == "0"
    assert "SECRET_TOKEN" not in record["env"]
    text = json.dumps(record)
    assert "someone" not in text and "hunter2" not in text and str(ROOT) not in text
    host = socket.gethostname()
    if len(host) >= 6:  # long enough not to occur by chance
        assert host not in text


def test_git_state__commit_and_dirty_flag_in_a_temp_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("runs/\n")
    _git(repo, "add", "a.py", ".gitignore")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.git_state(str(repo)) == {"commit": head, "dirty": False}
    (repo / "runs").mkdir()
    (repo / "runs" / "out.json").write_text("{}")  # ignored: still clean
    assert provenance.git_state(str(repo))["dirty"] is False
    (repo / "new.py").write_text("")  # untracked
    assert provenance.git_state(str(repo)) == {"commit": head, "dirty": True}
    (repo / "new.py").unlink()
    (repo / "a.py").write_text("x = 2\n")  # modified
    assert provenance.git_state(str(repo)) == {"commit": head, "dirty": True}
    # Not the top of a checkout (an installed copy inside some other repository), or none.
    (repo / "pkg").mkdir()
    assert provenance.git_state(str(repo / "pkg")) == {"commit": None, "dirty": None}
    (tmp_path / "plain").mkdir()
    assert provenance.git_state(str(tmp_path / "plain")) == {"commit": None, "dirty": None}


def test_git_state__no_git_binary_is_unknown_not_an_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert provenance.git_state() == {"commit": None, "dirty": None}


def test_write__atomic_file_read_back_and_extra_fields(tmp_path):
    folder = tmp_path / "new" / "run"
    path = provenance.write(str(folder), {"seed": 1}, argv=["a"], devices=False)
    assert path == str(folder / "provenance.json")
    assert os.listdir(folder) == ["provenance.json"]  # no temporary left
    record = provenance.read(str(folder))
    assert record["config"] == {"seed": 1} and record["argv"] == ["a"]
    path = provenance.write(
        str(folder), argv=["b"], devices=False, extra={"eval": {"step": 4}}, name="eval.json"
    )
    assert provenance.read(str(folder), "eval.json")["eval"] == {"step": 4}
    with pytest.raises(ValueError, match=r"extra=\['git'\] replaces provenance fields"):
        provenance.collect(extra={"git": "mine"})
    assert provenance.read(str(tmp_path)) is None  # absent
    (tmp_path / "provenance.json").write_text("{broken")
    assert provenance.read(str(tmp_path)) is None  # unreadable


# scripts/_venv.sh: a copy of the repo's install files with a fake .venv/bin/python whose
# `-m pip` only logs its arguments (FAKE_PIP_FAIL=1: fails); `-c` runs the real Python.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "${@:3}" >>"$PIP_LOG"
  [ -z "${FAKE_PIP_FAIL:-}" ]
  exit
fi
exec %s "$@"
"""


@pytest.fixture
def venv_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup.py", "constraints.txt", "scripts/_venv.sh"):
        shutil.copy(ROOT / name, repo / name)
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON % sys.executable)
    python.chmod(0o755)
    return repo


def _source(repo, **env):
    log = repo / "pip.log"
    log.unlink(missing_ok=True)
    out = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/_venv.sh; echo sourced"],
        cwd=repo,
        env={"PATH": os.environ["PATH"], "PIP_LOG": str(log), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return out, calls


def test_venv_sh__pip_runs_only_when_its_inputs_change(venv_repo):
    out, calls = _source(venv_repo, EXTRAS="hf,host")
    assert out.returncode == 0 and out.stdout == "sourced\n", out.stderr
    assert calls == ["install -q --upgrade pip", "install -q -c constraints.txt -e .[dev,hf,host]"]
    stamp = (venv_repo / ".venv" / "rl4agents-install.stamp").read_text()
    assert _source(venv_repo, EXTRAS="hf,host")[1] == []  # nothing changed: no pip
    # Each input changes the stamp: the extras, the switch, setup.py, constraints.txt.
    assert _source(venv_repo)[1][-1] == "install -q -c constraints.txt -e .[dev]"
    assert _source(venv_repo)[1] == []
    unlocked = _source(venv_repo, RL4AGENTS_UNLOCKED="1")[1]
    assert unlocked[-1] == "install -q --upgrade --upgrade-strategy eager -e .[dev]"
    assert _source(venv_repo, RL4AGENTS_UNLOCKED="1")[1] == []
    assert _source(venv_repo, RL4AGENTS_UNLOCKED="0")[1][-1].startswith("install -q -c")
    with open(venv_repo / "setup.py", "a") as f:
        f.write("# changed\n")
    assert len(_source(venv_repo)[1]) == 2
    with open(venv_repo / "constraints.txt", "a") as f:
        f.write("zipp==0.0.1\n")
    assert len(_source(venv_repo)[1]) == 2
    assert (venv_repo / ".venv" / "rl4agents-install.stamp").read_text() != stamp


def test_venv_sh__failed_install_leaves_no_stamp_and_bad_switch_is_refused(venv_repo):
    out, calls = _source(venv_repo, FAKE_PIP_FAIL="1")
    assert out.returncode != 0 and "sourced" not in out.stdout and len(calls) == 1
    assert not (venv_repo / ".venv" / "rl4agents-install.stamp").exists()
    assert len(_source(venv_repo)[1]) == 2  # tried again, and succeeds
    out, calls = _source(venv_repo, RL4AGENTS_UNLOCKED="yes")
    assert out.returncode == 2 and calls == []
    assert out.stderr == (
        "error: RL4AGENTS_UNLOCKED=yes; allowed: 1 (newest versions), 0 or unset "
        "(constraints.txt)\n"
    )
