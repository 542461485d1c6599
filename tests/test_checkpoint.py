"""Tests for rl4agents.checkpoint."""

import json
import os
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from rl4agents.checkpoint import Checkpointer

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
