"""bf16 compute (`model.dtype="bfloat16"`): f32 master weights, bf16 products that accumulate
in f32, f32 logits, log-softmax, losses and gradients, and log-probs close to f32's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents.models import lora as lora_lib
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import sft

VOCAB = 97


def _split(dtype, **kw):
    cfg = policy_lib.make_config("tiny", VOCAB, dtype=dtype, **kw)
    return nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))


def _batch(b=4, t=32):
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, VOCAB)
    valid = (jax.random.uniform(jax.random.key(2), (b, t)) < 0.9).at[:, 0].set(True)
    return tokens, valid


def _dots(jaxpr):
    """Every dot_general equation of a jaxpr, nested jaxprs included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _dots(inner)


@pytest.mark.parametrize("tied", [False, True])
def test_bf16__master_weights_f32_and_every_product_bf16(tied):
    """With param_dtype float32 every parameter stays f32, while every matmul of the forward
    (projections, attention, MLP, head) multiplies bf16 operands into an f32 result."""
    graphdef, params = _split("bfloat16", tie_embeddings=tied, qkv_bias=True)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    tokens, valid = _batch()
    model_fn = jax.make_jaxpr(
        lambda p: rollout_lib.score(nnx.merge(graphdef, p), tokens, valid).logp
    )
    dots = list(_dots(model_fn(params).jaxpr))
    # per layer: fused q/k/v, two attention products, o, fused gate/up, down; and the head
    assert len(dots) == 2 * 6 + 1
    for eqn in dots:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2, eqn
        assert eqn.outvars[0].aval.dtype == jnp.float32, eqn


@pytest.mark.parametrize("tied", [False, True])
def test_bf16__lora_products_bf16(tied):
    """With LoRA on every projection, every product (the frozen base kernels, both adapter
    factors, attention and the head) still multiplies bf16 operands into an f32 result, while
    the adapters stay f32 master weights."""
    kw = dict(lora_rank=2, lora_alpha=4.0, lora_targets=tuple(lora_lib.ALL_TARGETS))
    graphdef, params = _split("bfloat16", tie_embeddings=tied, qkv_bias=True, **kw)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    tokens, valid = _batch()
    model_fn = jax.make_jaxpr(
        lambda p: rollout_lib.score(nnx.merge(graphdef, p), tokens, valid).logp
    )
    dots = list(_dots(model_fn(params).jaxpr))
    # per layer: the 6 base products as without LoRA, and 2 per adapted projection (7)
    assert len(dots) == 2 * (6 + 2 * 7) + 1
    for eqn in dots:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2, eqn
        assert eqn.outvars[0].aval.dtype == jnp.float32, eqn


def test_bf16__lora_log_probs_close_to_f32():
    """A LoRA model with non-zero adapters scores the same tokens in bf16 within the bf16
    tolerance of its f32 scores (atol 1e-2), and the bf16 scores really differ."""
    kw = dict(lora_rank=2, lora_alpha=4.0, lora_targets=tuple(lora_lib.ALL_TARGETS))
    graphdef32, params = _split("float32", **kw)
    graphdef16, _ = _split("bfloat16", **kw)
    # Non-zero B, so the adapters contribute.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            0.1 * jax.random.normal(jax.random.key(3), x.shape, x.dtype)
            if "lora_b" in jax.tree_util.keystr(path)
            else x
        ),
        params,
    )
    tokens, valid = _batch()
    f32, bf16 = (
        rollout_lib.score(nnx.merge(g, params), tokens, valid) for g in (graphdef32, graphdef16)
    )
    assert bf16.logp.dtype == jnp.float32
    assert float(jnp.abs(f32.logp - bf16.logp).max()) > 0
    np.testing.assert_allclose(np.asarray(bf16.logp), np.asarray(f32.logp), atol=1e-2)


def test_bf16__log_probs_close_to_f32():
    """The same f32 weights scored in both compute dtypes. Measured on this tiny model at its
    initialisation: max |log p difference| 2.2e-3 (mean 5e-4); bf16 tolerance atol 1e-2."""
    graphdef32, params = _split("float32", tie_embeddings=True)
    graphdef16, _ = _split("bfloat16", tie_embeddings=True)
    tokens, valid = _batch()
    scores = [
        jax.jit(lambda p, gd=gd: rollout_lib.score(nnx.merge(gd, p), tokens, valid))(params)
        for gd in (graphdef32, graphdef16)
    ]
    f32, bf16 = scores
    assert bf16.logp.dtype == bf16.entropy.dtype == jnp.float32
    assert float(jnp.abs(f32.logp - bf16.logp).max()) > 0  # bf16 really computed
    np.testing.assert_allclose(np.asarray(bf16.logp), np.asarray(f32.logp), atol=1e-2)
    np.testing.assert_allclose(np.asarray(bf16.entropy), np.asarray(f32.entropy), atol=1e-2)


def test_bf16__loss_and_grads_f32_and_close_to_f32():
    """The SFT loss (a mean NLL) and its gradient are f32 in bf16 compute, and close to the
    f32 model's: bf16 tolerance atol 1e-2 on the loss, 2e-2 relative to the largest gradient
    entry."""
    graphdef32, params = _split("float32")
    graphdef16, _ = _split("bfloat16")
    tokens, valid = _batch()
    demos = sft.Demos(
        tokens=tokens,
        valid_mask=valid,
        action_mask=valid.at[:, :4].set(False),
        success=jnp.ones((4,), bool),
        num_turns=jnp.ones((4,), jnp.int32),
        reward=jnp.zeros((4,), jnp.float32),
    )
    out = [
        jax.jit(jax.value_and_grad(lambda p, gd=gd: sft.nll_loss(p, gd, demos)[0]))(params)
        for gd in (graphdef32, graphdef16)
    ]
    (loss32, grads32), (loss16, grads16) = out
    assert loss16.dtype == jnp.float32
    assert {g.dtype for g in jax.tree.leaves(grads16)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(float(loss16), float(loss32), atol=1e-2)
    for g32, g16 in zip(jax.tree.leaves(grads32), jax.tree.leaves(grads16), strict=True):
        scale = float(jnp.abs(g32).max())
        np.testing.assert_allclose(np.asarray(g16), np.asarray(g32), atol=2e-2 * scale)
