"""Multi-hop question answering with a search tool over a generated knowledge base.

Each task is a small knowledge base of `num_entities` people with made-up names (drawn from
`NAMES`), each with three attributes (city, employer, birth year, from fixed pools of made-up
values) and two relations to other people (manager, friend; each person has exactly one of each,
never themselves), and a question that follows a chain of relations from a start person, e.g.

  "what is the city of the manager of the friend of Zeda ?"  (3 hops: Zeda, her friend, the
  friend's manager; the answer is the last one's city).

A question of h hops needs h searches. Each turn the agent answers either

  "search <name>"   (any name of `NAMES`): the reply lists that person's facts,
                    "Zeda : city Orvan , employer Klyx , born 1975 , manager Kovo , friend Brin",
                    or "Pemo : no results" for a name that is not in this knowledge base;
  "answer <value>"  (any city, employer or year of the pools): ends the episode, scoring
                    `goal_reward` (success) iff it is the question's answer.

Anything else is an invalid turn (`invalid_penalty`, nothing changes). Process signal
(`progress_reward` c > 0): +c the first time each person on the question's chain is searched.

Generation (pure JAX, from the reset key): `num_candidates` candidates per round, each drawing
distinct names, attribute values, relations, a start person, a number of hops uniform in
[`min_hops`, `max_hops`], the relation at each hop and the attribute asked. A candidate
qualifies when the people on its chain are distinct and the task's class matches the split: a
task (knowledge base and question) belongs to the test class when
`hash_u32(task) % 1000 < test_fraction * 1000`, so training never generates a test task.
Rounds repeat (at most `_MAX_ROUNDS`, inside a `while_loop`); the astronomically rare fallback is
a fixed knowledge base. The "ood" split asks `ood_hops`-hop questions (default 4: chains of three
relations, a composition never asked in training, where questions have at most two), either
class.
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
_MAX_ROUNDS = 16


@flax.struct.dataclass
class SearchQAParams:
    """Per-run parameters: which task class `reset` draws."""

    split: jax.Array  # int32[] 0 train class, 1 test class, 2 either class (ood)


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


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed splits: {list(SPLITS)}")
    return SPLITS.index(split)


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
    return text.hash_u32(_task_words(state))


def _task_words(state: SearchQAState) -> jax.Array:
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


@registry.register("search_qa")
class SearchQA:
    """Search QA over a generated knowledge base (see the module docstring).

    Attributes:
      tokenizer: tokenizer the fragments were encoded with.
      num_entities: E, people per knowledge base.
      max_hops: H, the most hops a question of this env has.
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
        if not 2 <= num_entities <= len(NAMES):
            raise ValueError(f"num_entities must be in [2, {len(NAMES)}], got {num_entities}")
        if not 1 <= min_hops <= max_hops <= num_entities:
            raise ValueError(
                f"need 1 <= min_hops <= max_hops <= num_entities={num_entities} (the chain's "
                f"people are distinct), got min_hops={min_hops}, max_hops={max_hops}"
            )
        if not 1 <= ood_hops <= num_entities:
            raise ValueError(
                f"ood_hops must be in [1, num_entities={num_entities}], got {ood_hops}"
            )
        base.check_test_fraction(test_fraction)
        if num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        base.check_nonnegative("progress_reward", progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", invalid_penalty, " (it is subtracted)")
        base.check_nonnegative("goal_reward", goal_reward)
        self._kwargs = dict(
            num_entities=num_entities,
            min_hops=min_hops,
            max_hops=max_hops,
            progress_reward=progress_reward,
            invalid_penalty=invalid_penalty,
            goal_reward=goal_reward,
            test_fraction=test_fraction,
            ood_hops=ood_hops,
            num_candidates=num_candidates,
            tokenizer=tokenizer,
        )
        self.tokenizer = text.BuiltinTokenizer() if tokenizer is None else tokenizer
        self.num_entities = num_entities
        self.min_hops = min_hops
        self.max_hops = max_hops
        self.progress_reward = progress_reward
        self.invalid_penalty = invalid_penalty
        self.goal_reward = goal_reward
        self.test_threshold = int(round(test_fraction * 1000))
        self.ood_hops = ood_hops
        self.num_candidates = num_candidates

        actions = [f"search {name}" for name in NAMES] + [f"answer {v}" for v in VALUES]
        self.num_searches = len(NAMES)
        self.num_actions = len(actions)
        self._actions = text.FragmentTable.build(self.tokenizer, {a: a for a in actions})
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
        self.max_action_len = int(self._actions.lengths.max())

    def default_params(self, split: str = "train") -> SearchQAParams:
        """Params selecting the task class `split` ("ood": either class) for this env."""
        return SearchQAParams(split=jnp.asarray(_split_id(split), jnp.int32))

    def make_split(self, split: str) -> tuple[SearchQA, SearchQAParams]:
        """(env, params) for "train", "test" or "ood" (a new env: `ood_hops`-hop questions)."""
        _split_id(split)
        env = self
        if split == "ood":
            ood = dict(min_hops=self.ood_hops, max_hops=self.ood_hops, tokenizer=self.tokenizer)
            env = SearchQA(**{**self._kwargs, **ood})
        return env, env.default_params(split)

    def reset(self, key: jax.Array, params: SearchQAParams) -> tuple[SearchQAState, TimeStep]:
        """Draws a knowledge base and question of the params' class.

        Args:
          key: typed PRNG key.
          params: `SearchQAParams`.

        Returns:
          The state and a TimeStep whose obs_tokens int32[P] hold the rules and the question.
        """
        state = self._generate(key, params.split)
        obs, obs_len = text.concat_fragments(
            self._frags, self._question_ids(state), self.tokenizer.pad_id, self.max_prompt_len
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
        state: SearchQAState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: SearchQAParams,
    ) -> tuple[SearchQAState, TimeStep]:
        """One turn: parse the action, search or judge the answer, observe.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `SearchQAState`.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `SearchQAParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O]; absorbing once done.
        """
        del key, params
        state = jax.tree.map(jnp.asarray, state)  # host (numpy) states work eagerly too
        action = text.match_action(self._actions, action_tokens, action_len)
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
            jnp.where(valid, 0.0, -self.invalid_penalty)
            + jnp.where(correct, self.goal_reward, 0.0)
            + jnp.where(first, self.progress_reward, 0.0)
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
        timestep = TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=is_answer,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=correct,
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, timestep))

    def anchor(self, state: SearchQAState) -> jax.Array:
        """uint32[] hash of the whole state (knowledge base, question, searched, done)."""
        extra = [jnp.ravel(jnp.asarray(x, jnp.int32)) for x in (state.searched, state.done)]
        return text.hash_u32(jnp.concatenate([_task_words(state), *extra]))

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

    @property
    def _bits_per_candidate(self) -> int:
        e = self.num_entities
        return len(NAMES) + e * len(ATTRIBUTES) + e * len(RELATIONS) + 3 + self.max_hops - 1

    def _candidate(self, bits: jax.Array) -> SearchQAState:
        """One random knowledge base and question (may not qualify).

        Args:
          bits: uint32[_bits_per_candidate] random bits.

        Returns:
          The candidate state (nothing searched).
        """
        e, h = self.num_entities, self.max_hops
        na, nr = len(ATTRIBUTES), len(RELATIONS)
        cut = np.cumsum([len(NAMES), e * na, e * nr, 1, 1, 1, h - 1])
        names = jnp.argsort(bits[: cut[0]])[:e].astype(jnp.int32)
        sizes = jnp.asarray([len(pool) for pool in POOLS], jnp.uint32)
        attrs = (bits[cut[0] : cut[1]].reshape(e, na) % sizes).astype(jnp.int32)
        shift = 1 + bits[cut[1] : cut[2]].reshape(e, nr) % (e - 1)  # 1..E-1: never oneself
        rels = ((jnp.arange(e)[:, None] + shift) % e).astype(jnp.int32)
        start = (bits[cut[2]] % e).astype(jnp.int32)
        hops = (self.min_hops + bits[cut[3]] % (self.max_hops - self.min_hops + 1)).astype(
            jnp.int32
        )
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

    def _generate(self, key: jax.Array, split: jax.Array) -> SearchQAState:
        """First qualifying candidate of the split's class over while_loop rounds."""

        def _qualifies(state):
            people, on = chain(state)
            same = (people[:, None] == people[None, :]) & on[:, None] & on[None, :]
            distinct = same.sum() == on.sum()  # only the diagonal
            return distinct & base.in_split_class(task_hash(state), self.test_threshold, split)

        def _candidates(bits):
            states = jax.vmap(self._candidate)(bits)
            return states, jax.vmap(_qualifies)(states)

        return base.first_qualifying(
            key,
            _candidates,
            self._fallback(),
            num_candidates=self.num_candidates,
            bits_per_candidate=self._bits_per_candidate,
            max_rounds=_MAX_ROUNDS,
        )

    def _fallback(self) -> SearchQAState:
        """A fixed task: the first E names, everyone's manager and friend the next person."""
        e, h = self.num_entities, self.max_hops
        ring = (np.arange(e) + 1) % e
        return SearchQAState(
            names=jnp.arange(e, dtype=jnp.int32),
            attrs=jnp.zeros((e, len(ATTRIBUTES)), jnp.int32),
            rels=jnp.asarray(np.stack([ring] * len(RELATIONS), axis=1), jnp.int32),
            start=jnp.zeros((), jnp.int32),
            path=jnp.where(jnp.arange(h - 1) < self.min_hops - 1, 0, -1).astype(jnp.int32),
            attr=jnp.zeros((), jnp.int32),
            hops=jnp.asarray(self.min_hops, jnp.int32),
            searched=jnp.zeros((e,), bool),
            done=jnp.zeros((), bool),
        )

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

    def action_tokens(self, action: int) -> np.ndarray:
        """int32[len] tokens of action id `action` (see `search_action`, `answer_action`)."""
        return self._actions.tokens[action, : self._actions.lengths[action]].copy()

    def action_text(self, action: int) -> str:
        """The string of action id `action`, e.g. "search Zeda" (host side)."""
        return self._actions.names[action]

    def question(self, state: SearchQAState) -> str:
        """The question as text (host side)."""
        state = jax.device_get(state)
        hops = int(state.hops)
        rels = [RELATIONS[int(r)] for r in np.asarray(state.path)[: hops - 1]]
        words = ["what is the", ATTRIBUTE_QUESTIONS[int(state.attr)]]
        for rel in reversed(rels):
            words += ["of the", rel]
        return " ".join(words + ["of", NAMES[int(state.names[int(state.start)])], "?"])

    def facts(self, state: SearchQAState, person: int) -> str:
        """Person `person`'s facts as the search observation shows them (host side)."""
        state = jax.device_get(state)
        parts = [f"{NAMES[int(state.names[person])]} : "]
        items = [f"{a} {POOLS[k][int(state.attrs[person, k])]}" for k, a in enumerate(ATTRIBUTES)]
        items += [
            f"{rel} {NAMES[int(state.names[int(state.rels[person, r])])]}"
            for r, rel in enumerate(RELATIONS)
        ]
        return parts[0] + " , ".join(items)

    def render(self, state: SearchQAState) -> str:
        """The question, then every person's facts, searched ones marked "*" (host side)."""
        state = jax.device_get(state)
        lines = [f"question: {self.question(state)}"]
        for person in range(self.num_entities):
            mark = "*" if bool(state.searched[person]) else " "
            lines.append(f"{mark} {self.facts(state, person)}")
        if bool(state.done):
            lines.append("done")
        return "\n".join(lines) + "\n"

    def state_from_kb(
        self,
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
        if len(kb) != self.num_entities or not set(kb) <= set(NAMES):
            raise ValueError(
                f"kb needs {self.num_entities} people named from NAMES, got {list(kb)}"
            )
        if len(relations) > self.max_hops - 1:
            raise ValueError(f"at most {self.max_hops - 1} relations, got {relations}")
        people = list(kb)
        attrs = [[POOLS[k].index(kb[p][a]) for k, a in enumerate(ATTRIBUTES)] for p in people]
        rels = [[people.index(kb[p][r]) for r in RELATIONS] for p in people]
        path = [RELATIONS.index(r) for r in relations]
        path += [-1] * (self.max_hops - 1 - len(path))
        return SearchQAState(
            names=jnp.asarray([NAMES.index(p) for p in people], jnp.int32),
            attrs=jnp.asarray(attrs, jnp.int32),
            rels=jnp.asarray(rels, jnp.int32),
            start=jnp.asarray(people.index(start), jnp.int32),
            path=jnp.asarray(path, jnp.int32).reshape(self.max_hops - 1),
            attr=jnp.asarray(ATTRIBUTES.index(attribute), jnp.int32),
            hops=jnp.asarray(len(relations) + 1, jnp.int32),
            searched=jnp.zeros((self.num_entities,), bool),
            done=jnp.zeros((), bool),
        )

    def oracle_actions(self, state: SearchQAState) -> list[int] | None:
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
        return plan + [self.answer_action(POOLS[attr][int(state.attrs[person, attr])])]
