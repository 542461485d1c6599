"""Pure token sampling: temperature, top-k, top-p (nucleus) and greedy."""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp


def scaled_log_probs(logits: jax.Array, temperature: float) -> jax.Array:
    """log softmax(logits / temperature); the distribution the policy loss optimises.

    Args:
      logits: f32[..., V].
      temperature: > 0.

    Returns:
      f32[..., V] log-probabilities.
    """
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


def token_log_probs(
    head_fn: Callable[[jax.Array], jax.Array],
    hidden: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    chunk: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of each target token and entropy of each predicting distribution.

    With p = softmax(head_fn(h) / temperature) at a slot, returns log p[target] and
    H = -sum_v p_v log p_v. With `chunk` > 0 the slots are taken `chunk` at a time
    (`jax.lax.map` over blocks of the slot axis, each block under `jax.checkpoint`): only one
    block's logits f32[B, chunk, V] is live, and the backward pass recomputes each block's
    logits instead of keeping all of them. Values and gradients equal the unchunked pass up to
    float summation order; blocks keep the batch axis whole, so a batch sharding carries over.

    Args:
      head_fn: hidden states [B, c, D] -> logits f32[B, c, V] (e.g. `Policy.logits`).
      hidden: [B, R, D] hidden states of the predicting slots.
      targets: int32[B, R] the token each slot predicts.
      temperature: > 0 (static).
      chunk: slots per block (static); 0, or >= R, computes all R slots at once.

    Returns:
      (logp f32[B, R], entropy f32[B, R]).
    """
    b, r = targets.shape
    chex.assert_shape(hidden, (b, r, None))

    def block(args):
        h, tgt = args
        logp_all = scaled_log_probs(head_fn(h), temperature)
        logp = jnp.take_along_axis(logp_all, tgt[..., None], axis=-1)[..., 0]
        return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)

    if not chunk or chunk >= r:
        return block((hidden, targets))
    n = -(-r // chunk)
    pad = n * chunk - r
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, hidden.shape[-1])
    tgt = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk)
    # [n, B, chunk, ...]: the map runs over blocks of slots, each block holding every row
    logp, ent = jax.lax.map(
        jax.checkpoint(block, prevent_cse=False), (jnp.moveaxis(h, 1, 0), jnp.moveaxis(tgt, 1, 0))
    )

    def unblock(x):
        return jnp.moveaxis(x, 0, 1).reshape(b, n * chunk)[:, :r]

    return unblock(logp), unblock(ent)


def filter_logits(logits: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Mask logits outside the top-k set and outside the top-p nucleus with -inf.

    Args:
      logits: f32[B, V] (already temperature-scaled).
      top_k: keep the k largest (0 disables).
      top_p: keep the smallest set whose probability reaches top_p (1.0 disables).

    Returns:
      f32[B, V] filtered logits; at least one entry per row stays finite.
    """
    neg = jnp.finfo(jnp.float32).min
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        cum = jnp.cumsum(probs, axis=-1)
        # Keep tokens whose preceding cumulative mass is below top_p (the first always stays).
        keep_sorted = (cum - probs) < top_p
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


def sample(
    key: jax.Array,
    logits: jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool | jax.Array = False,
) -> jax.Array:
    """Sample one token per row.

    Args:
      key: PRNG key.
      logits: f32[B, V] raw logits.
      temperature, top_k, top_p: sampling controls (static).
      greedy: take the argmax instead of sampling: a Python bool (static), or a traced bool[]
        or bool[B] (per row), so one compiled program serves greedy and sampled decoding.

    Returns:
      int32[B] token ids.
    """
    if isinstance(greedy, bool) and greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits.astype(jnp.float32) / temperature
    scaled = filter_logits(scaled, top_k, top_p)
    token = jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
    if isinstance(greedy, bool):
        return token
    chex.assert_rank(greedy, {0, 1})
    return jnp.where(greedy, jnp.argmax(logits, axis=-1).astype(jnp.int32), token)
