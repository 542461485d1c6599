"""Host-side views of a search QA task: the question and a person's facts as text, a readable
rendering, a state from facts, and the oracle's plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs.search_qa.world import (
    ATTRIBUTE_QUESTIONS,
    ATTRIBUTES,
    NAMES,
    POOLS,
    RELATIONS,
    SearchQAState,
)

if TYPE_CHECKING:
    from rl4agents.envs.search_qa.env import SearchQA


def question(state: SearchQAState) -> str:
    """The question as text (host side)."""
    state = jax.device_get(state)
    hops = int(state.hops)
    rels = [RELATIONS[int(r)] for r in np.asarray(state.path)[: hops - 1]]
    words = ["what is the", ATTRIBUTE_QUESTIONS[int(state.attr)]]
    for rel in reversed(rels):
        words += ["of the", rel]
    return " ".join(words + ["of", NAMES[int(state.names[int(state.start)])], "?"])


def facts(state: SearchQAState, person: int) -> str:
    """Person `person`'s facts as the search observation shows them (host side)."""
    state = jax.device_get(state)
    parts = [f"{NAMES[int(state.names[person])]} : "]
    items = [f"{a} {POOLS[k][int(state.attrs[person, k])]}" for k, a in enumerate(ATTRIBUTES)]
    items += [
        f"{rel} {NAMES[int(state.names[int(state.rels[person, r])])]}"
        for r, rel in enumerate(RELATIONS)
    ]
    return parts[0] + " , ".join(items)


def render(env: SearchQA, state: SearchQAState) -> str:
    """The question, then every person's facts, searched ones marked "*" (host side)."""
    state = jax.device_get(state)
    lines = [f"question: {question(state)}"]
    for person in range(env.config.num_entities):
        mark = "*" if bool(state.searched[person]) else " "
        lines.append(f"{mark} {facts(state, person)}")
    if bool(state.done):
        lines.append("done")
    return "\n".join(lines) + "\n"


def state_from_kb(
    env: SearchQA,
    kb: dict[str, dict[str, str]],
    start: str,
    relations: list[str],
    attribute: str,
) -> SearchQAState:
    """Builds a state from facts and a question (nothing searched).

    Args:
      kb: exactly E people, name -> {attribute: value, relation: name} for every attribute
        of ATTRIBUTES and relation of RELATIONS (values from POOLS, names from NAMES).
      start: the person the question starts from.
      relations: the relation of each hop in order (at most max_hops - 1).
      attribute: the attribute asked about the last person.
    """
    if len(kb) != env.config.num_entities or not set(kb) <= set(NAMES):
        raise ValueError(
            f"kb needs {env.config.num_entities} people named from NAMES, got {list(kb)}"
        )
    if len(relations) > env.config.max_hops - 1:
        raise ValueError(f"at most {env.config.max_hops - 1} relations, got {relations}")
    people = list(kb)
    attrs = [[POOLS[k].index(kb[p][a]) for k, a in enumerate(ATTRIBUTES)] for p in people]
    rels = [[people.index(kb[p][r]) for r in RELATIONS] for p in people]
    path = [RELATIONS.index(r) for r in relations]
    path += [-1] * (env.config.max_hops - 1 - len(path))
    return SearchQAState(
        names=jnp.asarray([NAMES.index(p) for p in people], jnp.int32),
        attrs=jnp.asarray(attrs, jnp.int32),
        rels=jnp.asarray(rels, jnp.int32),
        start=jnp.asarray(people.index(start), jnp.int32),
        path=jnp.asarray(path, jnp.int32).reshape(env.config.max_hops - 1),
        attr=jnp.asarray(ATTRIBUTES.index(attribute), jnp.int32),
        hops=jnp.asarray(len(relations) + 1, jnp.int32),
        searched=jnp.zeros((env.config.num_entities,), bool),
        done=jnp.zeros((), bool),
    )


def oracle_actions(env: SearchQA, state: SearchQAState) -> list[int] | None:
    """Search each person on the chain not searched yet, in order, then answer.

    The first action uses only what the agent has observed: the question and the facts of
    people already searched (a person's relation is read from their facts). The rest of the
    plan reads the hidden knowledge base for what those searches will reveal, so closed-loop
    demonstrations (first action each turn) are imitable. Returns [] once done.
    """
    state = jax.device_get(state)
    if bool(state.done):
        return []
    person, plan = int(state.start), []
    path = np.asarray(state.path)
    for hop in range(int(state.hops)):
        if not bool(state.searched[person]):
            plan.append(int(state.names[person]))  # search action id = index into NAMES
        if hop < int(state.hops) - 1:
            person = int(state.rels[person, int(path[hop])])
    attr = int(state.attr)
    return plan + [env.answer_action(POOLS[attr][int(state.attrs[person, attr])])]
