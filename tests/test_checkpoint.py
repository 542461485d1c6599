"""Tests for rl4agents.checkpoint."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from rl4agents import checkpoint as checkpoint_lib
from rl4agents.checkpoint import CHECKSUMS_NAME, Checkpointer, CheckpointError

CONFIG = {"model": {"d_model": 64, "num_layers": 2}, "env": {"name": "gsm"}, "lr": 1e-3}
COMPAT = ("model.d_model", "env.name")


@flax.struct.dataclass
class TrainState:
    params: dict
    opt_state: optax.OptState
    step: jax.Array


def _config(**overrides) -> str:
    config = json.loads(json.dumps(CONFIG))
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return json.dumps(config)


def _checkpointer(directory, config_json=None, **kwargs) -> Checkpointer:
    return Checkpointer(
        directory, config_json=config_json or _config(), compat_keys=COMPAT, **kwargs
    )


def _saved(directory, config_json=None, **kwargs) -> None:
    """A checkpoint directory holding one saved step (1) of a small state."""
    with _checkpointer(directory, config_json, **kwargs) as ckpt:
        ckpt.save(1, {"x": jnp.ones(3)})


def _state(scale: float = 1.0) -> TrainState:
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    w = jax.device_put(
        scale * jnp.arange(32, dtype=jnp.float32).reshape(8, 4),
        NamedSharding(mesh, P("data", "model")),
    )
    b = jax.device_put(jnp.ones((4,), jnp.bfloat16), NamedSharding(mesh, P("model")))
    params = {"dense": {"w": w, "b": b}}
    opt = optax.adamw(1e-3)
    opt_state = opt.init(params)
    _, opt_state = opt.update(params, opt_state, params)  # non-zero mu, nu, count
    return TrainState(params=params, opt_state=opt_state, step=jnp.array(7, jnp.int32))


def _assert_tree_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_checkpointer__round_trip_keeps_types_and_shardings(tmp_path):
    state = _state()
    ckpt = _checkpointer(tmp_path)
    assert ckpt.latest_step() is None
    assert ckpt.save(7, state)
    ckpt.wait()
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    restored = ckpt.restore(7, abstract)
    ckpt.close()
    _assert_tree_equal(restored, state)
    assert isinstance(restored, TrainState)
    assert type(restored.opt_state[0]) is type(state.opt_state[0])  # ScaleByAdamState
    assert restored.params["dense"]["w"].sharding == state.params["dense"]["w"].sharding
    assert restored.params["dense"]["b"].sharding.spec == P("model")
    assert json.loads((tmp_path / "config.json").read_text()) == CONFIG


def test_checkpointer__restore_from_concrete_target_and_new_instance(tmp_path):
    state = _state()
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(3, state)
    with _checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 3
        restored = ckpt.restore(None, _state(scale=0.0))
    _assert_tree_equal(restored, state)


@flax.struct.dataclass
class NewerTrainState:
    """TrainState with a field added later (None unless an option uses it)."""

    params: dict
    opt_state: optax.OptState
    step: jax.Array
    extra: Any = None


def test_checkpointer__state_fields_added_later_restore_as_none(tmp_path):
    state = _state()
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(3, state)
    newer = NewerTrainState(params=state.params, opt_state=state.opt_state, step=state.step)
    with _checkpointer(tmp_path) as ckpt:
        restored = ckpt.restore(3, jax.tree.map(jnp.zeros_like, newer))
    assert isinstance(restored, NewerTrainState) and restored.extra is None
    _assert_tree_equal(restored, newer)
    # A field the run did not store but the target needs (not None) is still refused.
    with _checkpointer(tmp_path) as ckpt, pytest.raises(ValueError, match="extra: not in"):
        ckpt.restore(3, newer.replace(extra=jnp.ones(2)))


def test_checkpointer__max_to_keep_and_latest_step(tmp_path):
    state = _state()
    with _checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in range(4):
            ckpt.save(step, state)
        ckpt.wait()
        assert ckpt.latest_step() == 3
        assert ckpt.all_steps() == [2, 3]
    assert sorted(os.listdir(tmp_path)) == ["2", "3", "config.json"]


def test_checkpointer__restore_onto_single_device(tmp_path):
    state = _state()
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        one = SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state
        )
        restored = ckpt.restore(1, abstract)
    _assert_tree_equal(restored, state)
    for leaf in jax.tree.leaves(restored):
        assert leaf.sharding == one


def test_checkpointer__incompatible_config_names_fields_and_writes_nothing(tmp_path):
    _saved(tmp_path)
    before = (tmp_path / "config.json").read_bytes()
    new = _config(model__d_model=128, env__name="alfworld", lr=3e-4)
    with pytest.raises(ValueError) as info:
        _checkpointer(tmp_path, config_json=new)
    message = str(info.value)
    assert "incompatible config" in message and "new workdir" in message
    assert "model.d_model: stored 64, new 128" in message
    assert 'env.name: stored "gsm", new "alfworld"' in message
    assert "lr" not in message.split("differing fields")[1]  # not a compat key
    assert (tmp_path / "config.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["1", "config.json"]


def test_checkpointer__compatible_config_keeps_first_config(tmp_path):
    _saved(tmp_path)
    before = (tmp_path / "config.json").read_bytes()
    _checkpointer(tmp_path, config_json=_config(lr=3e-4)).close()  # lr is not a compat key
    assert (tmp_path / "config.json").read_bytes() == before


def test_checkpointer__missing_compat_key_is_a_mismatch(tmp_path):
    _saved(tmp_path)
    config = json.loads(_config())
    del config["env"]
    with pytest.raises(ValueError, match='env.name: stored "gsm", new <missing>'):
        _checkpointer(tmp_path, config_json=json.dumps(config))


def test_checkpointer__compat_choices_accept_each_listed_value_only(tmp_path):
    """A multi-task checkpoint: env.name accepts every listed environment, nothing else, and
    the other compat keys are still checked."""
    stored = checkpoint_lib.with_compat_choices(_config(), {"env.name": ["gsm", "maze"]})
    _saved(tmp_path, config_json=stored)
    for name in ("gsm", "maze"):
        _checkpointer(tmp_path, config_json=_config(env__name=name)).close()
    with pytest.raises(
        ValueError, match='env.name: stored one of \\["gsm", "maze"\\], new "wordle"'
    ):
        _checkpointer(tmp_path, config_json=_config(env__name="wordle"))
    with pytest.raises(ValueError, match="model.d_model: stored 64, new 128"):
        _checkpointer(tmp_path, config_json=_config(env__name="maze", model__d_model=128))
    with pytest.raises(ValueError, match="allowed: a non-empty list"):
        checkpoint_lib.with_compat_choices(_config(), {"env.name": []})


def test_checkpointer__compat_key_newer_than_the_run_takes_its_default(tmp_path):
    """A run saved before a compat key existed (here loss.ctrl) resumes under the key's
    default value, and is refused, naming the default, under any other."""
    _saved(tmp_path)  # stored config without loss.ctrl
    newer = json.loads(_config())
    newer["loss"] = {"ctrl": "fixed"}

    def open_with(ctrl):
        newer["loss"]["ctrl"] = ctrl
        return Checkpointer(
            tmp_path,
            config_json=json.dumps(newer),
            compat_keys=(*COMPAT, "loss.ctrl"),
            compat_defaults={"loss.ctrl": "fixed"},
        )

    with open_with("fixed") as ckpt:
        assert ckpt.config_diff() == []
    with pytest.raises(ValueError, match='loss.ctrl: stored "fixed", new "adaptive"'):
        open_with("adaptive")
    # Without the default the stored config lacks the key: a mismatch.
    with pytest.raises(ValueError, match='loss.ctrl: stored <missing>, new "fixed"'):
        Checkpointer(
            tmp_path, config_json=_config(loss={"ctrl": "fixed"}), compat_keys=("loss.ctrl",)
        )


def test_checkpointer__wrong_target_names_leaf(tmp_path):
    state = _state()
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        wrong_shape = abstract.replace(
            params={
                "dense": {
                    **abstract.params["dense"],
                    "w": jax.ShapeDtypeStruct((8, 6), jnp.float32),
                }
            }
        )
        with pytest.raises(
            ValueError, match=r"params\.dense\.w: stored shape \(8, 4\), target shape \(8, 6\)"
        ):
            ckpt.restore(1, wrong_shape)
        extra = abstract.replace(
            params={**abstract.params, "head": jax.ShapeDtypeStruct((3,), jnp.float32)}
        )
        with pytest.raises(ValueError, match=r"params\.head: not in checkpoint"):
            ckpt.restore(1, extra)
        with pytest.raises(ValueError, match=r"opt_state\.0\.mu\.dense\.b: not in target"):
            ckpt.restore(1, abstract.replace(opt_state=abstract.opt_state[:0]))
        with pytest.raises(FileNotFoundError):
            ckpt.restore(5, abstract)


def test_checkpointer__wrong_target_names_the_config_fields_that_changed(tmp_path):
    state = _state()
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    wider = abstract.replace(
        params={
            "dense": {**abstract.params["dense"], "w": jax.ShapeDtypeStruct((8, 6), jnp.float32)}
        }
    )
    # A field outside compat_keys (here env.frozen_lake.size) changes the shapes.
    new_config = json.loads(_config())
    new_config["env"]["frozen_lake"] = {"size": 6}
    with _checkpointer(tmp_path, config_json=json.dumps(new_config)) as ckpt:
        assert ckpt.config_diff() == ["  env.frozen_lake.size: stored <missing>, new 6"]
        with pytest.raises(ValueError, match=r"(?s)env.frozen_lake.size: stored <missing>, new 6"):
            ckpt.restore(1, wider)


def test_checkpointer__stored_config_without_a_saved_step_binds_nothing(tmp_path):
    """A run that failed before its first save leaves config.json alone: it neither refuses
    the corrected run nor stays the workdir's config."""
    _checkpointer(tmp_path).close()  # no step saved
    new = _config(model__d_model=128)
    _checkpointer(tmp_path, config_json=new).close()
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(new)


@pytest.mark.parametrize("damage", ["metadata", "item", "array_data"])
def test_checkpointer__damaged_step_is_one_line_naming_the_intact_step(tmp_path, damage):
    """A step whose files were removed from outside (Orbax commits each step atomically) is
    refused in one line that names it and the step to fall back to."""
    state = {"w": jnp.arange(60000.0).reshape(200, 300), "b": jnp.ones(4)}
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        ckpt.save(2, state)
    item = tmp_path / "2" / "default"
    if damage == "metadata":
        (item / "_METADATA").unlink()
    elif damage == "item":
        shutil.rmtree(item)
    else:
        shutil.rmtree(item / "ocdbt.process_0" / "d")
    with _checkpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError) as info:
            ckpt.restore(None, state)
        message = str(info.value)
        assert "\n" not in message and len(message) < 600, message
        assert f"Checkpoint step 2 in {tmp_path} is damaged" in message
        assert f"to resume from step 1, move {tmp_path / '2'} out of the directory" in message
        _assert_tree_equal(ckpt.restore(1, state), state)  # the intact step still restores


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_checkpointer__unreadable_stored_config_names_the_file(tmp_path, text):
    _saved(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'} (is not a JSON|holds no)"):
        _checkpointer(tmp_path)


def _largest_file(directory) -> str:
    files = [os.path.join(root, n) for root, _, names in os.walk(directory) for n in names]
    return max(files, key=os.path.getsize)


def test_checkpointer__checksums_list_every_file_of_a_step(tmp_path):
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"w": jnp.arange(1000.0)})
    step = tmp_path / "1"
    lines = (step / CHECKSUMS_NAME).read_text().splitlines()
    listed = {}
    for line in lines:  # the sha256sum format
        digest, rel = line.split("  ")
        listed[rel] = digest
    files = {
        os.path.relpath(os.path.join(root, n), step)
        for root, _, names in os.walk(step)
        for n in names
        if n != CHECKSUMS_NAME
    }
    assert set(listed) == files and any(rel.startswith("default/") for rel in files)
    for rel, digest in listed.items():
        assert hashlib.sha256((step / rel).read_bytes()).hexdigest() == digest
    assert checkpoint_lib.verify_checksums(step) is None
    assert checkpoint_lib.saved_steps(tmp_path) == [1]


def test_checkpointer__flipped_bytes_are_refused_naming_the_intact_step(tmp_path):
    """Bit rot in a step's largest data file (which Orbax reads back without complaint) is
    caught by the step's checksums, in one line naming the step to resume from."""
    state = {"w": jnp.arange(60000.0).reshape(200, 300), "b": jnp.ones(4)}
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        ckpt.save(2, state)
    data = _largest_file(tmp_path / "2")
    with open(data, "r+b") as f:
        f.seek(os.path.getsize(data) // 2)
        chunk = f.read(64)
        f.seek(-64, os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in chunk))
    with _checkpointer(tmp_path) as ckpt:
        with pytest.raises(ValueError) as info:
            ckpt.restore(None, state)
        message = str(info.value)
        assert "\n" not in message, message
        rel = os.path.relpath(data, tmp_path / "2")
        assert f"Checkpoint step 2 in {tmp_path} is damaged" in message
        assert f"sha256 of {rel} differs from {CHECKSUMS_NAME}" in message
        assert f"to resume from step 1, move {tmp_path / '2'} out of the directory" in message
        _assert_tree_equal(ckpt.restore(1, state), state)


def test_checkpointer__step_without_checksums_restores_unverified(tmp_path):
    """A step saved before checksums existed, or by a run killed while writing them (a
    temporary file left over), still restores."""
    state = {"w": jnp.arange(10.0)}
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
    (tmp_path / "1" / CHECKSUMS_NAME).rename(tmp_path / "1" / f"{CHECKSUMS_NAME}.tmp.123")
    with _checkpointer(tmp_path) as ckpt:
        _assert_tree_equal(ckpt.restore(None, state), state)


def test_checkpointer__kill_between_commit_and_checksums_leaves_a_restorable_run(tmp_path):
    """SIGKILL after Orbax committed step 2 and before its checksums were written (half a
    temporary checksum file on disk): the run resumes from step 2, and its next save is
    checksummed."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        import jax.numpy as jnp
        from rl4agents import checkpoint

        def write_then_die(step_dir):
            if step_dir.endswith(os.sep + "2"):
                with open(os.path.join(step_dir, checkpoint.CHECKSUMS_NAME + ".tmp.1"), "w") as f:
                    f.write("0" * 10)
                os.kill(os.getpid(), signal.SIGKILL)
            return write(step_dir)

        write, checkpoint.write_checksums = checkpoint.write_checksums, write_then_die
        ckpt = checkpoint.Checkpointer(sys.argv[1], config_json="{}", compat_keys=())
        for step in (1, 2):
            ckpt.save(step, {"w": jnp.arange(5.0) + step})
        ckpt.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert not (tmp_path / "2" / CHECKSUMS_NAME).exists()
    with Checkpointer(tmp_path, config_json="{}", compat_keys=()) as ckpt:
        assert ckpt.latest_step() == 2
        _assert_tree_equal(ckpt.restore(None, {"w": jnp.zeros(5)}), {"w": jnp.arange(5.0) + 2})
        ckpt.save(3, {"w": jnp.arange(5.0)})
    assert checkpoint_lib.verify_checksums(tmp_path / "3") is None
    assert (tmp_path / "3" / CHECKSUMS_NAME).exists()


def test_checkpointer__refusals_leave_no_orbax_noise(tmp_path):
    """One line on stderr per refusal, nothing else: a step (without checksums, as saved
    before them) whose manifest.ocdbt is gone fails to read many arrays at once (no "Event
    loop is closed" tracebacks from reads that finish after Orbax closed its event loop), and
    a save that fails in the background (no tracebacks logged by Orbax's threads)."""
    state = {f"w{i}": np.arange(6000.0 + i) for i in range(40)}  # NumPy: nothing to compile
    with _checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        ckpt.save(2, state)
    (tmp_path / "2" / CHECKSUMS_NAME).unlink()
    (tmp_path / "2" / "default" / "manifest.ocdbt").unlink()
    script = textwrap.dedent(
        """
        import sys
        import time
        import numpy as np
        from orbax.checkpoint._src.path import async_path
        from rl4agents.checkpoint import CheckpointError, Checkpointer

        state = {f"w{i}": np.zeros(6000 + i) for i in range(40)}
        with Checkpointer(sys.argv[1], config_json=sys.argv[2], compat_keys=()) as ckpt:
            try:
                ckpt.restore(None, state)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)

        async def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")

        async_path.write_text = full_disk
        ckpt = Checkpointer(sys.argv[3], config_json="{}", compat_keys=())
        try:
            ckpt.save(1, state)
            ckpt.close()
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
        time.sleep(1)  # reports from Orbax's threads may come after the error
        sys.exit(2)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), _config(), str(tmp_path / "full")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 2, out.stderr
    assert lines[0].startswith(f"error: Checkpoint step 2 in {tmp_path} is damaged"), lines
    assert lines[1].startswith("error: checkpoint save of step 1 failed: [Errno 28]"), lines


def _fail_orbax_writes(monkeypatch):
    """Makes Orbax's background metadata writes fail as on a full disk."""
    from orbax.checkpoint._src.path import async_path

    async def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(async_path, "write_text", full_disk)


def test_checkpointer__failed_save_raises_one_line_and_keeps_the_last_good_step(
    tmp_path, monkeypatch
):
    state = {"w": jnp.arange(100.0)}
    ckpt = _checkpointer(tmp_path, max_to_keep=1)
    ckpt.save(6, state)
    ckpt.wait()
    _fail_orbax_writes(monkeypatch)
    with pytest.raises(CheckpointError) as info:
        ckpt.save(8, {"w": jnp.zeros(100)})
        ckpt.wait()  # the save is asynchronous: its failure shows here at the latest
    assert str(info.value) == (
        "checkpoint save of step 8 failed: [Errno 28] No space left on device; "
        f"last good checkpoint: step 6 ({tmp_path / '6'})"
    )
    assert isinstance(info.value, ValueError)
    ckpt.close()  # the failure is reported once; Orbax's threads are released
    monkeypatch.undo()
    assert checkpoint_lib.saved_steps(tmp_path) == [6]
    with _checkpointer(tmp_path) as ckpt:
        _assert_tree_equal(ckpt.restore(None, state), state)


def test_checkpointer__failed_save_is_raised_by_the_next_save(tmp_path, monkeypatch):
    """An asynchronous save that failed in the background stops the next `save` (naming the
    failed step), before that one starts; with no earlier step, none is named as good."""
    ckpt = _checkpointer(tmp_path)
    _fail_orbax_writes(monkeypatch)
    assert ckpt.save(2, {"w": jnp.arange(3.0)})  # started; fails in the background
    with pytest.raises(CheckpointError) as info:
        ckpt.save(4, {"w": jnp.arange(3.0)})
    assert str(info.value) == (
        "checkpoint save of step 2 failed: [Errno 28] No space left on device; "
        f"last good checkpoint: none in {tmp_path}"
    )
    ckpt.close()
    assert checkpoint_lib.saved_steps(tmp_path) == []


def test_params_digest__bit_exact_and_order_free():
    params = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.zeros(3)}
    digest = checkpoint_lib.params_digest(params)
    assert len(digest) == 16 and int(digest, 16) >= 0
    # The same values in another dict order, or as NumPy arrays: the same digest.
    same = {"b": np.zeros(3, np.float32), "w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert checkpoint_lib.params_digest(same) == digest
    # One bit of one value, a dtype, a shape or a name changes it.
    nudged = np.array(params["w"])
    nudged.view(np.uint32)[0, 1] ^= 1  # the last bit of 1.0's mantissa
    assert checkpoint_lib.params_digest({**params, "w": nudged}) != digest
    assert checkpoint_lib.params_digest({**params, "b": jnp.zeros(3, jnp.bfloat16)}) != digest
    assert checkpoint_lib.params_digest({**params, "w": params["w"].reshape(3, 2)}) != digest
    assert checkpoint_lib.params_digest({"w": params["w"], "c": params["b"]}) != digest
