"""The registered `SearchQA` environment: its static tables, `reset`, `step` and the
fragment ids of the question and of a person's facts."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.search_qa import generator, host
from rl4agents.envs.search_qa.world import (
    ATTRIBUTE_QUESTIONS,
    ATTRIBUTES,
    NAMES,
    OFFSETS,
    POOLS,
    RELATIONS,
    VALUES,
    SearchQAParams,
    SearchQAState,
    answer_value,
    chain,
    task_words,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class SearchQAConfig:
    """Static settings (the constructor's arguments; see `SearchQA`), checked when built."""

    num_entities: int = 8
    min_hops: int = 1
    max_hops: int = 3
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    goal_reward: float = 1.0
    test_fraction: float = 0.2
    ood_hops: int = 4
    num_candidates: int = 16

    def __post_init__(self):
        c = self
        base.check_range("num_entities", c.num_entities, 2, len(NAMES))
        if not 1 <= c.min_hops <= c.max_hops <= c.num_entities:
            raise ValueError(
                f"need 1 <= min_hops <= max_hops <= num_entities={c.num_entities} (the chain's "
                f"people are distinct), got min_hops={c.min_hops}, max_hops={c.max_hops}"
            )
        if not 1 <= c.ood_hops <= c.num_entities:
            raise ValueError(
                f"ood_hops must be in [1, num_entities={c.num_entities}], got {c.ood_hops}"
            )
        base.check_shared_settings(c)


@registry.register("search_qa")
class SearchQA(base.TextEnv):
    """Search QA over a generated knowledge base (see the `search_qa` package docstring).

    Attributes:
      config: `SearchQAConfig`, the settings below (E = num_entities, H = max_hops).
      tokenizer: tokenizer the fragments were encoded with.
      max_prompt_len: P, length of the rules and question returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (a person's facts at most).
      max_action_len: longest action in tokens.
      num_actions: len(NAMES) search actions then len(VALUES) answer actions.

    Args (a value out of its range raises ValueError at construction):
      num_entities: people per knowledge base, in [2, len(NAMES)].
      min_hops: fewest hops of a question, in [1, max_hops].
      max_hops: most hops of a question, in [min_hops, num_entities].
      progress_reward: per first search of a person on the question's chain, >= 0 (0 = off).
      invalid_penalty: subtracted on a turn whose action does not parse, >= 0.
      goal_reward: reward for the right answer, >= 0.
      test_fraction: share of tasks in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_hops: hops of the "ood" questions, in [1, num_entities].
      num_candidates: candidate tasks per generation round, >= 1.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        num_entities: int = 8,
        min_hops: int = 1,
        max_hops: int = 3,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        goal_reward: float = 1.0,
        test_fraction: float = 0.2,
        ood_hops: int = 4,
        num_candidates: int = 16,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(SearchQAConfig, locals()), tokenizer)

        actions = [f"search {name}" for name in NAMES] + [f"answer {v}" for v in VALUES]
        self.num_searches = len(NAMES)
        self.num_actions = len(actions)
        self.action_table = text.FragmentTable.build(self.tokenizer, {a: a for a in actions})
        labels = {
            f"label_{name}": (" : " if i == 0 else " , ") + name
            for i, name in enumerate(ATTRIBUTES + RELATIONS)
        }
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                # Names first (fragment id = index into NAMES), then values (len(NAMES) + index
                # into VALUES).
                **{f"name_{name}": f" {name}" for name in NAMES},
                **{f"value_{value}": f" {value}" for value in VALUES},
                **labels,
                **{f"ask_{a}": f" {q}" for a, q in zip(ATTRIBUTES, ATTRIBUTE_QUESTIONS)},
                **{f"rel_{r}": f" {r}" for r in RELATIONS},
                "intro": "use search name to read facts , then answer value\n",
                "what": "what is the",
                "of_the": " of the",
                "of": " of",
                "question_mark": " ?",
                "no_results": " : no results",
                "invalid": "invalid action , allowed: search name or answer value",
                "won": "correct , you won",
                "lost": "wrong , you lost",
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
            },
        )
        length = lambda name: int(self._frags.lengths[self._frags.id(name)])  # noqa: E731
        name_len = int(self._frags.lengths[: len(NAMES)].max())
        value_lens = [
            max(length(f"value_{v}") for v in pool) for pool in POOLS
        ]  # longest value per attribute
        facts = (
            name_len
            + sum(length(f"label_{a}") + n for a, n in zip(ATTRIBUTES, value_lens))
            + sum(length(f"label_{r}") + name_len for r in RELATIONS)
        )
        others = (name_len + length("no_results"), length("invalid"), length("won"), length("lost"))
        self.max_obs_len = max(facts, *others) + length("end")
        hop = length("of_the") + max(length(f"rel_{r}") for r in RELATIONS)
        self.max_prompt_len = (
            length("intro")
            + length("what")
            + max(length(f"ask_{a}") for a in ATTRIBUTES)
            + (max_hops - 1) * hop
            + length("of")
            + name_len
            + length("question_mark")
            + length("end")
        )
        self.max_action_len = int(self.action_table.lengths.max())

    def ood_config(self) -> SearchQAConfig:
        """The "ood" questions: exactly `ood_hops` hops."""
        hops = self.config.ood_hops
        return dataclasses.replace(self.config, min_hops=hops, max_hops=hops)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: SearchQAParams
    ) -> tuple[SearchQAState, jax.Array, jax.Array]:
        """Draws a knowledge base and question of the params' class.

        Returns:
          The state, the rules-and-question obs_tokens int32[P] and obs_len int32[].
        """
        state = generator.generate(self, key, params.split)
        obs, obs_len = text.concat_fragments(
            self._frags, self._question_ids(state), self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: SearchQAState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: SearchQAParams,
    ) -> tuple[SearchQAState, TimeStep]:
        """One turn: parse the action, search or judge the answer, observe.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `SearchQAState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `SearchQAParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        action = text.match_action(self.action_table, action_tokens, action_len)
        is_search = (action >= 0) & (action < self.num_searches)
        is_answer = action >= self.num_searches
        name = jnp.clip(action, 0, self.num_searches - 1)
        hit = state.names == name
        found = is_search & hit.any()
        person = jnp.argmax(hit)
        people, on = chain(state)
        on_chain = jnp.any((people == person) & on)
        first = found & on_chain & ~state.searched[person]
        correct = is_answer & (action - self.num_searches == answer_value(state))
        new_state = state.replace(
            searched=state.searched.at[person].set(state.searched[person] | found),
            done=is_answer,
        )

        valid = action >= 0
        reward = (
            jnp.where(valid, 0.0, -c.invalid_penalty)
            + jnp.where(correct, c.goal_reward, 0.0)
            + jnp.where(first, c.progress_reward, 0.0)
        )
        frag = self._frags.id
        facts = self._facts_ids(state, person)
        width = facts.shape[0]
        message = jnp.select(
            [~valid, is_search, correct],
            [frag("invalid"), frag("no_results"), frag("won")],
            frag("lost"),
        )
        short = jnp.full((width,), -1, jnp.int32).at[1].set(message)
        short = short.at[0].set(jnp.where(is_search, name, -1))  # "Pemo : no results"
        ids = jnp.concatenate(
            [jnp.where(found, facts, short), jnp.asarray([frag("end")], jnp.int32)]
        )
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=is_answer, valid=valid, success=correct
        )

    def anchor(self, state: SearchQAState) -> jax.Array:
        """uint32[] hash of the whole state (knowledge base, question, searched, done)."""
        extra = [jnp.ravel(jnp.asarray(x, jnp.int32)) for x in (state.searched, state.done)]
        return text.hash_u32(jnp.concatenate([task_words(state), *extra]))

    def _facts_ids(self, state: SearchQAState, person: jax.Array) -> jax.Array:
        """int32[2 + 2 * (3 + 2) - 1] fragment ids of "Name : city X , ... , friend Y"."""
        frag = self._frags.id
        ids = [state.names[person]]
        for k, a in enumerate(ATTRIBUTES):
            value = len(NAMES) + OFFSETS[k] + state.attrs[person, k]
            ids += [jnp.asarray(frag(f"label_{a}")), value]
        for r, rel in enumerate(RELATIONS):
            ids += [jnp.asarray(frag(f"label_{rel}")), state.names[state.rels[person, r]]]
        return jnp.stack(ids).astype(jnp.int32)

    def _question_ids(self, state: SearchQAState) -> jax.Array:
        """int32[2 H + 5] fragment ids of the rules and the question (-1 for unused hops)."""
        frag = self._frags.id
        hops = state.path.shape[0]
        ask = jnp.asarray([frag(f"ask_{a}") for a in ATTRIBUTES])[state.attr]
        rel_ids = jnp.asarray([frag(f"rel_{r}") for r in RELATIONS], jnp.int32)
        parts = [jnp.asarray([frag("intro"), frag("what")], jnp.int32), ask[None]]
        for i in range(hops):  # the last hop is named first: "city of the manager of ..."
            k = state.hops - 2 - i
            used = k >= 0
            rel = rel_ids[jnp.maximum(state.path[jnp.maximum(k, 0)], 0)]
            parts.append(jnp.stack([jnp.where(used, frag("of_the"), -1), jnp.where(used, rel, -1)]))
        tail = [frag("of"), state.names[state.start], frag("question_mark"), frag("end")]
        parts.append(jnp.stack([jnp.asarray(x) for x in tail]))
        return jnp.concatenate(parts).astype(jnp.int32)

    def search_action(self, name: str) -> int:
        """Action id of "search name" (name in NAMES)."""
        if name not in NAMES:
            raise ValueError(f"no action 'search {name}'; allowed names: {list(NAMES)}")
        return NAMES.index(name)

    def answer_action(self, value: str) -> int:
        """Action id of "answer value" (value in VALUES: a city, employer or year)."""
        if value not in VALUES:
            raise ValueError(f"no action 'answer {value}'; allowed values: {list(VALUES)}")
        return self.num_searches + VALUES.index(value)

    def action_text(self, action: int) -> str:
        """The string of action id `action`, e.g. "search Zeda" (host side)."""
        return self.action_table.names[action]

    def question(self, state: SearchQAState) -> str:
        """The question as text (host side)."""
        return host.question(state)

    def facts(self, state: SearchQAState, person: int) -> str:
        """Person `person`'s facts as the search observation shows them (host side)."""
        return host.facts(state, person)

    def render(self, state: SearchQAState) -> str:
        """The question, then every person's facts, searched ones marked "*" (host side)."""
        return host.render(self, state)

    def state_from_kb(
        self,
        kb: dict[str, dict[str, str]],
        start: str,
        relations: list[str],
        attribute: str,
    ) -> SearchQAState:
        """A state from facts and a question, nothing searched (see `host.state_from_kb`)."""
        return host.state_from_kb(self, kb, start, relations, attribute)

    def oracle_actions(self, state: SearchQAState) -> list[int] | None:
        """Search each person on the chain not searched yet, then answer (see
        `host.oracle_actions`)."""
        return host.oracle_actions(self, state)
