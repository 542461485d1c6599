"""Bad values a fuzzed command line found: each is refused at start-up in one line naming the
field, the value and what is allowed, before anything is built.

Everything here calls the validation functions directly (no training, no compiling); the
command-line side of the same refusals is in tests/test_cli_flags.py.
"""

import glob
import math
import os

import pytest

from configs import frozen_lake
from rl4agents import config_utils, credit, envs, losses, sharding
from rl4agents.train import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
    if not p.endswith("__init__.py")
)


def _set(config, key, value):
    *path, field = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[field] = value


def _refusal(config) -> str:
    with pytest.raises(ValueError) as info:
        experiment.check_ranges(config)
    return str(info.value)


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_float_field_refuses_nan_and_inf_in_one_line(path):
    config = config_utils.load_config_file(os.path.join(ROOT, path))
    experiment.check_ranges(config)  # the defaults pass
    floats = {k: v for k, (v, kind) in config_utils.leaves(config).items() if kind is float}
    # Base sections, variant sections from signatures (a None placeholder of `float | None`
    # too) and environment arguments.
    assert {"rollout.temperature", "loss.kl_coef", "credit.grpo.eps"} <= set(floats)
    assert any(k.startswith("env.") for k in floats)
    assert any(v is None for v in floats.values())
    for key, default in floats.items():
        for bad in (math.nan, math.inf, -math.inf):
            _set(config, key, bad)
            message = _refusal(config)
            assert "\n" not in message, message
            assert message.startswith(f"{key}={bad!r}; allowed: a finite number"), message
        _set(config, key, default)
    experiment.check_ranges(config)


def test_nan_in_a_field_that_has_a_range_names_the_range():
    for key, allowed in [
        ("rollout.temperature", "a finite number > 0"),
        ("loss.kl_coef", "a finite number >= 0"),
        ("loss.tis_cap", "a finite number >= 0 (0 = off, else >= 1)"),
        ("optim.lr", "a finite number > 0"),
    ]:
        config = frozen_lake.get_config()
        _set(config, key, math.nan)
        assert _refusal(config) == f"{key}=nan; allowed: {allowed}"


@pytest.mark.parametrize("key", ["seed", "train.eval_seed"])
def test_seeds_outside_32_bits_are_refused(key):
    config = frozen_lake.get_config()
    for bad in (2**32, 12345678901234567890, -1):  # 2**32 would be seed 0; 20 digits overflow
        _set(config, key, bad)
        assert _refusal(config) == (f"{key}={bad}; allowed: in [0, 4294967295] (a 32-bit seed)")
    for good in (0, 2**32 - 1):
        _set(config, key, good)
        experiment.check_ranges(config)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optim.warmup_steps", 10**10, "optim.warmup_steps=10000000000; allowed: <= 2147483647"),
        ("train.num_steps", 2**31, "train.num_steps=2147483648; allowed: <= 2147483647"),
        ("train.eval_tasks", 10**12, "train.eval_tasks=1000000000000; allowed: <= 2147483647"),
        ("model.num_layers", 100000, "model.num_layers=100000; allowed: <= 1024 (a model size)"),
        ("model.d_model", 10**6, "model.d_model=1000000; allowed: <= 131072 (a model size)"),
        ("env.frozen_lake.size", 10**10, "env.frozen_lake.size=10000000000; allowed: <= 21"),
    ],
)
def test_absurd_integers_are_refused(key, value, message):
    config = frozen_lake.get_config()
    _set(config, key, value)
    assert _refusal(config).startswith(message)


def test_optimizer_step_count_must_fit_int32():
    config = frozen_lake.get_config()
    _set(config, "train.num_steps", 2**30)
    _set(config, "train.epochs", 4)
    assert _refusal(config).startswith(
        "train.num_steps=1073741824 x train.epochs=4 x train.minibatches=1 = 4294967296 "
        "optimizer steps; allowed: at most 2147483647"
    )


def test_memory_check_runs_before_the_model_is_built(monkeypatch):
    # 64 layers take ~10 s to trace; 100k layers hung for minutes before the memory check.
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the memory check")

    monkeypatch.setattr(experiment.nnx, "eval_shape", no_model)
    config = frozen_lake.get_config()
    _set(config, "model.num_layers", 1024)
    _set(config, "mesh.device_memory_gb", 1.0)
    with pytest.raises(ValueError, match=r"does not fit: estimated peak .* > 1.00 GiB"):
        experiment.build(config)


@pytest.mark.parametrize("axes", [("a", "b", "c"), ("data", "data", "tensor"), "data", ()])
def test_mesh_axes_unknown_to_the_sharding_rules_are_refused(axes):
    pattern = r"^mesh.axes=.*; allowed: a tuple of distinct names among \('data', 'fsdp'"
    with pytest.raises(ValueError, match=pattern):
        sharding.check_mesh_shape(axes, (-1, 1, 1)[: len(axes)] if axes else ())
    config = frozen_lake.get_config()
    _set(config, "mesh.axes", ("a", "b", "c"))
    with pytest.raises(ValueError, match=pattern):  # the sweep's device-free check too
        experiment.build(config, check_only=True)
    sharding.check_mesh_shape(("data",), (-1,))  # a subset of the known axes is fine


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "def get_config(arg=None)\n    return None\n",
            "config file '{f}' failed to import: SyntaxError: expected ':' (line 1)",
        ),
        (
            "import no_such_module_here\n",
            "config file '{f}' failed to import: ModuleNotFoundError: No module named "
            "'no_such_module_here'",
        ),
        ("x = 1\n", "config file '{f}' defines no get_config; allowed: a file whose get_config"),
        (
            "def get_config(arg=None):\n    raise RuntimeError('boom')\n",
            "config file '{f}': get_config() raised RuntimeError: boom",
        ),
        (
            "def get_config(arg=None):\n    pass\n",
            "config file '{f}': get_config() returned None; allowed: a file whose get_config",
        ),
        (
            "def get_config(arg=None):\n    return {'a': 1}\n",
            "config file '{f}': get_config() returned a dict; allowed:",
        ),
    ],
)
def test_load_config_file__the_files_own_failure_in_one_line(tmp_path, source, message):
    path = tmp_path / "cfg.py"
    path.write_text(source)
    with pytest.raises(ValueError) as info:
        config_utils.load_config_file(str(path))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(message.format(f=path)), info.value


def test_load_config_file__passes_the_argument():
    config = config_utils.load_config_file(os.path.join(ROOT, "configs/sokoban.py:ppo_gae"))
    assert config.credit.name == "ppo_gae" and config.env.name == "sokoban"
    with pytest.raises(ValueError, match=r"get_config\('x'\) raised ValueError: .*takes no arg"):
        config_utils.load_config_file(os.path.join(ROOT, "configs/base.py:x"))


def test_choices__each_is_what_start_up_checks():
    # Every value --help lists as allowed comes from the check that refuses the others.
    assert config_utils.choices()["credit.name"] == credit.names()
    assert config_utils.choices()["loss.policy"] == losses.names()
    assert set(config_utils.choices()["env.name"]) == set(envs.names()) | {"host"}
    for key in config_utils.choices():
        if key == "sft.keep":  # checked by scripts/sft.py (tests/test_cli_flags.py)
            continue
        config = frozen_lake.get_config()
        _set(config, key, "no_such_choice")
        with pytest.raises((ValueError, KeyError), match=rf"{key}='no_such_choice'"):
            experiment.build(config, check_only=True)


def test_help_text__flags_and_every_key_with_default_and_allowed(monkeypatch):
    monkeypatch.chdir(ROOT)
    text = config_utils.help_text(None)
    assert "config keys of configs/base.py" in text and "--flagfile" in text
    lines = {line.split(" = ")[0].strip(): line for line in text.splitlines() if " = " in line}
    config = config_utils.load_config_file(os.path.join(ROOT, "configs/base.py"))
    assert set(config_utils.leaves(config)) <= set(lines)  # every key listed
    assert lines["optim.lr"] == "  optim.lr = 0.001  (a finite number > 0)"
    assert lines["seed"] == "  seed = 0  (an integer in [0, 4294967295] (a 32-bit seed))"
    assert "(an integer in [0, 1024] (0 = the preset's))" in lines["model.num_layers"]
    assert "or None (None = no clipping)" in lines["loss.value_clip"]
    for key in ("env.name", "credit.name", "loss.policy"):
        assert f"one of {config_utils.choices()[key]}" in lines[key]
    # A file's own config, with its argument.
    text = config_utils.help_text("configs/sokoban.py:ppo_gae")
    assert "config keys of configs/sokoban.py:ppo_gae" in text
    assert "  credit.name = 'ppo_gae'  (one of [" in text
