"""Search QA task generation in JAX: random knowledge bases and questions from random bits,
the first qualifying one of the split's class (`base.first_qualifying`), and a fixed
fallback."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.search_qa.world import (
    ATTRIBUTES,
    NAMES,
    POOLS,
    RELATIONS,
    SearchQAState,
    chain,
    task_hash,
)

if TYPE_CHECKING:
    from rl4agents.envs.search_qa.env import SearchQA

_MAX_ROUNDS = 16


def bits_per_candidate(env: SearchQA) -> int:
    e = env.config.num_entities
    return len(NAMES) + e * len(ATTRIBUTES) + e * len(RELATIONS) + 3 + env.config.max_hops - 1


def candidate(env: SearchQA, bits: jax.Array) -> SearchQAState:
    """One random knowledge base and question (may not qualify).

    Args:
      bits: uint32[bits_per_candidate(env)] random bits.

    Returns:
      The candidate state (nothing searched).
    """
    e, h = env.config.num_entities, env.config.max_hops
    na, nr = len(ATTRIBUTES), len(RELATIONS)
    cut = np.cumsum([len(NAMES), e * na, e * nr, 1, 1, 1, h - 1])
    names = jnp.argsort(bits[: cut[0]])[:e].astype(jnp.int32)
    sizes = jnp.asarray([len(pool) for pool in POOLS], jnp.uint32)
    attrs = (bits[cut[0] : cut[1]].reshape(e, na) % sizes).astype(jnp.int32)
    shift = 1 + bits[cut[1] : cut[2]].reshape(e, nr) % (e - 1)  # 1..E-1: never oneself
    rels = ((jnp.arange(e)[:, None] + shift) % e).astype(jnp.int32)
    start = (bits[cut[2]] % e).astype(jnp.int32)
    hops = (
        env.config.min_hops + bits[cut[3]] % (env.config.max_hops - env.config.min_hops + 1)
    ).astype(jnp.int32)
    attr = (bits[cut[4]] % na).astype(jnp.int32)
    path = (bits[cut[5] : cut[6]] % nr).astype(jnp.int32)
    path = jnp.where(jnp.arange(h - 1) < hops - 1, path, -1)
    return SearchQAState(
        names=names,
        attrs=attrs,
        rels=rels,
        start=start,
        path=path,
        attr=attr,
        hops=hops,
        searched=jnp.zeros((e,), bool),
        done=jnp.zeros((), bool),
    )


def generate(env: SearchQA, key: jax.Array, split: jax.Array) -> SearchQAState:
    """First qualifying candidate of the split's class over while_loop rounds."""

    def _qualifies(state):
        people, on = chain(state)
        same = (people[:, None] == people[None, :]) & on[:, None] & on[None, :]
        distinct = same.sum() == on.sum()  # only the diagonal
        return distinct & env.in_split(task_hash(state), split)

    def _candidates(bits):
        states = jax.vmap(functools.partial(candidate, env))(bits)
        return states, jax.vmap(_qualifies)(states)

    return base.first_qualifying(
        key,
        _candidates,
        fallback_state(env),
        num_candidates=env.config.num_candidates,
        bits_per_candidate=bits_per_candidate(env),
        max_rounds=_MAX_ROUNDS,
    )


def fallback_state(env: SearchQA) -> SearchQAState:
    """A fixed task: the first E names, everyone's manager and friend the next person."""
    e, h = env.config.num_entities, env.config.max_hops
    ring = (np.arange(e) + 1) % e
    return SearchQAState(
        names=jnp.arange(e, dtype=jnp.int32),
        attrs=jnp.zeros((e, len(ATTRIBUTES)), jnp.int32),
        rels=jnp.asarray(np.stack([ring] * len(RELATIONS), axis=1), jnp.int32),
        start=jnp.zeros((), jnp.int32),
        path=jnp.where(jnp.arange(h - 1) < env.config.min_hops - 1, 0, -1).astype(jnp.int32),
        attr=jnp.zeros((), jnp.int32),
        hops=jnp.asarray(env.config.min_hops, jnp.int32),
        searched=jnp.zeros((e,), bool),
        done=jnp.zeros((), bool),
    )
