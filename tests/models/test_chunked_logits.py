"""Chunked LM head + log-softmax + entropy (`model.logit_chunk`): the same values and gradients
as the unchunked pass, and less temporary memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base as base_config
from rl4agents.models import policy as policy_lib
from rl4agents.models import sampling
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import resolve, sft

VOCAB = 61


def _reference(hidden, w, targets, temperature):
    """float64 NumPy log p[target] and entropy of softmax(hidden @ w / temperature)."""
    z = np.asarray(hidden, np.float64) @ np.asarray(w, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(logp_all, np.asarray(targets)[..., None], -1)[..., 0]
    return logp, -(np.exp(logp_all) * logp_all).sum(-1)


@pytest.mark.parametrize("chunk", [0, 1, 3, 4, 7, 12])  # 3, 4 divide R = 12; 7 does not
def test_token_log_probs__matches_numpy_reference(chunk):
    b, r, d = 2, 12, 8
    hidden = jax.random.normal(jax.random.key(0), (b, r, d))
    w = 2.0 * jax.random.normal(jax.random.key(1), (d, VOCAB))
    targets = jax.random.randint(jax.random.key(2), (b, r), 0, VOCAB)
    logp, ent = jax.jit(
        lambda h: sampling.token_log_probs(lambda x: x @ w, h, targets, 0.7, chunk)
    )(hidden)
    ref_logp, ref_ent = _reference(hidden, w, targets, 0.7)
    assert logp.dtype == ent.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logp), ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), ref_ent, rtol=1e-5, atol=1e-5)


def test_token_log_probs__one_slot_by_hand():
    """Logits (0, log 3) at temperature 1: p = (1/4, 3/4), so log p[1] = log 3/4 and the
    entropy is log 4 - (3/4) log 3."""
    hidden = jnp.asarray([[[0.0, np.log(3.0)], [0.0, np.log(3.0)]]], jnp.float32)
    logp, ent = sampling.token_log_probs(lambda h: h, hidden, jnp.asarray([[1, 0]]), 1.0, 1)
    np.testing.assert_allclose(np.asarray(logp), [[np.log(0.75), np.log(0.25)]], rtol=1e-6)
    want = np.log(4.0) - 0.75 * np.log(3.0)
    np.testing.assert_allclose(np.asarray(ent), [[want, want]], rtol=1e-6)


def _trajectories(b=4, t=13):
    tokens = jax.random.randint(jax.random.key(3), (b, t), 0, VOCAB)
    valid = (jax.random.uniform(jax.random.key(4), (b, t)) < 0.8).at[:, 0].set(True)
    slots = jnp.broadcast_to(jnp.asarray([1, 2, 4, 5, 6, 8, 9, 11, 12]), (b, 9))
    return tokens, valid, slots


# R = 9 action slots or T = 13 slots: 3 divides R, 4 and 5 divide neither
@pytest.mark.parametrize(
    "chunk, tied, use_slots",
    [(3, False, True), (4, True, True), (4, False, False), (5, True, False)],
)
def test_score__chunked_equals_unchunked_values_and_grads(chunk, tied, use_slots):
    base = policy_lib.make_config(
        "tiny", VOCAB, value_head="shared", tie_embeddings=tied, attn_chunk=0
    )
    graphdef, params = nnx.split(policy_lib.Policy(base, nnx.Rngs(0)))
    chunked, _ = nnx.split(
        policy_lib.Policy(dataclasses.replace(base, logit_chunk=chunk), nnx.Rngs(0))
    )
    tokens, valid, slots = _trajectories()

    def loss(p, gd):
        sc = rollout_lib.score(
            nnx.merge(gd, p), tokens, valid, 0.8, True, slots=slots if use_slots else None
        )
        return jnp.sum(sc.logp) + 0.3 * jnp.sum(sc.entropy) + jnp.sum(sc.values), sc

    def run(gd):
        return jax.jit(jax.value_and_grad(lambda p: loss(p, gd), has_aux=True))(params)

    (l0, sc0), g0 = run(graphdef)
    (l1, sc1), g1 = run(chunked)
    for a, b in ((sc0.logp, sc1.logp), (sc0.entropy, sc1.entropy), (l0, l1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    # the head's gradient sums its slots block by block: float summation order (gradients
    # reach ~3 here)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


def test_score__logit_chunk_zero_is_the_full_logits_pass():
    """logit_chunk = 0 computes the log-softmax of all logits at once: op for op (eager, so no
    compiler reordering) the same numbers as the policy's logits gathered by hand."""
    cfg = policy_lib.make_config("tiny", VOCAB, attn_chunk=0)
    model = policy_lib.Policy(cfg, nnx.Rngs(1))
    tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, VOCAB)
    valid = jnp.ones((2, 6), bool)
    sc = rollout_lib.score(model, tokens, valid, 0.9)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))
    logp_all = sampling.scaled_log_probs(model(tokens, positions, mask).logits, 0.9)
    logp = jnp.take_along_axis(logp_all[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)[:, :-1]
    np.testing.assert_array_equal(np.asarray(sc.logp[:, 1:]), np.asarray(logp))
    np.testing.assert_array_equal(np.asarray(sc.entropy[:, 1:]), np.asarray(ent))


def test_score__chunking_lowers_temporary_memory():
    """XLA's own accounting of the compiled gradient: with a vocabulary large next to the
    model, the [B, T, V] logits and their gradient dominate the temporaries; blocks of 8
    slots keep an eighth of them live."""
    vocab, b, t = 4096, 2, 64
    base = policy_lib.make_config("tiny", vocab, attn_chunk=0)
    tokens = jax.random.randint(jax.random.key(6), (b, t), 0, vocab)
    valid = jnp.ones((b, t), bool)
    temp = {}
    for chunk in (0, 8):
        cfg = dataclasses.replace(base, logit_chunk=chunk)
        graphdef, params = nnx.split(
            nnx.eval_shape(lambda cfg=cfg: policy_lib.Policy(cfg, nnx.Rngs(0)))
        )

        def loss(p, gd=graphdef):
            return rollout_lib.score(nnx.merge(gd, p), tokens, valid).logp.sum()

        stats = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis()
        if stats is None:
            pytest.skip("this backend reports no memory analysis")
        temp[chunk] = stats.temp_size_in_bytes
    logits_bytes = b * t * vocab * 4  # one f32 [B, T, V] tensor: 2 MiB
    assert temp[0] >= 2 * logits_bytes  # the logits and their gradient at least
    assert temp[8] <= temp[0] - 1.5 * logits_bytes, temp


def test_sft_nll__chunked_equals_unchunked():
    """The SFT (and pretraining) loss reads `score`, so `logit_chunk` applies to it too."""
    base = policy_lib.make_config("tiny", VOCAB, attn_chunk=0)
    graphdef, params = nnx.split(policy_lib.Policy(base, nnx.Rngs(2)))
    chunked, _ = nnx.split(policy_lib.Policy(dataclasses.replace(base, logit_chunk=5), nnx.Rngs(2)))
    tokens, valid, _ = _trajectories()
    demos = sft.Demos(
        tokens=tokens,
        valid_mask=valid,
        action_mask=valid.at[:, :3].set(False),
        success=jnp.ones((4,), bool),
        num_turns=jnp.ones((4,), jnp.int32),
        reward=jnp.zeros((4,), jnp.float32),
    )
    (g0, m0), (g1, m1) = (
        jax.jit(jax.grad(lambda p, gd=gd: sft.nll_loss(p, gd, demos), has_aux=True))(params)
        for gd in (graphdef, chunked)
    )
    np.testing.assert_allclose(float(m1["nll"]), float(m0["nll"]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_logit_chunk__config_key_reaches_the_model_and_is_checked():
    c = base_config.get_config()
    assert c.model.logit_chunk == 0
    c.model.logit_chunk = 256
    assert resolve.model_config(c, VOCAB).logit_chunk == 256
    with pytest.raises(ValueError, match=r"model.logit_chunk=-1.*allowed: >= 0"):
        policy_lib.make_config("tiny", VOCAB, logit_chunk=-1)
