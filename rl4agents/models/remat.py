"""Rematerialisation that holds on every XLA backend: recompute a function in the backward pass.

    from rl4agents.models import remat
    y = remat.checkpoint(f, anchored=(1,))(params, x)   # f(params, x); x's recompute waits

`jax.checkpoint` (and `nnx.remat`, built on it) saves a function's inputs instead of its
intermediates and recomputes the forward pass when the gradient reaches it. It guards the
recomputation with an optimisation barrier so that XLA's common-subexpression elimination does
not merge it with the original forward pass. XLA's CPU pipeline drops those barriers before
it eliminates common subexpressions, so there the recomputation is merged away and every
intermediate stays alive until the backward pass: measured on SmolLM2's blocks (B=16, 440
slots, d=576, LoRA), 0.53 GiB per layer with `jax.checkpoint` and without it alike.

`checkpoint` makes the recomputation depend on the incoming cotangent, which no compiler pass
can hoist above or merge away: the anchored inputs are multiplied by `1 + 0 * g`, where `g` is
one element of the cotangent. For finite `g` that is a multiplication by exactly one (signed
zeros kept), so values and gradients equal those without rematerialisation up to the
re-association XLA may choose when it compiles the recomputation; a non-finite `g` makes the
recomputed inputs NaN, and such a gradient is non-finite anyway. Anchoring the activations
(not the parameters) is enough: everything that depends on them waits for the cotangent, and
parameter-only work (a LoRA adapter's low-rank product) may be shared with the forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


def checkpoint(fn: Callable, anchored: Sequence[int]) -> Callable:
    """`fn` with its intermediates recomputed in the backward pass instead of kept.

    Args:
      fn: a function of positional pytree arguments (arrays; None allowed), returning a pytree
        with at least one floating-point leaf. Integer and boolean inputs get float0
        cotangents, as under `jax.vjp`.
      anchored: indices of the arguments (activations) whose recomputation must wait for the
        cotangent; their floating-point leaves are anchored.

    Returns:
      A function with `fn`'s signature and values whose VJP saves only its inputs.
    """
    anchored = tuple(anchored)

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def fwd(*args):
        return fn(*args), args

    def bwd(args, ct):
        leaves = [x for x in jax.tree.leaves(ct) if jnp.issubdtype(x.dtype, jnp.inexact)]
        if not leaves:
            raise ValueError("remat.checkpoint: fn returned no floating-point output")
        one = 1 + leaves[0].reshape(-1)[0].astype(jnp.float32) * 0

        def anchor(x):
            if x is None or not jnp.issubdtype(x.dtype, jnp.inexact):
                return x
            return x * one.astype(x.dtype)

        args = tuple(jax.tree.map(anchor, a) if i in anchored else a for i, a in enumerate(args))
        _, vjp = jax.vjp(fn, *args)
        return vjp(ct)

    wrapped.defvjp(fwd, bwd)
    return wrapped
