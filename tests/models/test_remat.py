"""rl4agents.models.remat: rematerialisation that XLA's CPU backend does not undo."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents.models import policy as policy_lib
from rl4agents.models import remat


def _layer(w, x):
    h = jnp.tanh(x @ w[0])
    return x + jnp.tanh(h @ w[1]) @ w[2]


def _chain(wrap, layers=6):
    def f(ws, x):
        for w in ws:
            x = wrap(_layer)(w, x)
        return jnp.sum(x**2)

    return f


def _weights(layers=6, d=64, hidden=512):
    keys = jax.random.split(jax.random.key(0), 3 * layers)
    shapes = [(d, hidden), (hidden, hidden), (hidden, d)]
    return [
        tuple(0.05 * jax.random.normal(keys[3 * i + j], s) for j, s in enumerate(shapes))
        for i in range(layers)
    ]


def test_checkpoint__same_value_and_gradient_as_no_remat():
    ws, x = _weights(), jax.random.normal(jax.random.key(1), (256, 64))
    plain = jax.jit(jax.value_and_grad(_chain(lambda f: f), argnums=(0, 1)))(ws, x)
    ours = jax.jit(
        jax.value_and_grad(_chain(lambda f: remat.checkpoint(f, anchored=(1,))), argnums=(0, 1))
    )(ws, x)
    np.testing.assert_allclose(ours[0], plain[0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(plain[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoint__frees_intermediates_where_jax_checkpoint_does_not():
    # Six layers of two [2048, 512] f32 intermediates (4 MiB each): kept, the backward pass
    # needs about 48 MiB; rematerialised, the inputs and one layer's.
    ws, x = _weights(), jnp.ones((2048, 64))

    def temp(wrap):
        compiled = jax.jit(jax.grad(_chain(wrap))).lower(ws, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = temp(lambda f: f)
    ours = temp(lambda f: remat.checkpoint(f, anchored=(1,)))
    assert ours < 0.5 * plain, (ours, plain)
    # Where jax.checkpoint's barrier holds (not XLA's CPU pipeline) it frees them as well.
    if jax.default_backend() == "cpu":
        assert temp(jax.checkpoint) > 0.8 * plain


def test_checkpoint__integer_and_none_inputs_get_no_gradient():
    def f(w, x, idx, nothing):
        assert nothing is None
        return jnp.take(x @ w, idx, axis=0)

    w, x, idx = jnp.ones((3, 3)), jnp.arange(6.0).reshape(2, 3), jnp.array([1, 0])
    g = jax.grad(lambda w, x: jnp.sum(remat.checkpoint(f, anchored=(1,))(w, x, idx, None) ** 2))
    want = jax.grad(lambda w, x: jnp.sum(f(w, x, idx, None) ** 2))
    np.testing.assert_allclose(g(w, x), want(w, x))


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_policy__remat_gradient_equals_the_kept_pass(lora_rank):
    def grads(remat_on):
        cfg = policy_lib.ModelConfig(
            vocab_size=50, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2,
            head_dim=8, d_ff=64, remat=remat_on, attn_chunk=4, lora_rank=lora_rank,
        )  # fmt: skip
        graphdef, params = nnx.split(policy_lib.Decoder(cfg, nnx.Rngs(0)))
        b, t = 2, 10
        tokens = jax.random.randint(jax.random.key(2), (b, t), 0, 50)
        positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))

        def loss(params):
            h, _ = nnx.merge(graphdef, params)(tokens, positions, mask)
            return jnp.sum(jnp.sin(h))

        return jax.jit(jax.value_and_grad(loss))(params)

    (v0, g0), (v1, g1) = grads(False), grads(True)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix", [0, 4], ids=["plain", "shared_prompt"])
@pytest.mark.parametrize("with_rows", [False, True])
def test_policy__scanned_layers_equal_the_unrolled_pass(prefix, with_rows):
    b, t, group = 4, 10, 2
    tokens = jax.random.randint(jax.random.key(3), (b, t), 0, 50)
    if prefix:  # each group of rows shares its first `prefix` tokens
        tokens = tokens.at[1::2, :prefix].set(tokens[0::2, :prefix])
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    rows = jnp.array([[2, 7, 9]] * b) if with_rows else None

    def run(scan):
        cfg = policy_lib.ModelConfig(
            vocab_size=50, d_model=32, num_layers=4, num_heads=4, num_kv_heads=2,
            head_dim=8, d_ff=64, remat=True, scan_layers=scan, attn_chunk=4, lora_rank=4,
        )  # fmt: skip
        graphdef, params = nnx.split(policy_lib.Decoder(cfg, nnx.Rngs(0)))

        def loss(params):
            h, _ = nnx.merge(graphdef, params)(
                tokens, positions, mask, rows=rows, prefix=prefix, group=group
            )
            return jnp.sum(jnp.sin(h)), h

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    ((v0, h0), g0), ((v1, h1), g1) = run(False), run(True)
    np.testing.assert_allclose(h1, h0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b_ in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-5)
