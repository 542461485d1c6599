"""Where a run's output came from: `provenance.json` beside it.

    from rl4agents import provenance
    provenance.write(workdir, config)   # -> "<workdir>/provenance.json"

The record holds the resolved config, the git commit (and whether the source tree had
uncommitted changes) of the rl4agents checkout that ran, the versions of Python and of the
JAX stack, the devices and process count, the JAX/XLA environment variables and the command
line, with a UTC timestamp, and the host's processor: its model name, core count and the
instruction-set extensions that decide which kernels XLA's CPU backend compiles (a run
repeated on a processor with other extensions can differ in the last bits of its sums, and
training amplifies that). It names no machine: no hostname, user or path beyond the
command line as typed (absolute paths in environment variables read `<path>`).

Nothing here fails a run: what cannot be found (no git, not a checkout, a package absent)
is recorded as None.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

FILENAME = "provenance.json"
SCHEMA = 1

# Distributions whose versions decide a run's numbers (importlib.metadata names).
PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "chex",
    "ml-collections",
    "numpy",
)

# Environment variables recorded: those that change what XLA compiles or where it runs.
_ENV_PREFIXES = ("JAX_", "XLA_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")
# An absolute path inside a value: at the start or after a separator (space = , :).
_ABS_PATH = re.compile(r"(?<![^\s=,:])/[^\s,:]*")

_REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collect(
    config: Any = None,
    argv: Sequence[str] | None = None,
    *,
    devices: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of this process, as a JSON-ready dict.

    Args:
      config: the resolved config: an ml_collections ConfigDict (`to_dict()`), a mapping,
        a JSON string, or None (recorded as None). Values JSON cannot hold become their repr.
      argv: the command line; `sys.argv` when None.
      devices: whether to ask JAX for its devices and process count. False leaves them None
        and does not start a JAX backend (a launcher whose children use the accelerator).
      extra: more JSON-ready fields for the record (what an evaluation evaluated); they may
        not replace the fields above.

    Returns:
      {"schema", "timestamp_utc", "argv", "git": {"commit", "dirty"}, "python",
       "packages": {name: version or None}, "devices": {"platform", "kind", "count",
       "local_count", "process_count"} or None, "env": {name: value}, "host": `host()`,
       "config"}, plus `extra`.
    """
    record = {
        "schema": SCHEMA,
        "timestamp_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": list(sys.argv if argv is None else argv),
        "git": git_state(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "devices": _devices() if devices else None,
        "env": _env(os.environ),
        "host": host(),
        "config": _config(config),
    }
    clash = sorted(set(extra or ()) & set(record))
    if clash:
        raise ValueError(f"extra={clash} replaces provenance fields; allowed: other names")
    record.update(json.loads(json.dumps(dict(extra or {}), default=repr)))
    return record


def write(
    folder: str,
    config: Any = None,
    argv: Sequence[str] | None = None,
    *,
    devices: bool = True,
    extra: Mapping[str, Any] | None = None,
    name: str = FILENAME,
) -> str:
    """Writes `collect(config, argv, devices=devices, extra=extra)` to `folder/name`
    (`provenance.json` by default), atomically (a temporary file renamed over it), creating
    `folder` if absent. Returns the path.

    In a multi-process run only one process should call it (the one that writes summaries).
    """
    os.makedirs(folder, exist_ok=True)
    record = collect(config, argv, devices=devices, extra=extra)
    path = os.path.join(folder, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read(folder: str, name: str = FILENAME) -> dict[str, Any] | None:
    """`folder/name` (`provenance.json`) as a dict, or None when it is absent or unreadable."""
    try:
        with open(os.path.join(folder, name)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def git_state(repo_dir: str = _REPO_DIR) -> dict[str, Any]:
    """{"commit": 40-hex HEAD or None, "dirty": bool or None} of the git checkout whose top
    level is `repo_dir` (by default the one holding this package). Both are None when
    `repo_dir` is not the top of a checkout (an installed copy) or git is absent or fails.
    Dirty: any tracked file modified or staged, or any untracked file git does not ignore."""
    top = _git(repo_dir, "rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(repo_dir):
        return {"commit": None, "dirty": None}
    commit = _git(repo_dir, "rev-parse", "--verify", "HEAD")
    status = _git(repo_dir, "status", "--porcelain", "--untracked-files=normal")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


# CPU flags (as /proc/cpuinfo spells them) that change the vector kernels XLA's CPU backend
# and its libraries pick: SIMD width, fused multiply-add, bf16/int8 matrix units.
_ISA_FLAG = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*|sve\w*|asimd\w*)$")


def host(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """{"machine": e.g. "x86_64", "cpu_model": the processor's model name or None,
    "logical_cpus": int or None, "isa": sorted instruction-set flags or None}.

    `isa` keeps the flags that decide which vector kernels XLA's CPU backend and its
    libraries run (AVX2, AVX-512, FMA, AMX, SVE, ...); two runs whose `isa` differ can differ
    numerically even with the same packages and seeds. `cpuinfo` is Linux's
    `/proc/cpuinfo`; elsewhere (or unreadable) the CPU fields are None.
    """
    model, flags = None, None
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:
            flags = sorted({w for w in value.split() if _ISA_FLAG.match(w)})
    return {
        "machine": platform.machine() or None,
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "isa": flags,
    }


def _git(repo_dir: str, *args: str) -> str | None:
    # --no-optional-locks: a status never takes the index lock a concurrent commit needs.
    try:
        proc = subprocess.run(
            ["git", "--no-optional-locks", "-C", repo_dir, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _devices() -> dict[str, Any] | None:
    try:
        import jax

        devs = jax.devices()
        return {
            "platform": devs[0].platform,
            "kind": devs[0].device_kind,
            "count": len(devs),
            "local_count": jax.local_device_count(),
            "process_count": jax.process_count(),
        }
    except Exception:  # noqa: BLE001 -- a provenance record never fails the run
        return None


def _env(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        name: _ABS_PATH.sub("<path>", value)
        for name, value in sorted(environ.items())
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES
    }


def _config(config: Any) -> Any:
    if config is None:
        return None
    if isinstance(config, str):
        return json.loads(config)
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    return json.loads(json.dumps(config, default=repr))
