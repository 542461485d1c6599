"""The shop's vocabulary and state: the clothes pools, the pages' messages, the episode state,
the task hash that decides a task's split class, and the shop's rules (which products match,
the purchase reward, the results page of a search)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
CATEGORIES = ("coat", "dress", "hoodie", "jacket", "jeans", "shirt", "skirt", "sweater")
COLORS = ("black", "blue", "gray", "green", "red", "white")
MATERIALS = ("cotton", "denim", "leather", "linen", "silk", "wool")
SIZES = ("xs", "s", "m", "l", "xl")
PRICES = tuple(range(9, 100, 5))  # dollars; never equal to a limit
LIMITS = tuple(range(20, 101, 10))
ITEM_IDS = tuple(f"b{i:02d}" for i in range(1, 17))
ATTRIBUTES = ("color", "material")
KEYWORDS = CATEGORIES + COLORS + MATERIALS  # what `search` accepts
# Action kinds.
SEARCH, CLICK, SELECT, BACK, BUY = range(5)
# Pages.
HOME, RESULTS, PRODUCT = range(3)
ROW = 7  # fragments per page row ("size:" + 5 sizes + newline is the widest)
HELP = "actions: search <keyword>, click <item id>, select <size>, back, buy\n"
MESSAGES = {
    "newline": "\n",
    "home": "[search]\n",
    "results_for": "results for",
    "price": "price:",
    "size": "size:",
    "selected": "selected:",
    "none": " none",
    "need": "i need a",
    "in_size": " in size",
    "under": " under",
    "dollars": " dollars\n",
    "help": HELP,
    "no_item": "click: no such item on this page\n",
    "no_size": "select: size not available\n",
    "no_product": "open a product first\n",
    "no_search": "search: go back to the search page first\n",
    "bought": "thank you for your purchase\n",
    "invalid": "invalid action; use search, click, select, back or buy\n",
}


# Per-run parameters: `split` 0 train class, 1 test class, 2 either class (ood).
WebShopParams = base.SplitParams


@flax.struct.dataclass
class WebShopState:
    """One episode: the catalogue of N products (sorted by item id), the instruction, the page
    and what the agent did so far."""

    item_id: jax.Array  # int32[N] index into ITEM_IDS, ascending
    category: jax.Array  # int32[N] index into CATEGORIES
    attrs: jax.Array  # int32[N, 2] color (COLORS), material (MATERIALS)
    price: jax.Array  # int32[N] index into PRICES
    sizes: jax.Array  # bool[N, S] sizes the product comes in
    goal_category: jax.Array  # int32[]
    goal_attrs: jax.Array  # int32[2] required color / material, -1 where not required
    goal_size: jax.Array  # int32[] index into SIZES
    goal_limit: jax.Array  # int32[] index into LIMITS
    page: jax.Array  # int32[] HOME, RESULTS or PRODUCT
    query: jax.Array  # int32[] last search keyword (index into KEYWORDS, -1 = none yet)
    product: jax.Array  # int32[] open product's slot (-1 = none)
    selected: jax.Array  # int32[] selected size (-1 = none)
    visited: jax.Array  # bool[N] product pages opened so far
    chose_option: jax.Array  # bool[] the required size was selected on a matching product
    done: jax.Array  # bool[] bought


def int_words(*xs) -> jax.Array:
    """int32[n] the arrays `xs` flattened and concatenated (hash input)."""
    return jnp.concatenate([jnp.ravel(jnp.asarray(x)).astype(jnp.int32) for x in xs])


def task_hash(state: WebShopState) -> jax.Array:
    """uint32[] hash of the catalogue and the instruction (decides the split class)."""
    return text.hash_u32(int_words(*task_fields(state)))


def task_fields(state: WebShopState) -> tuple:
    """The fields of a task's content: the catalogue and the instruction."""
    return (
        state.item_id,
        state.category,
        state.attrs,
        state.price,
        state.sizes,
        state.goal_category,
        state.goal_attrs,
        state.goal_size,
        state.goal_limit,
    )


def matches(state: WebShopState) -> jax.Array:
    """bool[N] products that score reward 1 when bought with the required size selected."""
    attrs_ok = ((state.attrs == state.goal_attrs) | (state.goal_attrs < 0)).all(axis=-1)
    price_ok = jnp.asarray(PRICES)[state.price] < jnp.asarray(LIMITS)[state.goal_limit][..., None]
    size_ok = jnp.take_along_axis(state.sizes, state.goal_size[..., None, None], axis=-1)[..., 0]
    return (state.category == state.goal_category[..., None]) & attrs_ok & price_ok & size_ok


def purchase_reward(state: WebShopState, product: jax.Array, selected: jax.Array) -> jax.Array:
    """f32[] WebShop's reward for buying `product` (slot) with size `selected` (-1 = none).

    r = r_type * (#required attributes matched + 1[selected == required size]
                  + 1[price < limit]) / (#required attributes + 2),  r_type = 1[category].
    """
    required = state.goal_attrs >= 0
    att = (required & (state.attrs[product] == state.goal_attrs)).sum()
    opt = selected == state.goal_size
    price = jnp.asarray(PRICES)[state.price[product]] < jnp.asarray(LIMITS)[state.goal_limit]
    r_type = state.category[product] == state.goal_category
    score = (att + opt + price) / (required.sum() + 2)
    return jnp.where(r_type, score, 0.0).astype(jnp.float32)


def search_results(state: WebShopState, query: jax.Array, max_results: int) -> jax.Array:
    """int32[N] each product's position on the results page of `query`, -1 if not listed.

    Args:
      state: the shop.
      query: int32[] keyword (index into KEYWORDS, -1 = none).
      max_results: R, rows on a results page.

    Products with the keyword (as category, color or material) come first, then the others,
    each by item id (slots are sorted by id); the first R are shown. (WebShop ranks a large
    catalogue by BM25 and always fills its pages; with one keyword a product has it or not.)
    """
    num_categories, num_colors = len(CATEGORIES), len(COLORS)
    fields = jnp.stack(
        [
            state.category,
            state.attrs[:, 0] + num_categories,
            state.attrs[:, 1] + num_categories + num_colors,
        ],
        axis=1,
    )
    score = (fields == query).any(axis=1).astype(jnp.int32)
    n = score.shape[0]
    key = (3 - score) * n + jnp.arange(n)  # ids ascend with slots, so slot order breaks ties
    rank = (key[None, :] < key[:, None]).sum(axis=1)
    return jnp.where(rank < max_results, rank, -1).astype(jnp.int32)
