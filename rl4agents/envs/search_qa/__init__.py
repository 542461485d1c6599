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
Rounds repeat (at most `generator._MAX_ROUNDS`, inside a `while_loop`); the astronomically rare
fallback is a fixed knowledge base. The "ood" split asks `ood_hops`-hop questions (default 4:
chains of three relations, a composition never asked in training, where questions have at most
two), either class.

Modules: `world` (pools, state, the question's chain and answer, task hash), `generator`
(knowledge-base generation), `host` (question and facts as text, states from facts, rendering,
the oracle's plan) and `env` (the registered `SearchQA`: settings, tables, `reset_env` /
`step_env`).
"""

from rl4agents.envs.search_qa.env import SearchQA, SearchQAConfig
from rl4agents.envs.search_qa.world import (
    ATTRIBUTE_QUESTIONS,
    ATTRIBUTES,
    NAMES,
    OFFSETS,
    POOLS,
    RELATIONS,
    SPLITS,
    VALUES,
    SearchQAParams,
    SearchQAState,
    answer_value,
    chain,
    task_hash,
    task_words,
)

__all__ = [
    "SearchQA",
    "SearchQAConfig",
    "ATTRIBUTES",
    "ATTRIBUTE_QUESTIONS",
    "NAMES",
    "OFFSETS",
    "POOLS",
    "RELATIONS",
    "SPLITS",
    "VALUES",
    "SearchQAParams",
    "SearchQAState",
    "answer_value",
    "chain",
    "task_hash",
    "task_words",
]
