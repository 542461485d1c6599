"""Host-side (NumPy) views of a web shop: a state from text, a readable rendering, and the
oracle's plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs.web_shop import generator
from rl4agents.envs.web_shop.world import (
    CATEGORIES,
    COLORS,
    HOME,
    ITEM_IDS,
    KEYWORDS,
    LIMITS,
    MATERIALS,
    PRICES,
    PRODUCT,
    RESULTS,
    SIZES,
    WebShopState,
    matches,
    search_results,
)

if TYPE_CHECKING:
    from rl4agents.envs.web_shop.env import WebShop


def state_from_text(env: WebShop, catalogue: str, instruction: str) -> WebShopState:
    """Builds a state on the search page from text (host side), e.g. for tests.

    Args:
      catalogue: one product per line, "<item id> <color> <material> <category> <price>
        <size>,<size>,...", e.g. "b07 red cotton shirt 24 s,m,l"; `num_products` lines.
      instruction: "i need a [<color>] [<material>] <category> in size <size> under
        <limit>" (an optional trailing "dollars" is ignored).

    Returns:
      The state, products sorted by item id.
    """
    rows = sorted(line.split() for line in catalogue.strip().split("\n"))
    if len(rows) != env.config.num_products or any(len(r) != 6 for r in rows):
        raise ValueError(f"expected {env.config.num_products} lines of 6 fields, got {rows}")
    words = instruction.split()
    words = words[:-1] if words[-1] == "dollars" else words
    if words[:3] != ["i", "need", "a"] or words[-5:-3] != ["in", "size"]:
        raise ValueError(f"instruction {instruction!r} must read 'i need a ... in size ...'")
    described, (size, _, limit) = words[3:-5], words[-3:]
    goal_attrs = [-1, -1]
    for word in described[:-1]:
        dim = 0 if word in COLORS else 1
        goal_attrs[dim] = (COLORS, MATERIALS)[dim].index(word)
    for r in rows:
        for value, pool in zip(r[:4], (ITEM_IDS, COLORS, MATERIALS, CATEGORIES)):
            if value not in pool:
                raise ValueError(f"{value!r} in {r} is not allowed; allowed: {list(pool)}")
    return WebShopState(
        item_id=np.array([ITEM_IDS.index(r[0]) for r in rows], np.int32),
        category=np.array([CATEGORIES.index(r[3]) for r in rows], np.int32),
        attrs=np.array([[COLORS.index(r[1]), MATERIALS.index(r[2])] for r in rows], np.int32),
        price=np.array([PRICES.index(int(r[4])) for r in rows], np.int32),
        sizes=np.array([[s in r[5].split(",") for s in SIZES] for r in rows]),
        goal_category=np.asarray(CATEGORIES.index(described[-1]), np.int32),
        goal_attrs=np.array(goal_attrs, np.int32),
        goal_size=np.asarray(SIZES.index(size), np.int32),
        goal_limit=np.asarray(LIMITS.index(int(limit)), np.int32),
        **generator.start_fields(env),
    )


def instruction_text(s) -> str:
    """The instruction of host state `s` as text."""
    color, material = s.goal_attrs
    words = ["i need a"]
    words += [COLORS[color]] if color >= 0 else []
    words += [MATERIALS[material]] if material >= 0 else []
    words += [CATEGORIES[s.goal_category], "in size", SIZES[s.goal_size]]
    return " ".join(words + ["under", str(LIMITS[s.goal_limit]), "dollars"])


def title_text(s, p: int) -> str:
    """The title "[b07] red cotton shirt" of product slot `p` of host state `s`."""
    attrs = f"{COLORS[s.attrs[p, 0]]} {MATERIALS[s.attrs[p, 1]]}"
    return f"[{ITEM_IDS[s.item_id[p]]}] {attrs} {CATEGORIES[s.category[p]]}"


def render(env: WebShop, state: WebShopState) -> str:
    """The instruction, the page and the whole catalogue, matches marked (host side)."""
    s = jax.tree.map(np.asarray, jax.device_get(state))
    good = np.asarray(matches(jax.tree.map(jnp.asarray, s)))
    query = KEYWORDS[s.query] if s.query >= 0 else ""
    page = ("search", f"results for '{query}'", "product")[int(s.page)]
    if s.page == PRODUCT:
        page += " " + title_text(s, int(s.product))
    selected = SIZES[s.selected] if s.selected >= 0 else "none"
    out = [
        f"instruction: {instruction_text(s)}",
        f"page: {page}  selected: {selected}  done: {bool(s.done)}",
        "catalogue (* = matches):",
    ]
    for p in range(env.config.num_products):
        sizes = ",".join(SIZES[i] for i in np.flatnonzero(s.sizes[p]))
        mark = "*" if good[p] else " "
        out.append(f" {mark} {title_text(s, p)} ${PRICES[s.price[p]]} sizes {sizes}")
    return "\n".join(out) + "\n"


def oracle_actions(env: WebShop, state: WebShopState) -> list[int] | None:
    """A plan of action ids that buys a matching product; its first action is the next one.

    The oracle searches the category (going back to the search page first if needed),
    clicks the first listed
    product whose title and price fit the instruction (skipping those whose page it has
    seen without the required size), goes back if that page lacks the size, else selects
    the size and buys. Its next action only uses what the pages have shown (titles and
    prices of results, sizes of visited products); the rest of the plan assumes what the
    next product pages will show (hidden sizes), so closed-loop demonstrations, which
    take the first action every turn, are imitable.

    Args:
      state: a single (unbatched) state; host or device arrays.

    Returns:
      Action ids; [] once done; None if no listed product fits (never for generated
      catalogues).
    """
    s = jax.tree.map(np.asarray, jax.device_get(state))
    if s.done:
        return []
    goal_query = int(s.goal_category)
    required = s.goal_attrs >= 0
    fits = (
        (s.category == s.goal_category)
        & ((s.attrs == s.goal_attrs) | ~required).all(axis=1)
        & (np.array(PRICES)[s.price] < LIMITS[s.goal_limit])
    )
    has_size = s.sizes[:, s.goal_size]
    page, query, product = int(s.page), int(s.query), int(s.product)
    selected, visited = int(s.selected), s.visited.copy()
    plan = []
    for _ in range(4 * env.config.num_products + 4):
        if page == PRODUCT and fits[product] and has_size[product]:
            if selected != s.goal_size:
                plan.append(env.action_id(f"select {SIZES[s.goal_size]}"))
                selected = int(s.goal_size)
                continue
            return plan + [env.action_id("buy")]
        if page == PRODUCT:
            plan.append(env.action_id("back"))
            page, product, selected = RESULTS, -1, -1
        elif page == RESULTS and query == goal_query:
            position = np.asarray(search_results(s, goal_query, env.config.max_results))
            order = np.argsort(np.where(position >= 0, position, env.config.num_products))
            todo = [
                p
                for p in order
                if position[p] >= 0 and fits[p] and not (visited[p] and not has_size[p])
            ]
            if not todo:
                return None
            product, page, selected = int(todo[0]), PRODUCT, -1
            visited[product] = True
            plan.append(env.action_id(f"click {ITEM_IDS[s.item_id[product]]}"))
        elif page == RESULTS:
            plan.append(env.action_id("back"))
            page = HOME
        else:
            plan.append(env.action_id(f"search {KEYWORDS[goal_query]}"))
            page, query = RESULTS, goal_query
    return None
