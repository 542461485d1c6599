"""Web pages as fragment ids: the instruction, product titles, and the search, results and
product pages. Pure functions of one episode; `env` supplies the fragment ids."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.envs.web_shop.world import (
    CATEGORIES,
    COLORS,
    PRODUCT,
    RESULTS,
    ROW,
    SIZES,
    WebShopState,
    search_results,
)

if TYPE_CHECKING:
    from rl4agents.envs.web_shop.env import WebShop


def instruction_ids(env: WebShop, state: WebShopState) -> jax.Array:
    """int32[9] fragment ids of "i need a [color] [material] category in size s under x
    dollars\\n"."""
    f = env._fid
    color, material = state.goal_attrs[0], state.goal_attrs[1]
    return jnp.stack(
        [
            jnp.asarray(f["need"]),
            jnp.where(color >= 0, env._color0 + color, -1),
            jnp.where(material >= 0, env._material0 + material, -1),
            env._category0 + state.goal_category,
            jnp.asarray(f["in_size"]),
            env._size0 + state.goal_size,
            jnp.asarray(f["under"]),
            env._limit0 + state.goal_limit,
            jnp.asarray(f["dollars"]),
        ]
    ).astype(jnp.int32)


def title(env: WebShop, state: WebShopState, slot: jax.Array) -> list[jax.Array]:
    """Fragment ids "[b07] red cotton shirt" of product `slot`."""
    return [
        env._id0 + state.item_id[slot],
        env._color0 + state.attrs[slot, 0],
        env._material0 + state.attrs[slot, 1],
        env._category0 + state.category[slot],
    ]


def row(parts: list) -> jax.Array:
    """int32[ROW] fragment ids `parts` followed by -1."""
    row = jnp.stack([jnp.asarray(p, jnp.int32) for p in parts])
    return jnp.pad(row, (0, ROW - row.shape[0]), constant_values=-1)


def page_ids(env: WebShop, state: WebShopState) -> jax.Array:
    """int32[rows * ROW] fragment ids of the current page (-1 = nothing)."""
    f, nl = env._fid, env._fid["newline"]
    rows = env._page_rows
    # Search page.
    home = jnp.full((rows, ROW), -1, jnp.int32).at[0, 0].set(f["home"])
    # Results page: a header, then the listed products in order.
    position = search_results(state, state.query, env.config.max_results)
    header = row([f["results_for"], keyword_fragment(env, state.query), nl])
    slots = jnp.arange(env.config.num_products)
    listing = jax.vmap(lambda p: row(title(env, state, p) + [env._price0 + state.price[p], nl]))(
        slots
    )
    results = jnp.full((rows, ROW), -1, jnp.int32).at[0].set(header)
    results = results.at[jnp.where(position >= 0, position + 1, rows)].set(listing, mode="drop")
    # Product page.
    p = jnp.maximum(state.product, 0)
    sizes = jnp.where(state.sizes[p], env._size0 + jnp.arange(len(SIZES)), -1)
    chosen = jnp.where(state.selected >= 0, env._size0 + state.selected, f["none"])
    product = jnp.stack(
        [
            row(title(env, state, p) + [nl]),
            row([f["price"], env._price0 + state.price[p], nl]),
            row([f["size"], *sizes, nl]),
            row([f["selected"], chosen, nl]),
        ]
    )
    product = jnp.full((rows, ROW), -1, jnp.int32).at[:4].set(product)
    out = jnp.where(state.page == RESULTS, results, home)
    return jnp.where(state.page == PRODUCT, product, out).ravel()


# ----------------------------------------------------------------------------------------


def keyword_fragment(env: WebShop, keyword: jax.Array) -> jax.Array:
    """int32[] fragment id of search keyword `keyword` (index into KEYWORDS)."""
    num_categories, num_colors = len(CATEGORIES), len(COLORS)
    color, material = keyword - num_categories, keyword - num_categories - num_colors
    return jnp.where(
        keyword < num_categories,
        env._category0 + keyword,
        jnp.where(color < num_colors, env._color0 + color, env._material0 + material),
    )
