"""Logical-axis sharding: rules, mesh equivalence, golden shardings, restore onto other meshes.

The golden file pins the compiled train step's input and output shardings on a (2, 2, 2)
mesh, so a change that silently replicates a large array fails here. After an intended
change, regenerate it with `UPDATE_GOLDEN=1 pytest tests/test_sharding.py -k golden`.
"""

import os
import re

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import PartitionSpec as P

from rl4agents import checkpoint, sharding
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from tests.train.test_train import tiny_config

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "train_step_shardings_2x2x2.txt")
AXES = ("data", "fsdp", "tensor")
# The golden test's build is the (2, 2, 2) mesh test's: built once (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("reuse_builds")


@pytest.fixture(scope="module", autouse=True)
def _no_persistent_cache():
    """Compile this module's programs afresh. On XLA:CPU (jax 0.10.2) the (8, 1, 1) mesh's
    train step, loaded back from the persistent compilation cache (tests/conftest.py), hangs
    in its first all-reduce until XLA aborts the process ("Termination timeout ... Expected 8
    threads to join the rendezvous"); compiled afresh it passes. Reproduce: run
    `pytest -m slow tests/test_sharding.py -k shape0` twice with a warm cache.

    JAX decides once per process whether the cache is used (at its first compile), so the
    flag alone changes nothing once an earlier test module has compiled in this worker:
    `reset_cache` makes it decide again, here and on the way out."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def test_persistent_cache__is_off_in_this_module():
    """The fixture above takes effect even where an earlier module already compiled in this
    worker (the flag alone did not: JAX had decided at its first compile)."""
    from jax._src import compilation_cache as cache_internals

    jax.jit(lambda x: x + 1)(np.float32(1.0))  # a compile in this module
    assert not cache_internals.is_cache_used(jax.extend.backend.get_backend())


def mesh(shape):
    n = int(np.prod(shape))
    return sharding.make_mesh(AXES, shape, devices=jax.devices()[:n])


def ppo_config():
    """PPO with a shared value head (value and policy gradients); one layer, which compiles
    faster: every layer's parameters and activations shard alike."""
    return tiny_config(
        **{"credit.name": "ppo_gae", "model.value_head": "shared", "model.num_layers": 1}
    )


def test_logical_spec__rules_divisibility_and_reuse():
    m = mesh((2, 2, 2))
    assert sharding.logical_spec(("embed", "heads"), (64, 64), m) == P("fsdp", "tensor")
    assert sharding.logical_spec(("vocab", "embed"), (23, 64), m) == P(None, "fsdp")  # 23 % 2
    assert sharding.logical_spec(("batch", None), (8, 5), m) == P(("data", "fsdp"), None)
    # An axis is used once per array: the second "embed" dimension stays replicated.
    assert sharding.logical_spec(("embed", "embed"), (8, 8), m) == P("fsdp", None)
    with pytest.raises(ValueError, match="logical axis 'bogus' has no rule"):
        sharding.logical_spec(("bogus",), (8,), m)
    assert sharding.logical_axes("model/layers/0/attn/q_proj/kernel") == ("embed", "heads")
    assert sharding.logical_axes("opt/0/mu/model/final_norm/scale") == ("norm",)
    with pytest.raises(ValueError, match="no sharding rule for the array at 'x/new_weight'"):
        sharding.tree_shardings({"x": {"new_weight": np.zeros((4, 4))}}, m)


def _two_steps(config, m):
    exp = experiment.build(config, mesh=m)
    state = exp.init_state(jax.random.key(0))
    out = []
    for _ in range(2):
        state, metrics = exp.train_step(state, exp.root_key())
        out.append(jax.device_get(metrics))
    return state, out


@pytest.fixture(scope="module")
def reference():
    config = ppo_config()
    state, metrics = _two_steps(config, mesh((1, 1, 1)))
    return config, jax.device_get(state.params), metrics


SLOW = pytest.mark.slow  # one train-step compile per mesh; (2,2,2) stays in the default suite


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((8, 1, 1), marks=SLOW),
        pytest.param((2, 4, 1), marks=SLOW),
        (2, 2, 2),
        pytest.param((1, 1, 8), marks=SLOW),
    ],
)
def test_meshes__two_steps_match_one_device(reference, shape):
    config, params1, metrics1 = reference
    state, metrics = _two_steps(config, mesh(shape))
    for a, b in zip(metrics, metrics1):
        for key in ("loss", "pg_loss", "value_loss", "reward", "entropy", "grad_norm"):
            # fp32 reductions in a different order across devices.
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # Adam divides by sqrt(v): reduction-order noise in tiny gradients moves a parameter by
    # up to a few 1e-6 after two steps at lr 1e-3 (as in tests/train/test_train.py).
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5),
        jax.device_get(state.params),
        params1,
    )
    if shape[2] > 1:  # tensor parallel: the attention and MLP weights are really split
        (q,) = [
            x
            for path, x in jax.tree_util.tree_leaves_with_path(state.params)
            if sharding.path_str(path) == "model/layers/0/attn/q_proj/kernel"
        ]
        assert q.sharding.spec == P("fsdp" if shape[1] > 1 else None, "tensor")
        assert q.addressable_shards[0].data.shape == (64 // shape[1], 64 // shape[2])


def _golden_lines():
    config = ppo_config()
    exp = experiment.build(config, mesh=mesh((2, 2, 2)))
    compiled = exp.train_step.lower(exp.abstract_state(), exp.root_key()).compile()
    (state_in, key_in), _ = compiled.input_shardings
    state_out, metrics_out = compiled.output_shardings
    shapes = exp.abstract_state()

    def lines(tree):
        return [
            f"{sharding.path_str(path)}: {tuple(leaf.shape)} {sh.spec}"
            for (path, leaf), sh in zip(
                jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(tree)
            )
        ]

    return (
        ["# inputs"] + lines(state_in) + [f"key: {key_in.spec}"]
        + ["# outputs"] + lines(state_out)
        + [f"metrics: {sorted({str(s.spec) for s in jax.tree.leaves(metrics_out)})}"]
    )  # fmt: skip


def test_train_step_shardings__match_the_golden_file():
    got = _golden_lines()
    if os.environ.get("UPDATE_GOLDEN"):
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            f.write("\n".join(got) + "\n")
    with open(GOLDEN) as f:
        want = f.read().splitlines()
    assert got == want, (
        "\n".join(f"got  {g}\nwant {w}" for g, w in zip(got, want) if g != w)
        or f"{len(got)} lines vs {len(want)}"
    )
    # The golden file itself: every parameter of rank 2 is split on this mesh.
    big = [line for line in want if "kernel" in line or "embedding" in line]
    assert big and all("fsdp" in line or "tensor" in line for line in big), big


def test_checkpoint__saved_on_8_devices_restores_on_1_and_on_2x2x2(tmp_path):
    config = tiny_config()
    exp8 = experiment.build(config, mesh=mesh((1, 1, 8)))
    state = exp8.init_state(jax.random.key(1))
    with checkpoint.Checkpointer(
        tmp_path, config_json=exp8.config_json, compat_keys=experiment.COMPAT_KEYS
    ) as ckpt:
        ckpt.save(1, state)
    want = jax.device_get(state)
    for shape in ((1, 1, 1), (2, 2, 2)):
        exp = experiment.build(config, mesh=mesh(shape))
        with checkpoint.Checkpointer(
            tmp_path, config_json=exp.config_json, compat_keys=experiment.COMPAT_KEYS
        ) as ckpt:
            restored = ckpt.restore(1, exp.abstract_state())
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), want)
        got = [x.sharding for x in jax.tree.leaves(restored)]
        assert got == jax.tree.leaves(exp.state_shardings), shape


def test_fsdp_mesh__each_device_computes_its_own_rows():
    # With parameters split along embed over fsdp, XLA may split a product's contraction
    # instead of gathering the weights: every device then computes partial sums over the whole
    # batch. The model pins its hidden states to the batch sharding, so on (1, 8, 1) no matmul
    # of the compiled train step has more rows than one device's share of the episodes' slots.
    config = tiny_config(
        **{
            "mesh.shape": (1, 8, 1),
            "rollout.num_tasks": 8,
            "train.eval_tasks": 16,
            "train.share_prompt": False,  # the shared prompt's pass runs on tasks, not episodes
        }
    )
    exp = experiment.build(config)
    hlo = exp.train_step.lower(exp.abstract_state(), exp.root_key()).compile().as_text()
    gate_up = 2 * exp.model_cfg.d_ff  # the MLP's fused gate/up product: [rows, 2 x d_ff]
    rows = [int(m) for m in re.findall(rf"= f32\[(\d+),{gate_up}\]\{{[^}}]*\}} dot\(", hlo)]
    episodes = config.rollout.num_tasks * config.rollout.group_size
    slots = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout).length
    assert rows and max(rows) <= episodes // 8 * slots, (max(rows), episodes // 8 * slots)
