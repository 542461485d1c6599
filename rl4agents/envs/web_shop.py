"""A small WebShop: search a generated catalogue, open products, choose a size, buy.

After WebShop (Yao et al., 2022, "WebShop: Towards Scalable Real-World Web Interaction with
Grounded Language Agents", https://arxiv.org/abs/2207.01206). Each episode draws a catalogue of
`num_products` clothes, each with a category (`CATEGORIES`), a color (`COLORS`), a material
(`MATERIALS`), a price (`PRICES`, dollars) and the sizes it comes in (`SIZES`), and an
instruction such as

  i need a red shirt in size m under 30 dollars

with a category, `k` required attributes (color and/or material), a required size and a price
limit. The prompt is the instruction, the list of actions and the search page "[search]".
Actions (one per turn):

  search <keyword>   on the search page; one keyword: a category, color or material (e.g.
                     "search shirt"); shows the results page "results for shirt", then
                     `max_results` rows "[b07] red cotton shirt $24": the products with that
                     keyword first, then the others, each by item id (one keyword keeps the
                     action set small, 43 strings in all)
  click <item id>    open a product listed on the current results page: "[b07] red cotton
                     shirt", "price: $24", "size: s m l", "selected: none"
  select <size>      on a product page, choose one of its sizes
  back               product page -> its results page -> search page
  buy                on a product page: buy it with the selected size; ends the episode

As in WebShop, search is only on the search page (results and product pages offer "back").
Errors (searching off the search page, clicking an item not on the page, selecting a size the
product lacks, buying or selecting off a product page) are ordinary turns: a one-line message,
then the current page.
A string that is no action above over the pools is an invalid action: `invalid_penalty` is
subtracted and the observation says so, then shows the current page.

Reward (on buy; WebShop's `get_reward`, web_agent_site/engine/goal.py):

  r = r_type * (|U_att & Y_att| + |U_opt & Y_opt| + 1[y_price <= u_price])
               / (|U_att| + |U_opt| + 1)

U_att: the required attributes, Y_att: the bought product's attributes; U_opt = {required
size}, Y_opt = {selected size} (no selection matches nothing); u_price: the limit, y_price:
the product's price (prices never equal a limit, so "under" and <= agree). WebShop's type term
r_type scores the overlap of the product names' nouns; here the only noun is the category, so
r_type = 1 if the category matches, else 0.
Success (reward 1) = right category, every required attribute, the required size selected
and the price under the limit.

Process signal (`progress_reward` c > 0): +c the first time the agent opens the page of a
matching product (one that scores 1 with the right size), +c the first time it selects the
required size on such a page.

Generation (pure JAX): item ids are distinct (`ITEM_IDS`) and products are stored by id, so
equal-looking catalogues are equal states. One product (the target) matches the instruction;
every other product copies each of the target's category, color and material with probability
1/2 (else draws it anew), draws any price and a random non-empty set of sizes, so near misses
(wrong price, missing size) are common. `num_candidates` catalogues per round; the first one in
the split's hash class in which a matching product is on the results page of the oracle's
query (the category) is kept (rounds repeat up to `_MAX_ROUNDS`).

Splits: a task is in the test class when `hash_u32(task) % 1000 < test_fraction * 1000`.
"train" and "test" require `min_required_attrs`..`max_required_attrs` attributes (default 1);
"ood" requires `ood_required_attrs` (default 2: both color and material, combinations the
train instructions never ask for), either class.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = ("train", "test", "ood")
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
_MAX_ROUNDS = 16
_ROW = 7  # fragments per page row ("size:" + 5 sizes + newline is the widest)
_HELP = "actions: search <keyword>, click <item id>, select <size>, back, buy\n"
_MESSAGES = {
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
    "help": _HELP,
    "no_item": "click: no such item on this page\n",
    "no_size": "select: size not available\n",
    "no_product": "open a product first\n",
    "no_search": "search: go back to the search page first\n",
    "bought": "thank you for your purchase\n",
    "invalid": "invalid action; use search, click, select, back or buy\n",
}


@flax.struct.dataclass
class WebShopParams:
    """Per-run parameters: which task class `reset` draws."""

    split: jax.Array  # int32[] 0 train class, 1 test class, 2 either class (ood)


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


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed splits: {list(SPLITS)}")
    return SPLITS.index(split)


def _words(*xs) -> jax.Array:
    return jnp.concatenate([jnp.ravel(jnp.asarray(x)).astype(jnp.int32) for x in xs])


def task_hash(state: WebShopState) -> jax.Array:
    """uint32[] hash of the catalogue and the instruction (decides the split class)."""
    return text.hash_u32(_words(*_task_fields(state)))


def _task_fields(state: WebShopState) -> tuple:
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


@registry.register("web_shop")
class WebShop:
    """WebShop-style text environment (see the module docstring).

    Attributes:
      tokenizer: tokenizer the fragments were encoded with.
      num_products: N, products per catalogue.
      max_prompt_len: P, length of the prompt (instruction, actions, search page).
      max_obs_len: O, length of the observation returned by `step` (message + page).
      max_action_len: longest action in tokens.
      num_actions: number of valid action strings.

    Args (a value out of its range raises ValueError at construction):
      num_products: products per catalogue, in [2, len(ITEM_IDS)].
      max_results: rows per results page, in [1, num_products].
      min_required_attrs: fewest required attributes of an instruction, in [1, 2].
      max_required_attrs: most required attributes, in [min_required_attrs, 2].
      ood_required_attrs: required attributes of the "ood" instructions, in [1, 2].
      progress_reward: per first visit of a matching product page and first right size
        selection there, >= 0 (0 = off).
      invalid_penalty: subtracted on a turn whose action does not parse, >= 0.
      test_fraction: share of tasks in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      num_candidates: catalogues per generation round, in [1, 4096].
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        num_products: int = 8,
        max_results: int = 5,
        min_required_attrs: int = 1,
        max_required_attrs: int = 1,
        ood_required_attrs: int = 2,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        test_fraction: float = 0.2,
        num_candidates: int = 16,
        tokenizer: text.Tokenizer | None = None,
    ):
        for name, value, low, high in (
            ("num_products", num_products, 2, len(ITEM_IDS)),
            ("max_results", max_results, 1, num_products),
            ("min_required_attrs", min_required_attrs, 1, len(ATTRIBUTES)),
            ("max_required_attrs", max_required_attrs, min_required_attrs, len(ATTRIBUTES)),
            ("ood_required_attrs", ood_required_attrs, 1, len(ATTRIBUTES)),
            ("num_candidates", num_candidates, 1, 4096),
        ):
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
        base.check_test_fraction(test_fraction)
        base.check_nonnegative("progress_reward", progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", invalid_penalty, " (it is subtracted)")
        self._kwargs = dict(
            num_products=num_products,
            max_results=max_results,
            min_required_attrs=min_required_attrs,
            max_required_attrs=max_required_attrs,
            ood_required_attrs=ood_required_attrs,
            progress_reward=progress_reward,
            invalid_penalty=invalid_penalty,
            test_fraction=test_fraction,
            num_candidates=num_candidates,
            tokenizer=tokenizer,
        )
        self.tokenizer = text.BuiltinTokenizer() if tokenizer is None else tokenizer
        self.num_products = num_products
        self.max_results = max_results
        self.min_required_attrs = min_required_attrs
        self.max_required_attrs = max_required_attrs
        self.ood_required_attrs = ood_required_attrs
        self.progress_reward = progress_reward
        self.invalid_penalty = invalid_penalty
        self.test_threshold = int(round(test_fraction * 1000))
        self.num_candidates = num_candidates

        # One fragment table: the pools, then the messages; `_<pool>0` is a pool's first id.
        pools = {
            "id": [f"[{i}]" for i in ITEM_IDS],
            "category": [f" {c}" for c in CATEGORIES],
            "color": [f" {c}" for c in COLORS],
            "material": [f" {m}" for m in MATERIALS],
            "size": [f" {s}" for s in SIZES],
            "price": [f" ${p}" for p in PRICES],
            "limit": [f" {x}" for x in LIMITS],
        }
        frags = {f"{name}:{i}": s for name, pool in pools.items() for i, s in enumerate(pool)}
        first = np.cumsum([0] + [len(pool) for pool in pools.values()]).tolist()
        self._id0, self._category0, self._color0, self._material0 = first[:4]
        self._size0, self._price0, self._limit0 = first[4:7]
        frags.update(_MESSAGES)
        self._frags = text.FragmentTable.build(self.tokenizer, frags)
        self._fid = {name: self._frags.id(name) for name in _MESSAGES}

        # Every valid action string with its kind and argument.
        actions = [(f"search {word}", SEARCH, i) for i, word in enumerate(KEYWORDS)]
        actions += [(f"click {item}", CLICK, i) for i, item in enumerate(ITEM_IDS)]
        actions += [(f"select {s}", SELECT, i) for i, s in enumerate(SIZES)]
        actions += [("back", BACK, 0), ("buy", BUY, 0)]
        self.actions = tuple(a[0] for a in actions)
        self._actions = text.FragmentTable.build(self.tokenizer, {a: a for a in self.actions})
        self._kind = np.array([a[1] for a in actions], np.int32)
        self._arg = np.array([a[2] for a in actions], np.int32)
        self.num_actions = len(actions)
        self.max_action_len = int(self._actions.lengths.max())

        length = lambda name: int(self._frags.lengths[self._frags.id(name)])  # noqa: E731
        pool_max = lambda prefix, pool: max(  # noqa: E731
            length(f"{prefix}:{i}") for i in range(len(pool))
        )
        cat, col = pool_max("category", CATEGORIES), pool_max("color", COLORS)
        mat, size = pool_max("material", MATERIALS), pool_max("size", SIZES)
        item, price, nl = pool_max("id", ITEM_IDS), pool_max("price", PRICES), length("newline")
        title = item + col + mat + cat + nl
        header = length("results_for") + max(cat, col, mat) + nl
        results = header + max_results * (title + price)
        product = title + length("price") + price + nl
        product += length("size") + len(SIZES) * size + nl
        product += length("selected") + max(size, length("none")) + nl
        page = max(length("home"), results, product)
        messages = ("no_item", "no_size", "no_product", "no_search", "invalid")
        message = max(length(m) for m in messages)
        self.max_obs_len = max(message + page, length("bought"))
        instruction = length("need") + col + mat + cat + length("in_size") + size
        instruction += length("under") + pool_max("limit", LIMITS) + length("dollars")
        self.max_prompt_len = instruction + length("help") + length("home")
        self._page_rows = max(1 + max_results, 4)

    def default_params(self, split: str = "train") -> WebShopParams:
        """Params selecting the task class `split` ("ood": either class)."""
        return WebShopParams(split=jnp.asarray(_split_id(split), jnp.int32))

    def make_split(self, split: str) -> tuple[WebShop, WebShopParams]:
        """(env, params) for "train", "test" or "ood" (a new env whose instructions require
        exactly `ood_required_attrs` attributes)."""
        _split_id(split)
        env = self
        if split == "ood":
            required = self.ood_required_attrs
            ood = {"min_required_attrs": required, "max_required_attrs": required}
            env = WebShop(**{**self._kwargs, **ood, "tokenizer": self.tokenizer})
        return env, env.default_params(split)

    def reset(self, key: jax.Array, params: WebShopParams) -> tuple[WebShopState, TimeStep]:
        """Generates a catalogue and instruction of the params' class; starts on the search page.

        Args:
          key: typed PRNG key.
          params: `WebShopParams`.

        Returns:
          The state and a TimeStep whose obs_tokens int32[P] hold instruction, actions, page.
        """
        state = self._generate(key, params.split)
        ids = jnp.concatenate(
            [self._instruction_ids(state), jnp.asarray([self._fid["help"], self._fid["home"]])]
        )
        obs, obs_len = text.concat_fragments(
            self._frags, ids.astype(jnp.int32), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=jnp.zeros((), jnp.float32),
            done=jnp.zeros((), bool),
            anchor=self.anchor(state),
            valid_action=jnp.ones((), bool),
            success=jnp.zeros((), bool),
        )

    def step(
        self,
        key: jax.Array,
        state: WebShopState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: WebShopParams,
    ) -> tuple[WebShopState, TimeStep]:
        """One turn: parse the action, change page, observe a message and the page.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `WebShopState`.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `WebShopParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O]; absorbing once done.
        """
        del key, params
        state = jax.tree.map(jnp.asarray, state)  # host (numpy) states work eagerly too
        f = self._fid
        action = text.match_action(self._actions, action_tokens, action_len)
        valid = action >= 0
        kind = jnp.where(valid, jnp.asarray(self._kind)[jnp.maximum(action, 0)], -1)
        arg = jnp.asarray(self._arg)[jnp.maximum(action, 0)]
        on_product = state.page == PRODUCT
        search_ok = (kind == SEARCH) & (state.page == HOME)
        product = jnp.maximum(state.product, 0)

        listed = search_results(state, state.query, self.max_results) >= 0
        click_hit = listed & (state.item_id == arg) & (state.page == RESULTS)
        click_ok = (kind == CLICK) & click_hit.any()
        clicked = jnp.argmax(click_hit).astype(jnp.int32)
        select_ok = (kind == SELECT) & on_product & state.sizes[product, arg]
        bought = (kind == BUY) & on_product
        good = matches(state)

        page = jnp.where(search_ok, RESULTS, state.page)
        page = jnp.where(click_ok, PRODUCT, page)
        page = jnp.where(kind == BACK, jnp.maximum(state.page - 1, HOME), page)
        new_product = jnp.where(click_ok, clicked, jnp.where(page == PRODUCT, state.product, -1))
        selected = jnp.where(select_ok, arg, jnp.where(click_ok, -1, state.selected))
        selected = jnp.where(page == PRODUCT, selected, -1)
        query = jnp.where(search_ok, arg, state.query)
        chose = select_ok & (arg == state.goal_size) & good[product]
        new_state = state.replace(
            page=page.astype(jnp.int32),
            query=query,
            product=new_product.astype(jnp.int32),
            selected=selected.astype(jnp.int32),
            visited=state.visited | (click_ok & (jnp.arange(self.num_products) == clicked)),
            chose_option=state.chose_option | chose,
            done=bought,
        )

        message = jnp.where((kind == CLICK) & ~click_ok, f["no_item"], -1)
        message = jnp.where((kind == SEARCH) & ~search_ok, f["no_search"], message)
        message = jnp.where((kind == SELECT) & on_product & ~select_ok, f["no_size"], message)
        off_product = ((kind == SELECT) | (kind == BUY)) & ~on_product
        message = jnp.where(off_product, f["no_product"], message)
        message = jnp.where(valid, message, f["invalid"])
        page_ids = jnp.where(bought, -1, self._page_ids(new_state))
        message = jnp.where(bought, f["bought"], message)
        ids = jnp.concatenate([message[None], page_ids]).astype(jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )

        score = purchase_reward(state, product, state.selected)
        reward = jnp.where(bought, score, 0.0)
        if self.progress_reward:
            first_visit = click_ok & good[clicked] & ~state.visited[clicked]
            first_choice = chose & ~state.chose_option
            reward = reward + self.progress_reward * (
                first_visit.astype(jnp.float32) + first_choice
            )
        reward = jnp.where(valid, reward, -self.invalid_penalty)
        timestep = TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=bought,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=bought & (score == 1.0),
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, timestep))

    def anchor(self, state: WebShopState) -> jax.Array:
        """uint32[] hash of the whole state (task, page, query, product, selection, history)."""
        dynamic = (
            state.page,
            state.query,
            state.product,
            state.selected,
            state.visited,
            state.chose_option,
            state.done,
        )
        return text.hash_u32(_words(*_task_fields(state), *dynamic))

    # ----------------------------------------------------------------------------------------
    def _instruction_ids(self, state: WebShopState) -> jax.Array:
        """int32[9] fragment ids of "i need a [color] [material] category in size s under x
        dollars\\n"."""
        f = self._fid
        color, material = state.goal_attrs[0], state.goal_attrs[1]
        return jnp.stack(
            [
                jnp.asarray(f["need"]),
                jnp.where(color >= 0, self._color0 + color, -1),
                jnp.where(material >= 0, self._material0 + material, -1),
                self._category0 + state.goal_category,
                jnp.asarray(f["in_size"]),
                self._size0 + state.goal_size,
                jnp.asarray(f["under"]),
                self._limit0 + state.goal_limit,
                jnp.asarray(f["dollars"]),
            ]
        ).astype(jnp.int32)

    def _title(self, state: WebShopState, slot: jax.Array) -> list[jax.Array]:
        """Fragment ids "[b07] red cotton shirt" of product `slot`."""
        return [
            self._id0 + state.item_id[slot],
            self._color0 + state.attrs[slot, 0],
            self._material0 + state.attrs[slot, 1],
            self._category0 + state.category[slot],
        ]

    def _row(self, parts: list) -> jax.Array:
        row = jnp.stack([jnp.asarray(p, jnp.int32) for p in parts])
        return jnp.pad(row, (0, _ROW - row.shape[0]), constant_values=-1)

    def _page_ids(self, state: WebShopState) -> jax.Array:
        """int32[rows * _ROW] fragment ids of the current page (-1 = nothing)."""
        f, nl = self._fid, self._fid["newline"]
        rows = self._page_rows
        # Search page.
        home = jnp.full((rows, _ROW), -1, jnp.int32).at[0, 0].set(f["home"])
        # Results page: a header, then the listed products in order.
        position = search_results(state, state.query, self.max_results)
        header = self._row([f["results_for"], self._keyword_fragment(state.query), nl])
        slots = jnp.arange(self.num_products)
        listing = jax.vmap(
            lambda p: self._row(self._title(state, p) + [self._price0 + state.price[p], nl])
        )(slots)
        results = jnp.full((rows, _ROW), -1, jnp.int32).at[0].set(header)
        results = results.at[jnp.where(position >= 0, position + 1, rows)].set(listing, mode="drop")
        # Product page.
        p = jnp.maximum(state.product, 0)
        sizes = jnp.where(state.sizes[p], self._size0 + jnp.arange(len(SIZES)), -1)
        chosen = jnp.where(state.selected >= 0, self._size0 + state.selected, f["none"])
        product = jnp.stack(
            [
                self._row(self._title(state, p) + [nl]),
                self._row([f["price"], self._price0 + state.price[p], nl]),
                self._row([f["size"], *sizes, nl]),
                self._row([f["selected"], chosen, nl]),
            ]
        )
        product = jnp.full((rows, _ROW), -1, jnp.int32).at[:4].set(product)
        out = jnp.where(state.page == RESULTS, results, home)
        return jnp.where(state.page == PRODUCT, product, out).ravel()

    # ----------------------------------------------------------------------------------------
    @property
    def _bits_per_candidate(self) -> int:
        n, s = self.num_products, len(SIZES)
        return len(ITEM_IDS) + 9 + len(ATTRIBUTES) + s + n * (8 + s)

    def _candidate(self, bits: jax.Array) -> tuple[WebShopState, jax.Array]:
        """One random catalogue and instruction, and bool[] whether the oracle's query lists a
        matching product.

        Args:
          bits: uint32[_bits_per_candidate] random bits (one threefry call serves every
            candidate: each random sampler costs compilation time).
        """
        n, num_sizes = self.num_products, len(SIZES)
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
        spread = self.max_required_attrs - self.min_required_attrs + 1
        num_required = self.min_required_attrs + (words[6] % spread).astype(jnp.int32)
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
            **jax.tree.map(jnp.asarray, self._start()),
        )
        listed = search_results(state, self._oracle_query(state), self.max_results) >= 0
        return state, (listed & matches(state)).any()

    def _keyword_fragment(self, keyword: jax.Array) -> jax.Array:
        """int32[] fragment id of search keyword `keyword` (index into KEYWORDS)."""
        num_categories, num_colors = len(CATEGORIES), len(COLORS)
        color, material = keyword - num_categories, keyword - num_categories - num_colors
        return jnp.where(
            keyword < num_categories,
            self._category0 + keyword,
            jnp.where(color < num_colors, self._color0 + color, self._material0 + material),
        )

    def _oracle_query(self, state: WebShopState) -> jax.Array:
        """int32[] the oracle's query: the instruction's category (index into KEYWORDS)."""
        return state.goal_category

    def _start(self) -> dict[str, np.ndarray]:
        """The episode-start fields (host arrays): search page, no query, product, selection."""
        return dict(
            page=np.asarray(HOME, np.int32),
            query=np.asarray(-1, np.int32),
            product=np.asarray(-1, np.int32),
            selected=np.asarray(-1, np.int32),
            visited=np.zeros((self.num_products,), bool),
            chose_option=np.zeros((), bool),
            done=np.zeros((), bool),
        )

    def _generate(self, key: jax.Array, split: jax.Array) -> WebShopState:
        """First usable candidate of the split's class over while_loop rounds."""

        def _candidates(bits):
            states, usable = jax.vmap(self._candidate)(bits)
            in_class = jax.vmap(
                lambda s: base.in_split_class(task_hash(s), self.test_threshold, split)
            )(states)
            return states, usable & in_class

        return base.first_qualifying(
            key,
            _candidates,
            self._fallback_state(),
            num_candidates=self.num_candidates,
            bits_per_candidate=self._bits_per_candidate,
            max_rounds=_MAX_ROUNDS,
        )

    def _fallback_state(self) -> WebShopState:
        """A fixed catalogue for the (astronomically rare) case that no candidate qualified."""
        n = self.num_products
        lines = [f"{ITEM_IDS[0]} red cotton shirt 24 s,m,l"]
        lines += [f"{ITEM_IDS[i]} blue wool coat 49 m" for i in range(1, n)]
        attrs = " ".join(["red", "cotton"][: self.max_required_attrs])
        state = self.state_from_text("\n".join(lines), f"i need a {attrs} shirt in size m under 30")
        return jax.tree.map(jnp.asarray, state)

    # ----------------------------------------------------------------------------------------
    def action_tokens(self, action: int) -> np.ndarray:
        """int32[len] tokens of action id `action` (the action string `actions[action]`)."""
        return self._actions.tokens[action, : self._actions.lengths[action]].copy()

    def action_id(self, action: str) -> int:
        """The action id of an action string such as "click b07" (ValueError if not valid)."""
        try:
            return self.actions.index(action)
        except ValueError:
            raise ValueError(
                f"{action!r} is not a valid action; allowed: search <category, color or "
                "material>, click <item id>, select <size>, back, buy"
            ) from None

    def state_from_text(self, catalogue: str, instruction: str) -> WebShopState:
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
        if len(rows) != self.num_products or any(len(r) != 6 for r in rows):
            raise ValueError(f"expected {self.num_products} lines of 6 fields, got {rows}")
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
            **self._start(),
        )

    def _instruction_text(self, s) -> str:
        color, material = s.goal_attrs
        words = ["i need a"]
        words += [COLORS[color]] if color >= 0 else []
        words += [MATERIALS[material]] if material >= 0 else []
        words += [CATEGORIES[s.goal_category], "in size", SIZES[s.goal_size]]
        return " ".join(words + ["under", str(LIMITS[s.goal_limit]), "dollars"])

    def _title_text(self, s, p: int) -> str:
        attrs = f"{COLORS[s.attrs[p, 0]]} {MATERIALS[s.attrs[p, 1]]}"
        return f"[{ITEM_IDS[s.item_id[p]]}] {attrs} {CATEGORIES[s.category[p]]}"

    def render(self, state: WebShopState) -> str:
        """The instruction, the page and the whole catalogue, matches marked (host side)."""
        s = jax.tree.map(np.asarray, jax.device_get(state))
        good = np.asarray(matches(jax.tree.map(jnp.asarray, s)))
        query = KEYWORDS[s.query] if s.query >= 0 else ""
        page = ("search", f"results for '{query}'", "product")[int(s.page)]
        if s.page == PRODUCT:
            page += " " + self._title_text(s, int(s.product))
        selected = SIZES[s.selected] if s.selected >= 0 else "none"
        out = [
            f"instruction: {self._instruction_text(s)}",
            f"page: {page}  selected: {selected}  done: {bool(s.done)}",
            "catalogue (* = matches):",
        ]
        for p in range(self.num_products):
            sizes = ",".join(SIZES[i] for i in np.flatnonzero(s.sizes[p]))
            mark = "*" if good[p] else " "
            out.append(f" {mark} {self._title_text(s, p)} ${PRICES[s.price[p]]} sizes {sizes}")
        return "\n".join(out) + "\n"

    def oracle_actions(self, state: WebShopState) -> list[int] | None:
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
        for _ in range(4 * self.num_products + 4):
            if page == PRODUCT and fits[product] and has_size[product]:
                if selected != s.goal_size:
                    plan.append(self.action_id(f"select {SIZES[s.goal_size]}"))
                    selected = int(s.goal_size)
                    continue
                return plan + [self.action_id("buy")]
            if page == PRODUCT:
                plan.append(self.action_id("back"))
                page, product, selected = RESULTS, -1, -1
            elif page == RESULTS and query == goal_query:
                position = np.asarray(search_results(s, goal_query, self.max_results))
                order = np.argsort(np.where(position >= 0, position, self.num_products))
                todo = [
                    p
                    for p in order
                    if position[p] >= 0 and fits[p] and not (visited[p] and not has_size[p])
                ]
                if not todo:
                    return None
                product, page, selected = int(todo[0]), PRODUCT, -1
                visited[product] = True
                plan.append(self.action_id(f"click {ITEM_IDS[s.item_id[product]]}"))
            elif page == RESULTS:
                plan.append(self.action_id("back"))
                page = HOME
            else:
                plan.append(self.action_id(f"search {KEYWORDS[goal_query]}"))
                page, query = RESULTS, goal_query
        return None
