"""Model: presets, value heads, bf16 compute, KV-cache decode equals a full forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents.models import policy as policy_lib


def _inputs(b=2, t=12, vocab=50):
    tokens = jax.random.randint(jax.random.key(0), (b, t), 0, vocab)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    return tokens, positions, mask


def _nonzero_value_proj(params):
    """`params` with 0.05 added to the value projection's kernel, the one [D, 1] parameter
    (it starts at 0, which would make every value 0)."""
    return jax.tree.map(lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, params)


@pytest.mark.parametrize("value_head", ["none", "shared", "separate"])
def test_policy__value_heads(value_head):
    cfg = policy_lib.make_config("tiny", 50, value_head=value_head)
    model = policy_lib.Policy(cfg, nnx.Rngs(0))
    out = model(*_inputs(), with_values=True)
    assert out.logits.shape == (2, 12, 50)
    if value_head == "none":
        assert out.values is None
    else:
        assert out.values.shape == (2, 12) and bool(jnp.all(jnp.isfinite(out.values)))


def test_policy__kv_cache_decode_equals_full_forward():
    cfg = policy_lib.make_config("tiny", 50, qkv_bias=True, qk_norm=True)
    model = policy_lib.Policy(cfg, nnx.Rngs(1))
    tokens, positions, mask = _inputs()
    full = model(tokens, positions, mask).logits
    cache = policy_lib.init_cache(cfg, 2, 12)
    key_valid = jnp.zeros((2, 12), bool)
    outs = []
    for i in range(12):
        key_valid = key_valid.at[:, i].set(True)
        step_mask = key_valid[:, None, :] & (jnp.arange(12) <= i)[None, None, :]
        out = model(tokens[:, i : i + 1], positions[:, i : i + 1], step_mask, cache, i)
        cache = out.cache
        outs.append(out.logits)
    np.testing.assert_allclose(np.concatenate(outs, 1), np.asarray(full), atol=1e-5)


@pytest.mark.parametrize(
    "chunk",
    [pytest.param(1, marks=pytest.mark.slow), 5, 12],  # 5 and 12 leave remainders
)
def test_policy__causal_query_blocks_equal_one_block(chunk):
    """attn_chunk only skips masked scores: logits, values and gradients of valid slots match
    the one-block pass, with padding slots inside the sequence."""
    b, t = 3, 13
    tokens = jax.random.randint(jax.random.key(3), (b, t), 0, 50)
    valid = (jax.random.uniform(jax.random.key(4), (b, t)) < 0.7).at[:, 0].set(True)
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    mask = valid[:, None, :] & jnp.tril(jnp.ones((t, t), bool))[None]
    base = policy_lib.make_config("tiny", 50, value_head="separate", attn_chunk=0)
    graphdef, params = nnx.split(policy_lib.Policy(base, nnx.Rngs(5)))
    params = _nonzero_value_proj(params)
    blocked, _ = nnx.split(
        policy_lib.Policy(dataclasses.replace(base, attn_chunk=chunk), nnx.Rngs(5))
    )

    def loss(p, gd):
        out = nnx.merge(gd, p)(tokens, positions, mask, with_values=True)
        keep = valid[..., None]
        return jnp.sum(jnp.where(keep, out.logits, 0) ** 2) + jnp.sum(
            jnp.where(valid, out.values, 0) ** 2
        ), out

    def grads(gd):  # jitted: op-by-op, a query block of 1 slot dispatches thousands of ops
        return jax.jit(jax.value_and_grad(lambda p: loss(p, gd), has_aux=True))(params)

    (l0, ref), g0 = grads(graphdef)
    (l1, out), g1 = grads(blocked)
    v = np.asarray(valid)
    assert np.abs(np.asarray(ref.values)[v]).max() > 1e-3
    # the value head and the critic trunk get gradients, so their comparison below is not 0 = 0
    for leaf in jax.tree.leaves(g0["value_proj"]) + jax.tree.leaves(g0["critic"]):
        assert np.abs(np.asarray(leaf)).max() > 0
    np.testing.assert_allclose(np.asarray(out.logits)[v], np.asarray(ref.logits)[v], atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.values)[v], np.asarray(ref.values)[v], atol=1e-5)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for a, b_ in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("value_head", ["none", "shared", "separate"])
def test_policy__rows_equal_gathered_full_outputs(value_head):
    """Outputs at `rows` only (the prefill shortcut) equal the full pass gathered there; with a
    cache, every slot's keys and values are still written."""
    cfg = policy_lib.make_config("tiny", 50, value_head=value_head)
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(6)))
    model = nnx.merge(graphdef, _nonzero_value_proj(params))
    tokens, positions, mask = _inputs(b=3, t=12)
    rows = jnp.asarray([[11], [4], [0]], jnp.int32)
    if value_head == "none":  # prefill into a cache longer than the chunk
        cache = policy_lib.init_cache(cfg, 3, 16)
        mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 4)))
        full = model(tokens, positions, mask, cache, 0)
        part = model(tokens, positions, mask, cache, 0, rows=rows)
        for a, b in zip(jax.tree.leaves(part.cache), jax.tree.leaves(full.cache)):
            np.testing.assert_allclose(a, b, atol=1e-6)
    else:
        full = model(tokens, positions, mask, with_values=True)
        part = model(tokens, positions, mask, with_values=True, rows=rows)
        assert part.values.shape == (3, 1)
        assert np.abs(np.asarray(part.values)).max() > 1e-3
        np.testing.assert_allclose(
            part.values, jnp.take_along_axis(full.values, rows, 1), atol=1e-5
        )
    assert part.logits.shape == (3, 1, 50)
    np.testing.assert_allclose(
        part.logits, jnp.take_along_axis(full.logits, rows[..., None], axis=1), atol=1e-5
    )


def test_policy__bad_attn_chunk_fails():
    with pytest.raises(ValueError, match=r"model.attn_chunk=-1.*allowed: >= 0"):
        policy_lib.make_config("tiny", 50, attn_chunk=-1)


def test_policy__bf16_compute_close_to_f32():
    f32 = policy_lib.Policy(policy_lib.make_config("tiny", 50), nnx.Rngs(2))
    bf16 = policy_lib.Policy(policy_lib.make_config("tiny", 50, dtype="bfloat16"), nnx.Rngs(2))
    a = f32(*_inputs()).logits
    b = bf16(*_inputs()).logits
    assert b.dtype == jnp.float32  # logits are always f32
    diff = np.abs(np.asarray(a) - np.asarray(b)).max()
    # bf16 rounding (measured 4.1e-3 here, logits up to 0.49): far above f32 reordering (~1e-7)
    # and below 3x the measurement
    assert 1e-4 < diff < 1.2e-2, diff


def test_policy__tied_embeddings_have_no_lm_head():
    cfg = policy_lib.make_config("tiny", 50, tie_embeddings=True)
    model = policy_lib.Policy(cfg, nnx.Rngs(0))
    assert not hasattr(model, "lm_head")
    assert model(*_inputs()).logits.shape == (2, 12, 50)


def test_presets__sizes_and_bad_names():
    for name in policy_lib.PRESETS:
        cfg = policy_lib.make_config(name, 1000)
        assert cfg.num_heads % cfg.num_kv_heads == 0
    shapes = nnx.eval_shape(
        lambda: policy_lib.Policy(policy_lib.make_config("llama_1b", 128256), nnx.Rngs(0))
    )
    n = policy_lib.count_params(nnx.state(shapes))
    d, layers, vocab, ff, q, kv = 2048, 16, 128256, 8192, 32 * 64, 8 * 64
    per_layer = 2 * d * q + 2 * d * kv + 3 * d * ff + 2 * d  # attention, SwiGLU, two norms
    # tied embeddings, the blocks and the final norm: Llama-3.2-1B's published count
    assert n == vocab * d + layers * per_layer + d == 1_235_814_400
    with pytest.raises(ValueError, match=r"model.preset='nope'; allowed"):
        policy_lib.make_config("nope", 10)
    with pytest.raises(ValueError, match="multiple of"):
        policy_lib.make_config("tiny", 10, num_heads=3)
