"""One parameter set per role: R policies stacked on a leading axis, turn k played by set k mod R.

In an environment whose agents take turns (`envs.two_agent`: the guide at even turns, the
walker at odd ones, `agent_of_turn(k) = k mod 2`), the policy can be one shared parameter set
told its role by a prompt, or R role-specific sets, as AT-GRPO trains them (Zhao et al.,
"Stronger Together: On-Policy Reinforcement Learning for Collaborative LLMs", arXiv
2510.11062; reference code pettingllms-ai/PettingLLMs). Here the R sets are one pytree whose
every leaf has a leading axis of R (`stack`); the rollout runs all R sets over the same token
stream (`jax.vmap` over that axis, each set with its own KV cache) and samples turn k from set
`k mod R`, and the update takes each action token's log-prob from the set of its turn
(`role_of_slot`), so set r gets gradient from role r's tokens only. The optimizer state follows
the stacked parameters (AdamW's moments get the same leading axis). The loss stays one
aggregate over the action tokens of every role (e.g. a token mean over all of them) and
gradient clipping takes one global norm over all sets, so set r's update equals a single set's
update on the same batch with the other roles' advantages zeroed.

The swapped-roles control (`swap`) evaluates role r with set (r + 1) mod R: role-specific
policies that specialised fail in each other's seat.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def active(role_params: int) -> bool:
    """Whether `model.role_params` = R asks for stacked sets (R >= 2; 0 and 1 = one set)."""
    return role_params >= 2


def stack(params: Any, num_roles: int) -> Any:
    """R copies of `params` stacked on a new leading axis: every leaf x -> x[None] x R.

    Args:
      params: one parameter set (any pytree of arrays, e.g. an `nnx.State`).
      num_roles: R >= 2.

    Returns:
      The same pytree with leaves of shape [R, *x.shape]; set r is `jax.tree.map(lambda x:
      x[r], stacked)`. All R sets start equal.
    """
    if num_roles < 2:
        raise ValueError(f"model.role_params={num_roles}; allowed: >= 2 to stack role sets")
    return jax.tree.map(lambda x: jnp.stack([x] * num_roles), params)


def unstack(params: Any, role: int) -> Any:
    """Set `role` of stacked parameters: every leaf x -> x[role]."""
    return jax.tree.map(lambda x: x[role], params)


def swap(params: Any, shift: int = 1) -> Any:
    """The swapped-roles control: set r of the result is set (r + shift) mod R of `params`.

    With R = 2 and shift 1 the two sets are exchanged (the guide plays with the walker's set
    and the walker with the guide's).
    """
    return jax.tree.map(lambda x: jnp.roll(x, -shift, axis=0), params)


def role_of_turn(turn: jax.Array, num_roles: int) -> jax.Array:
    """int32: the set acting at turn `turn` (any shape, turn >= 0): `turn mod R`, the
    environment's `agent_of_turn` and the agent of `credit.agent_turn`."""
    return jnp.asarray(turn, jnp.int32) % num_roles


def role_of_slot(turn_ids: jax.Array, num_roles: int) -> jax.Array:
    """int32[B, T]: the set that generated each slot's token, `turn_ids mod R`; 0 on the
    prompt and padding (turn id -1), which no set generated."""
    return jnp.where(turn_ids >= 0, role_of_turn(turn_ids, num_roles), 0)


def pick(per_role: jax.Array, role: jax.Array) -> jax.Array:
    """Each slot's value from its own set: `per_role[role[b, t], b, t]`.

    Args:
      per_role: f32[R, B, T] a value computed by every set.
      role: int32[B, T] in [0, R).

    Returns:
      f32[B, T]. The gradient reaches only the picked entries, so set r learns from the
      slots with role r only.
    """
    return jnp.take_along_axis(per_role, role[None], axis=0)[0]
