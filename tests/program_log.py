"""A pytest plugin that logs what the suite spends on JAX programs, per test and per program.

  RL4AGENTS_TEST_JAX_CACHE=<new folder> python -m pytest -n 2 --dist loadfile \\
      --no-loadscope-reorder -p tests.program_log --program-log=runs/program_log

Each test process writes `<dir>/<worker>.jsonl`: one line per JAX monitoring event (tracing to
a jaxpr, lowering to StableHLO, XLA compile, with the function's name and seconds) and per
compile request that consults the persistent compilation cache (hit or miss, with the cache
key), each tagged with the running test's id; the main process first removes the folder's
logs of an earlier run. At the end the main process prints XLA compile, lowering and tracing
seconds by test file, the programs lowered again in one process (same cache key) and the small
op-by-op compiles (eager code). Off unless
`--program-log` is given; JAX's private `compiler` hooks are wrapped only then.
"""

from __future__ import annotations

import collections
import json
import os

import pytest

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_SMALL_S = 0.25  # a compile under this is counted as op-by-op (eager) dispatch


class _Log:
    def __init__(self, path: str):
        self.file = open(path, "w")  # noqa: SIM115 (closed at session end)
        self.test = "collect"

    def write(self, kind: str, name: str, value):
        self.file.write(json.dumps([kind, self.test, name, value]) + "\n")


def pytest_addoption(parser):
    parser.addoption("--program-log", default="", help="folder for per-process program logs")


def pytest_configure(config):
    folder = config.getoption("--program-log")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # the main process starts before its workers: drop an earlier run's logs
        for name in os.listdir(folder):
            if name.endswith(".jsonl"):
                os.remove(os.path.join(folder, name))
    from jax._src import compiler, monitoring

    log = _Log(os.path.join(folder, (worker or "main") + ".jsonl"))
    config._program_log = log

    def on_duration(event, seconds, **kwargs):
        if event in _EVENTS:
            log.write(_EVENTS[event], kwargs.get("fun_name", ""), seconds)

    monitoring.register_event_duration_secs_listener(on_duration)
    for kind in ("hit", "miss"):
        original = getattr(compiler, f"log_persistent_cache_{kind}")

        def wrapped(module_name, cache_key, _kind=kind, _original=original):
            log.write(_kind, module_name, cache_key)
            return _original(module_name, cache_key)

        setattr(compiler, f"log_persistent_cache_{kind}", wrapped)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = getattr(item.config, "_program_log", None)
    if log is not None:
        log.test = item.nodeid
    yield
    if log is not None:
        log.test = "between tests"
        log.file.flush()  # the main process reads the workers' logs before they exit


def _summary(folder: str) -> list[str]:
    seconds = collections.defaultdict(collections.Counter)  # file -> kind -> s
    small, small_n, repeats, repeat_s = collections.Counter(), 0, 0, 0.0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        keys, lowered = collections.Counter(), 0.0
        with open(os.path.join(folder, name)) as f:
            for line in f:
                kind, test, fun, value = json.loads(line)
                where = test.split("::")[0]
                if kind in ("trace", "lower", "compile"):
                    seconds[where][kind] += value
                if kind == "lower":
                    lowered = value
                elif kind in ("hit", "miss"):
                    keys[value] += 1
                    if keys[value] > 1:  # traced and lowered again: the program was rebuilt
                        repeats += 1
                        repeat_s += lowered
                elif kind == "compile" and value < _SMALL_S:
                    small[where] += value
                    small_n += 1
    total = collections.Counter()
    for kinds in seconds.values():
        total.update(kinds)
    lines = [
        f"JAX programs: compile {total['compile']:.1f} s, lowering {total['lower']:.1f} s, "
        f"tracing {total['trace']:.1f} s (summed over processes)",
        f"op-by-op compiles (< {_SMALL_S} s each): {small_n}, {sum(small.values()):.1f} s",
        f"programs lowered again in one process (same cache key): {repeats}, "
        f"{repeat_s:.1f} s of lowering",
        f"{'compile s':>10} {'lower s':>8} {'trace s':>8} {'op-by-op s':>10}  file",
    ]
    for where, kinds in sorted(seconds.items(), key=lambda kv: -kv[1]["compile"])[:25]:
        lines.append(
            f"{kinds['compile']:10.1f} {kinds['lower']:8.1f} {kinds['trace']:8.1f} "
            f"{small[where]:10.1f}  {where}"
        )
    return lines


def pytest_unconfigure(config):
    log = getattr(config, "_program_log", None)
    if log is not None:
        log.file.close()


def pytest_terminal_summary(terminalreporter, config):
    folder = config.getoption("--program-log")
    if not folder or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    log = getattr(config, "_program_log", None)
    if log is not None:
        log.file.flush()
    terminalreporter.section("JAX programs (tests/program_log.py)")
    for line in _summary(folder):
        terminalreporter.write_line(line)
