"""KL penalties and entropy (methods.md sections 7.1-7.3)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

# verl names ("kl", "mse", "low_var_kl") are accepted as aliases.
_KL_ALIASES = {
    "k1": "k1",
    "kl": "k1",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "abs": "abs",
}
KL_KINDS = ("k1", "k2", "k3", "abs", "k1+", "k2+", "k3+", "abs+")


def _kl_forward(logp: jax.Array, logp_ref: jax.Array, kind: str) -> jax.Array:
    if kind == "k1":
        return logp - logp_ref
    if kind == "k2":
        return 0.5 * jnp.square(logp - logp_ref)
    if kind == "abs":
        return jnp.abs(logp - logp_ref)
    d = jnp.clip(logp_ref - logp, -20.0, 20.0)
    return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)


def kl_penalty(logp: jax.Array, logp_ref: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token KL estimator between the policy and a reference (verl `kl_penalty`).

    With `d = logp_ref - logp` on tokens sampled from the policy (Schulman,
    http://joschu.net/blog/kl-approx.html):
      * "k1" (verl "kl"): `-d`; unbiased, high variance, can be negative.
      * "k2" (verl "mse"): `d^2 / 2`.
      * "k3" (verl "low_var_kl"): `exp(d) - d - 1`, `d` clamped to [-20, 20] and the result to
        [-10, 10]; unbiased and non-negative.
      * "abs": `|d|`.
      * suffix "+" (e.g. "k3+"): straight-through, forward value of the base estimator and
        gradient of k2: `k2 - sg(k2) + sg(k_x)`.

    Args:
      logp: f32[...] policy log-probs of the sampled tokens.
      logp_ref: f32[...] reference log-probs (same shape).
      kind: one of `KL_KINDS` (or a verl alias).

    Returns:
      f32[...] per-token penalty; mask and aggregate it with `losses.aggregate`.
    """
    chex.assert_equal_shape([logp, logp_ref])
    straight_through = kind.endswith("+")
    base = _KL_ALIASES.get(kind[:-1] if straight_through else kind)
    if base is None:
        raise ValueError(f"unknown KL estimator {kind!r}; allowed: {list(KL_KINDS)}")
    forward = _kl_forward(logp, logp_ref, base)
    if not straight_through:
        return forward
    backward = _kl_forward(logp, logp_ref, "k2")
    return backward - jax.lax.stop_gradient(backward) + jax.lax.stop_gradient(forward)


def entropy_from_logits(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Entropy of the categorical distribution given by `logits / temperature`.

    `H = -sum_v p_v log p_v` computed from `log_softmax` (stable for large logits); `-inf`
    logits (masked vocabulary entries) contribute 0 with finite gradients.

    Args:
      logits: f32[..., V] unnormalised log-probabilities.
      temperature: sampling temperature the logits are divided by.

    Returns:
      f32[...] entropy in nats.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    finite = jnp.isfinite(logp)
    logp_safe = jnp.where(finite, logp, 0.0)
    p = jnp.where(finite, jnp.exp(logp_safe), 0.0)
    return -jnp.sum(p * logp_safe, axis=-1)


def token_entropy(logits: jax.Array, mask: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Per-token entropy on masked tokens (the input of the entropy bonus, methods.md 7.3).

    The loss term is `-entropy_coeff * aggregate(token_entropy(logits, m), m, agg)`.

    Args:
      logits: f32[B, T, V] policy logits at each slot.
      mask: bool[B, T] action tokens.
      temperature: sampling temperature.

    Returns:
      f32[B, T] entropy on masked tokens, 0 elsewhere.
    """
    chex.assert_rank([logits, mask], [3, 2])
    chex.assert_equal_shape_prefix([logits, mask], 2)
    return entropy_from_logits(logits, temperature) * mask.astype(jnp.float32)
