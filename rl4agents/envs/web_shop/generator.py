"""Web shop task generation in JAX: random catalogues and instructions from random bits, the
first usable one of the split's class (`base.first_qualifying`), and a fixed fallback."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.web_shop.world import (
    ATTRIBUTES,
    CATEGORIES,
    COLORS,
    HOME,
    ITEM_IDS,
    LIMITS,
    MATERIALS,
    PRICES,
    SIZES,
    WebShopState,
    matches,
    search_results,
    task_hash,
)

if TYPE_CHECKING:
    from rl4agents.envs.web_shop.env import WebShop

_MAX_ROUNDS = 16


def bits_per_candidate(env: WebShop) -> int:
    n, s = env.config.num_products, len(SIZES)
    return len(ITEM_IDS) + 9 + len(ATTRIBUTES) + s + n * (8 + s)


def candidate(env: WebShop, bits: jax.Array) -> tuple[WebShopState, jax.Array]:
    """One random catalogue and instruction, and bool[] whether the oracle's query lists a
    matching product.

    Args:
      bits: uint32[bits_per_candidate(env)] random bits (one threefry call serves every
        candidate: each random sampler costs compilation time).
    """
    n, num_sizes = env.config.num_products, len(SIZES)
    sizes = [
        (len(ITEM_IDS),),
        (9,),
        (len(ATTRIBUTES),),
        (num_sizes,),
        (n, 3),
        (n, 3),
        (n,),
        (n, num_sizes),
        (n,),
    ]
    offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in sizes])
    parts = [bits[offsets[i] : offsets[i + 1]].reshape(sh) for i, sh in enumerate(sizes)]
    id_score, words, dim_score, target_size_coin = parts[:4]
    copy_coin, fresh, price_bits, size_coin, size_bits = parts[4:]
    half = jnp.uint32(2**31)

    # Item ids: the n top-scoring ids, ascending (ranks by comparison, no sort).
    rank = (id_score[None, :] > id_score[:, None]).sum(axis=1)
    chosen = rank < n
    position = jnp.where(chosen, jnp.cumsum(chosen) - 1, n)
    item_id = jnp.zeros((n + 1,), jnp.int32).at[position].set(jnp.arange(len(ITEM_IDS)))[:n]

    target = (words[0] % n).astype(jnp.int32)
    goal = jnp.stack(
        [words[1] % len(COLORS), words[2] % len(MATERIALS), words[3] % len(CATEGORIES)]
    ).astype(jnp.int32)  # color, material, category
    goal_size = (words[4] % num_sizes).astype(jnp.int32)
    goal_limit = (words[5] % len(LIMITS)).astype(jnp.int32)
    spread = env.config.max_required_attrs - env.config.min_required_attrs + 1
    num_required = env.config.min_required_attrs + (words[6] % spread).astype(jnp.int32)
    dim_rank = (dim_score[None, :] > dim_score[:, None]).sum(axis=1)
    required = dim_rank < num_required
    below = np.array([sum(p < limit for p in PRICES) for limit in LIMITS], np.int32)
    target_price = (words[7] % jnp.asarray(below)[goal_limit]).astype(jnp.int32)

    # Distractors copy each of the target's category, color, material w.p. 1/2.
    pools = jnp.asarray([len(COLORS), len(MATERIALS), len(CATEGORIES)], jnp.uint32)
    fields = jnp.where(copy_coin < half, goal[None, :], (fresh % pools).astype(jnp.int32))
    fields = fields.at[target].set(goal)
    price = (price_bits % len(PRICES)).astype(jnp.int32).at[target].set(target_price)
    has_size = size_coin < half
    fallback = jnp.arange(num_sizes)[None, :] == (size_bits % num_sizes)[:, None]
    has_size = jnp.where(has_size.any(axis=1, keepdims=True), has_size, fallback)
    target_sizes = (target_size_coin < half) | (jnp.arange(num_sizes) == goal_size)
    has_size = has_size.at[target].set(target_sizes)

    state = WebShopState(
        item_id=item_id,
        category=fields[:, 2],
        attrs=fields[:, :2],
        price=price,
        sizes=has_size,
        goal_category=goal[2],
        goal_attrs=jnp.where(required, goal[:2], -1),
        goal_size=goal_size,
        goal_limit=goal_limit,
        **jax.tree.map(jnp.asarray, start_fields(env)),
    )
    listed = search_results(state, oracle_query(state), env.config.max_results) >= 0
    return state, (listed & matches(state)).any()


def oracle_query(state: WebShopState) -> jax.Array:
    """int32[] the oracle's query: the instruction's category (index into KEYWORDS)."""
    return state.goal_category


def start_fields(env: WebShop) -> dict[str, np.ndarray]:
    """The episode-start fields (host arrays): search page, no query, product, selection."""
    return dict(
        page=np.asarray(HOME, np.int32),
        query=np.asarray(-1, np.int32),
        product=np.asarray(-1, np.int32),
        selected=np.asarray(-1, np.int32),
        visited=np.zeros((env.config.num_products,), bool),
        chose_option=np.zeros((), bool),
        done=np.zeros((), bool),
    )


def generate(env: WebShop, key: jax.Array, split: jax.Array) -> WebShopState:
    """First usable candidate of the split's class over while_loop rounds."""

    def _candidates(bits):
        states, usable = jax.vmap(functools.partial(candidate, env))(bits)
        in_class = jax.vmap(lambda s: env.in_split(task_hash(s), split))(states)
        return states, usable & in_class

    return base.first_qualifying(
        key,
        _candidates,
        fallback_state(env),
        num_candidates=env.config.num_candidates,
        bits_per_candidate=bits_per_candidate(env),
        max_rounds=_MAX_ROUNDS,
    )


def fallback_state(env: WebShop) -> WebShopState:
    """A fixed catalogue for the (astronomically rare) case that no candidate qualified."""
    n = env.config.num_products
    lines = [f"{ITEM_IDS[0]} red cotton shirt 24 s,m,l"]
    lines += [f"{ITEM_IDS[i]} blue wool coat 49 m" for i in range(1, n)]
    attrs = " ".join(["red", "cotton"][: env.config.max_required_attrs])
    state = env.state_from_text("\n".join(lines), f"i need a {attrs} shirt in size m under 30")
    return jax.tree.map(jnp.asarray, state)
