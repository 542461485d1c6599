"""The search QA vocabulary and state: names, attribute pools and relations, the episode
state, the question's chain and answer, and the task hash that decides a task's split class."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
NAMES = (
    "Zeda", "Kovo", "Mirel", "Tasso", "Brin", "Quilo", "Fenna", "Ulma", "Roszi", "Ivek", "Nalda",
    "Pemo", "Soro", "Gavi", "Hesta", "Jorun", "Lide", "Wenca", "Yaro", "Dulf", "Oskel", "Vanta",
    "Relk", "Cimo",
)  # fmt: skip
ATTRIBUTES = ("city", "employer", "born")
ATTRIBUTE_QUESTIONS = ("city", "employer", "birth year")  # how a question names each attribute
POOLS = (
    ("Orvan", "Tellis", "Mazur", "Quenby", "Saltor", "Brevik", "Dunmar", "Ekkla"),
    ("Zentco", "Mirabo", "Klyx", "Obrinex", "Vestal", "Plumaco", "Granix", "Torvo"),
    tuple(str(year) for year in range(1970, 1990)),
)  # values of each attribute
VALUES = tuple(v for pool in POOLS for v in pool)  # every answer, attribute by attribute
OFFSETS = np.cumsum([0] + [len(pool) for pool in POOLS[:-1]]).astype(np.int32)  # into VALUES
RELATIONS = ("manager", "friend")


# Per-run parameters: `split` 0 train class, 1 test class, 2 either class (ood).
SearchQAParams = base.SplitParams


@flax.struct.dataclass
class SearchQAState:
    """One episode: the knowledge base (E people), the question and what was searched.

    H below is the env's `max_hops`; the question's chain is start, then `path[0]` of it, ...
    """

    names: jax.Array  # int32[E] index into NAMES of each person (distinct)
    attrs: jax.Array  # int32[E, 3] index into POOLS[k] of each person's attribute k
    rels: jax.Array  # int32[E, 2] person index of each person's relation r (never itself)
    start: jax.Array  # int32[] person the question starts from
    path: jax.Array  # int32[H - 1] relation of each hop in order, -1 past hops - 1
    attr: jax.Array  # int32[] attribute asked about the last person of the chain
    hops: jax.Array  # int32[] people on the chain (1..H) = searches needed
    searched: jax.Array  # bool[E] people searched so far
    done: jax.Array  # bool[] answered


def chain(state: SearchQAState) -> tuple[jax.Array, jax.Array]:
    """The people the question walks through.

    Args:
      state: a single (unbatched) `SearchQAState`.

    Returns:
      int32[H] person indices (entries past hops - 1 repeat the last person) and bool[H]
      which entries are on the chain.
    """
    people = [state.start]
    for k in range(state.path.shape[0]):
        nxt = state.rels[people[-1], jnp.maximum(state.path[k], 0)]
        people.append(jnp.where(k < state.hops - 1, nxt, people[-1]))
    on = jnp.arange(len(people)) < state.hops
    return jnp.stack(people).astype(jnp.int32), on


def answer_value(state: SearchQAState) -> jax.Array:
    """int32[] index into VALUES of the question's answer."""
    people, _ = chain(state)
    last = people[-1]
    return jnp.asarray(OFFSETS)[state.attr] + state.attrs[last, state.attr]


def task_hash(state: SearchQAState) -> jax.Array:
    """uint32[] hash of the knowledge base and the question (decides the task's class)."""
    return text.hash_u32(task_words(state))


def task_words(state: SearchQAState) -> jax.Array:
    """int32[6 E + H + 2] every field of the knowledge base and question, flattened."""
    return jnp.concatenate(
        [
            jnp.ravel(jnp.asarray(x, jnp.int32))
            for x in (
                state.names,
                state.attrs,
                state.rels,
                state.start,
                state.path,
                state.attr,
                state.hops,
            )
        ]
    )
