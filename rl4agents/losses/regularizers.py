"""KL penalties, entropy, EPO's entropy smoothing and the ECHO environment cross-entropy.

docs/methods.md, "Regularisers and shaping": "KL estimators", "KL in the loss vs in the reward",
"Entropy bonus", "EPO entropy smoothing" and "ECHO".
"""

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
    logp, logp_ref = logp.astype(jnp.float32), logp_ref.astype(jnp.float32)
    straight_through = kind.endswith("+")
    base = _KL_ALIASES.get(kind[:-1] if straight_through else kind)
    if base is None:
        raise ValueError(f"unknown KL estimator {kind!r}; allowed: {list(KL_KINDS)}")
    forward = _kl_forward(logp, logp_ref, base)
    if not straight_through:
        return forward
    backward = _kl_forward(logp, logp_ref, "k2")
    return backward - jax.lax.stop_gradient(backward) + jax.lax.stop_gradient(forward)


def sequence_mean_kl(kl: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The batch's KL as the adaptive controller reads it (verl `apply_kl_penalty`), and the
    number of rows it averages (the controller's `n_steps`).

    The masked mean of each row, then the plain mean over the rows that hold action tokens.
    A verl batch has no other rows (every response has a token); ours can: slots dynamic
    sampling left unfilled, host episodes whose reset failed, and step rows
    (context="window") of turns after an episode ended. Counted as KL 0, they would lower
    the KL the controller reads and raise its `n_steps`.

    Args:
      kl: f32[B, T] per-token KL.
      mask: bool[B, T] action tokens.

    Returns:
      (f32[] the current KL, f32[] the number of rows averaged).
    """
    chex.assert_equal_shape([kl, mask])
    tokens = jnp.sum(mask.astype(jnp.float32), axis=-1)
    per_row = jnp.sum(jnp.where(mask, kl, 0.0), axis=-1) / jnp.maximum(tokens, 1.0)
    rows = (tokens > 0).astype(jnp.float32)
    n = jnp.sum(rows)
    return jnp.sum(per_row * rows) / jnp.maximum(n, 1.0), n


def adaptive_kl_coef(
    coef: jax.Array, current_kl: jax.Array, target: float, n_steps, horizon: float
) -> jax.Array:
    """One update of the adaptive KL coefficient (Ziegler et al. 2019; verl `AdaptiveKLController`).

    `e = clip(KL / target - 1, -0.2, 0.2)`, `beta <- beta * (1 + e * n_steps / horizon)`: beta
    grows while the KL is above the target and shrinks while it is below, by at most 20% of
    `n_steps / horizon` per update. https://arxiv.org/abs/1909.08593

    Args:
      coef: f32[] the current beta.
      current_kl: f32[] the batch's KL (`sequence_mean_kl`).
      target: the KL to hold (verl `target_kl`, 0.1).
      n_steps: sequences in the batch (verl passes the batch size); int or f32[].
      horizon: verl `horizon`, 10000.

    Returns:
      f32[] the next beta.
    """
    error = jnp.clip(current_kl / target - 1.0, -0.2, 0.2)
    return coef * (1.0 + error * n_steps / horizon)


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
    """Per-token entropy on masked tokens (docs/methods.md, "Entropy bonus").

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


def entropy_smoothing_penalty(
    entropy: jax.Array, entropy_avg: jax.Array, *, low: float = 0.8, high: float = 1.2
) -> jax.Array:
    """EPO's entropy smoothing term: how far the batch's entropy left a band around the run's
    recent average (docs/methods.md, "EPO entropy smoothing").

    `P = max(low Hbar - H, 0) + max(H - high Hbar, 0)`: 0 while `H` stays within
    `[low Hbar, high Hbar]`, then growing linearly with the distance to the band, so the
    gradient of `coef P` pulls an entropy that jumps or collapses back towards `Hbar`.
    `Hbar` is a constant (stop-gradient). EPO, arXiv 2509.22576 (its code's band: 0.8, 1.2).

    Args:
      entropy: f32[] the batch's aggregated policy entropy `H` (differentiable).
      entropy_avg: f32[] the running average `Hbar`.
      low: lower end of the band as a fraction of `Hbar`, in [0, 1].
      high: upper end, >= 1.

    Returns:
      f32[] the penalty (>= 0).
    """
    avg = jax.lax.stop_gradient(jnp.asarray(entropy_avg, jnp.float32))
    h = jnp.asarray(entropy, jnp.float32)
    return jnp.maximum(low * avg - h, 0.0) + jnp.maximum(h - high * avg, 0.0)


def running_entropy_avg(state: jax.Array, entropy: jax.Array, decay: float) -> jax.Array:
    """One update of EPO's running entropy average (an exponential moving average).

    `state = [Hbar, n]` (n: steps seen). The first step sets `Hbar = H`; later ones
    `Hbar <- decay Hbar + (1 - decay) H`.

    Args:
      state: f32[2] `[Hbar, n]`.
      entropy: f32[] this step's entropy `H`.
      decay: in [0, 1).

    Returns:
      f32[2] the next `[Hbar, n + 1]`.
    """
    avg, n = state[0], state[1]
    h = jax.lax.stop_gradient(entropy.astype(jnp.float32))
    new = jnp.where(n > 0, decay * avg + (1.0 - decay) * h, h)
    return jnp.stack([new, n + 1.0])


def echo_loss(logp: jax.Array, target_mask: jax.Array) -> jax.Array:
    """ECHO world-model loss: cross-entropy on environment-observation tokens.

    See docs/methods.md, "ECHO".

    `L_env = -sum_{b,t} o logp / max(sum_{b,t} o, 1)` with `o = target_mask`: the mean negative
    log-likelihood of the observation tokens, normalised over all target tokens of the batch
    (independently of the policy term's action-token normalisation). The full objective is
    `L = L_policy + lambda * L_env`, with no IS ratio, clipping or KL on these tokens.
    ECHO https://arxiv.org/abs/2605.24517.

    `logp[b, t]` must be the log-prob of token `t` given the tokens before it, which is what
    `rollout.score` returns per slot, so `target_mask` marks the target tokens themselves (no
    shift). The caller must exclude prompt/system tokens (never targets) and harness "warning"
    tokens: `Trajectory.obs_mask` includes the prompt, so use e.g.
    `traj.obs_mask & (traj.turn_ids >= 0)` (observations that follow an action).

    Args:
      logp: f32[B, T] log-prob of each slot's token under the policy.
      target_mask: bool[B, T] environment-observation target tokens.

    Returns:
      f32[] loss; 0 when `target_mask` is empty. Tokens off the mask contribute nothing, even
      when their `logp` is not finite.
    """
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, target_mask])
    o = target_mask.astype(bool)
    nll = -jnp.sum(jnp.where(o, logp.astype(jnp.float32), 0.0))
    return nll / jnp.maximum(jnp.sum(o.astype(jnp.float32)), 1.0)
