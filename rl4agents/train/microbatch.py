"""Minibatches and gradient accumulation: the `epochs` x `minibatches` optax updates of a step.

`minibatch_updates` runs the updates on a prepared `Batch`; with `grad_accum` > 1 each
minibatch's gradient is summed over equal microbatches (`accumulated_grads`), weighted as the
loss's aggregation mode declares (`losses.aggregate.microbatch_weights`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax

from rl4agents import sharding
from rl4agents.losses import aggregate as agg_lib
from rl4agents.train import objective

if TYPE_CHECKING:
    from rl4agents.train.step import StepConfig


def minibatch_updates(
    params: Any, opt_state: Any, batch: objective.Batch, key_perm: jax.Array, cfg: StepConfig
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """`cfg.epochs` passes over `batch`, each one optax update per minibatch of
    `N / cfg.minibatches` rows (a fresh permutation per epoch, `fold_in(key_perm, epoch)`).

    Args:
      params: the policy's parameters (an `nnx.State`).
      opt_state: the optimizer state of `cfg.optimizer`.
      batch: the N rows of `objective.prepare_batch`.
      key_perm: key for the minibatch permutations.
      cfg: static step configuration.

    Returns:
      (params, opt_state, metrics): the updated parameters and optimizer state, and the
      `loss_fn` metrics plus `grad_norm`, each an f32[] mean over the updates.
    """
    b = batch.tokens.shape[0]
    mb = b // cfg.minibatches
    grad_fn = jax.grad(objective.loss_fn, has_aux=True)

    def _update(carry, idx):
        params, opt_state = carry
        minibatch = jax.tree.map(lambda x: x[idx], batch) if cfg.minibatches > 1 else batch
        minibatch = sharding.shard_batch(minibatch, cfg.mesh)
        if cfg.grad_accum > 1:
            grads, metrics = accumulated_grads(grad_fn, params, minibatch, cfg)
        else:
            grads, metrics = grad_fn(params, minibatch, cfg)
        updates, opt_state = cfg.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def _epoch(carry, e):
        if cfg.minibatches > 1:
            perm = jax.random.permutation(jax.random.fold_in(key_perm, e), b)
            order = perm.reshape(cfg.minibatches, mb)
        else:
            order = jnp.zeros((1, 1), jnp.int32)  # unused: the full batch is one minibatch
        return jax.lax.scan(_update, carry, order)

    (params, opt_state), metrics = jax.lax.scan(_epoch, (params, opt_state), jnp.arange(cfg.epochs))
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


def accumulated_grads(grad_fn, params, minibatch: objective.Batch, cfg: StepConfig):
    """Gradient and metrics of a minibatch over `cfg.grad_accum` equal microbatches, one at a
    time (activation memory is that of one microbatch).

    Each microbatch's loss is aggregated on its own; the k results are summed with the weights
    of `aggregate.microbatch_weights`, so the gradient is that of the whole minibatch's loss
    for the four built-in aggregation modes, whatever the number of action tokens or empty
    rows per microbatch (verl weights token-mean by the global token count likewise). Exact
    for the policy, entropy, KL and value terms, which share the policy loss's aggregation over
    action tokens; the ECHO term (a mean over observation tokens) gets the same weights, so it
    is exact only when action and observation tokens are spread alike.
    """
    k = cfg.grad_accum
    micro = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), minibatch)
    weights = agg_lib.microbatch_weights(micro.action_mask, cfg.loss.agg)
    # Loss-valued metrics follow the gradient's weights; the others (clip fractions, KL and
    # value means) are means over tokens, so they take the weights normalised to sum to 1
    # (the same unless the mode is "seq-mean-token-sum-norm", whose weights sum to k).
    mean_weights = weights / jnp.sum(weights)

    def body(acc, xs):
        mb, w, w_mean = xs
        grads, metrics = grad_fn(params, sharding.shard_batch(mb, cfg.mesh), cfg)
        metrics = {
            name: value * (w if name in objective.LOSS_METRICS else w_mean)
            for name, value in metrics.items()
        }
        grads = jax.tree.map(lambda g: w * g, grads)
        return jax.tree.map(jnp.add, acc, (grads, metrics)), None

    zeros = jax.tree.map(
        jnp.zeros_like,
        jax.eval_shape(
            lambda p, b: grad_fn(p, b, cfg), params, jax.tree.map(lambda x: x[0], micro)
        ),
    )
    (grads, metrics), _ = jax.lax.scan(body, zeros, (micro, weights, mean_weights))
    return grads, metrics
