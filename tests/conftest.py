"""Test setup: 8 simulated CPU devices before any backend use, fast compiles, and a cache.

Most of the suite's time is XLA compiling small programs, and many tests build the same
program again (a resumed run compiles what the interrupted one did; train and test splits
share an evaluation program). JAX's persistent compilation cache serves those from disk, also
across the two test workers. Programs that compile in under half a second (the op-by-op
dispatches of eager code) are not stored. The cache lives in `.cache/jax-tests` beside the
tests (ignored by git; `RL4AGENTS_TEST_JAX_CACHE` moves it, `=off` disables it). Its keys hold
the program, the compile options, the devices and the JAX version: a stale entry is never used.
"""

import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    # LLVM without its optimization passes: programs compile ~40% faster and run slower,
    # a good trade for tiny test programs that run a few times each.
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    # XLA CPU's older fusion code generator: the tiny test programs compile ~2x faster
    # (the tiny test config's train step: ~12 -> ~7 s, scripts/bench_test_compile.py), same results.
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

_CACHE = os.environ.get(
    "RL4AGENTS_TEST_JAX_CACHE",
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"
    ),
)
if _CACHE != "off":
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # A size bound turns on the cache's file lock: the two workers never read a half-written
    # entry. Least recently used entries go first past 2 GiB.
    jax.config.update("jax_compilation_cache_max_size", 2 * 1024**3)


# Heaviest first: `scripts/test.sh` hands whole files to the two workers in collection order
# (`--dist loadfile --no-loadscope-reorder`), so the long train-step and sharding files start
# at once and the many short files even out the end.
_FIRST = ("tests/train/", "tests/test_", "tests/rollout/", "tests/models/", "tests/envs/")
# With the slow tests selected (`-m "slow or not slow"` in CI): the files whose slow tests
# take longest go before all others, longest first (a full run with both workers busy:
# ~100-340 s each), so that no long file starts last and leaves one worker idle at the end.
_SLOW_FIRST = (
    "tests/test_sharding.py",
    "tests/test_multihost.py",
    "tests/test_sweep.py",
    "tests/train/test_sft.py",
    "tests/train/test_sft_workdir.py",
    "tests/test_extending.py",
    "tests/train/test_train.py",
    "tests/train/test_seeds_vmap.py",
    "tests/train/test_shared_prompt.py",
    "tests/models/test_hf.py",
    "tests/envs/test_household.py",
    "tests/test_models.py",
)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: `items` are the tests that run
def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    slow = any(item.get_closest_marker("slow") for item in items)
    first = (_SLOW_FIRST if slow else ()) + _FIRST

    def rank(item):
        path = os.path.relpath(str(item.path), root)
        return next((i for i, p in enumerate(first) if path.startswith(p)), len(first))

    items.sort(key=rank)  # stable: the order within a rank is kept


_BUILDS: dict = {}


@pytest.fixture(scope="module")
def reuse_builds():
    """Serve `experiment.build` calls with an equal config and mesh from one `Experiment`.

    A test that trains the same config several times (a run, then its interruption and
    resumption) otherwise traces and lowers the same programs again for each run, and reads
    each compiled program back from the compilation cache. An `Experiment` is immutable and
    its programs are pure functions of the config, so runs that share one behave as with fresh
    builds (the compilation cache already serves such a rebuild the identical executable,
    found by the program's hash). The builds are kept for the worker process, so modules that
    use this fixture share them too. Host-environment experiments hold environment processes
    and are always built afresh.
    """
    from rl4agents.train import experiment

    build = experiment.build

    def reused(config, mesh=None):
        key = (config.to_json_best_effort(sort_keys=True), mesh)
        if key not in _BUILDS:
            exp = build(config, mesh=mesh)
            if type(exp) is not experiment.Experiment:
                return exp
            _BUILDS[key] = exp
        return _BUILDS[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(experiment, "build", reused)
        yield


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's in-memory caches of compiled programs after each test file: a worker that
    keeps every program of a full run mapped nears the kernel's limit on memory mappings
    (65,530), where XLA's compiler crashed late in full runs. The on-disk cache still serves."""
    yield
    jax.clear_caches()
