"""Tests for rl4agents.envs.search_qa: hand-checked dynamics, generation, splits, oracle.

Every jitted function is built once per env at import with a fixed batch B, so the file compiles
each of them once; hand checks run as a batch of B copies of one state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import registry, search_qa
from tests.envs import helpers

A = 10  # action slots (the longest action is 8 tokens)
B = 64  # episodes per batched call
ENV = search_qa.SearchQA()
SHAPED = search_qa.SearchQA(progress_reward=0.1)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
INTRO = "use search name to read facts , then answer value\n"
INVALID = "invalid action , allowed: search name or answer value\n"
# name, city, employer, born, manager, friend
PEOPLE = [
    ("Zeda", "Orvan", "Klyx", "1975", "Kovo", "Brin"),
    ("Kovo", "Tellis", "Torvo", "1980", "Brin", "Zeda"),
    ("Brin", "Mazur", "Granix", "1971", "Mirel", "Kovo"),
    ("Mirel", "Saltor", "Vestal", "1988", "Zeda", "Tasso"),
    ("Tasso", "Quenby", "Mirabo", "1979", "Fenna", "Ulma"),
    ("Fenna", "Brevik", "Zentco", "1983", "Ulma", "Quilo"),
    ("Ulma", "Dunmar", "Plumaco", "1970", "Quilo", "Fenna"),
    ("Quilo", "Ekkla", "Obrinex", "1989", "Tasso", "Mirel"),
]
KB = {
    p[0]: dict(zip(search_qa.ATTRIBUTES + search_qa.RELATIONS, p[1:], strict=True)) for p in PEOPLE
}
# Zeda -> friend Brin -> manager Mirel, born 1988.
HAND = ENV.state_from_kb(KB, "Zeda", ["friend", "manager"], "born")
FACTS = {
    p[0]: f"{p[0]} : city {p[1]} , employer {p[2]} , born {p[3]} , manager {p[4]} , friend {p[5]}"
    for p in PEOPLE
}


BATCHED = helpers.StepBatch(ENV, A, B)
BATCHED_OOD = helpers.StepBatch(OOD_ENV, A, B)
BATCHED_SHAPED = helpers.StepBatch(SHAPED, A, B)
_hash_batch = jax.jit(jax.vmap(search_qa.task_hash))


def _rows(states):
    """int32[n, W] every field of a batch of states, flattened per state."""
    leaves = [np.asarray(x).reshape(np.shape(x)[0], -1) for x in jax.tree.leaves(states)]
    return np.concatenate([x.astype(np.int32) for x in leaves], axis=1)


def test_search_qa__registered_with_builtin_sizes():
    env = registry.make("search_qa")
    assert isinstance(env, search_qa.SearchQA)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (69, 67, 8)
    assert env.num_actions == 24 + 8 + 8 + 20 == len(search_qa.NAMES) + len(search_qa.VALUES)
    assert (OOD_ENV.config.min_hops, OOD_ENV.config.max_hops, OOD_ENV.max_prompt_len) == (4, 4, 78)
    assert OOD_ENV.max_obs_len == 67 and OOD_ENV.max_action_len == 8
    assert env.action_text(env.search_action("Zeda")) == "search Zeda"
    assert env.action_text(env.answer_action("1988")) == "answer 1988"


def test_search_qa__question_and_chain_of_a_hand_state():
    assert ENV.question(HAND) == "what is the birth year of the manager of the friend of Zeda ?"
    people, on = search_qa.chain(HAND)
    np.testing.assert_array_equal(people, [0, 2, 3])  # Zeda, Brin, Mirel
    assert np.asarray(on).all()
    assert search_qa.VALUES[int(search_qa.answer_value(HAND))] == "1988"
    one_hop = ENV.state_from_kb(KB, "Tasso", [], "employer")
    assert ENV.question(one_hop) == "what is the employer of Tasso ?"
    people, on = search_qa.chain(one_hop)
    np.testing.assert_array_equal(on, [True, False, False])
    assert search_qa.VALUES[int(search_qa.answer_value(one_hop))] == "Mirabo"


def test_search_qa__prompt_is_rules_and_question():
    states, ts = BATCHED.reset(BATCHED.keys(0), TRAIN)
    for i in range(6):
        helpers.assert_obs(
            ENV, helpers.index(ts, i), INTRO + ENV.question(helpers.index(states, i)) + "\n"
        )
    assert not np.asarray(ts.done).any() and (np.asarray(ts.reward) == 0).all()


def test_search_qa__searches_then_correct_answer_wins_and_absorbs():
    actions = ["search Zeda", "search Brin", "search Mirel", "answer 1988", "answer 1988"]
    steps = BATCHED.play(HAND, actions)
    for (_, ts), name in zip(steps[:3], ["Zeda", "Brin", "Mirel"]):
        helpers.assert_obs(ENV, ts, FACTS[name] + "\n")
        assert ts.valid_action and not ts.done and ts.reward == 0.0
    np.testing.assert_array_equal(steps[2][0].searched, [1, 0, 1, 1, 0, 0, 0, 0])
    (s4, t4), (s5, t5) = steps[3:]
    helpers.assert_obs(ENV, t4, "correct , you won\n")
    assert t4.done and t4.success and t4.reward == 1.0 and bool(s4.done)
    helpers.assert_same(s5, s4)
    assert t5.done and t5.reward == 0.0 and t5.obs_len == 0 and not t5.success
    assert t5.anchor == t4.anchor


def test_search_qa__unknown_names_wrong_answers_and_invalid_actions():
    ((state, ts),) = BATCHED.play(HAND, ["search Pemo"])  # a name of the pool, not in this KB
    helpers.assert_obs(ENV, ts, "Pemo : no results\n")
    assert ts.valid_action and ts.reward == 0.0 and not ts.done
    helpers.assert_same(state, HAND)
    for action in ("search Orvan", "answer Zeda", "search", "lookup Zeda", "answer 1969", ""):
        ((state, ts),) = BATCHED.play(HAND, [action])
        helpers.assert_obs(ENV, ts, INVALID)
        assert not ts.valid_action and not ts.done and ts.reward == pytest.approx(-0.05)
        helpers.assert_same(state, HAND)
    ((state, ts),) = BATCHED.play(HAND, ["answer Saltor"])  # Mirel's city, not her birth year
    helpers.assert_obs(ENV, ts, "wrong , you lost\n")
    assert ts.done and ts.valid_action and ts.reward == 0.0 and not ts.success


def test_search_qa__progress_reward_for_first_search_of_each_chain_person():
    actions = [
        "search Zeda",  # on the chain: +c
        "search Zeda",  # again: 0
        "search Kovo",  # in the KB, off the chain: 0
        "search Pemo",  # not in the KB: 0
        "search Brin",  # +c
        "search Mirel",  # +c
        "answer 1988",
    ]
    rewards = [float(ts.reward) for _, ts in BATCHED_SHAPED.play(HAND, actions)]
    np.testing.assert_allclose(rewards, [0.1, 0, 0, 0, 0.1, 0.1, 1.0], atol=1e-6)


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_search_qa__oracle_solves_every_generated_task_closed_loop(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    all_hops = []
    for seed in range(4):  # 256 tasks per split
        states, _ = batched.reset(batched.keys(100 + seed), params)
        hops = np.asarray(states.hops)
        all_hops.append(hops)
        final, steps = batched.oracle_turns(states, params, env.config.max_hops + 1)
        assert np.asarray(final.done).all()
        success = np.stack([np.asarray(t.success) for t in steps], axis=1)
        rewards = np.stack([np.asarray(t.reward) for t in steps], axis=1)
        assert (success.sum(axis=1) == 1).all()
        np.testing.assert_array_equal(success.argmax(axis=1), hops)  # hops searches, answer
        np.testing.assert_allclose(rewards.sum(axis=1), 1.0)
        assert all(np.asarray(t.valid_action).all() for t in steps)
        np.testing.assert_array_equal(np.asarray(final.searched).sum(axis=1), hops)
    hops = np.concatenate(all_hops)
    assert set(hops.tolist()) == ({4} if split == "ood" else {1, 2, 3})


def test_search_qa__shaped_oracle_return_is_goal_plus_c_per_hop():
    states, _ = BATCHED.reset(BATCHED.keys(7), TRAIN)  # SHAPED generates the same tasks
    final, steps = BATCHED_SHAPED.oracle_turns(states, TRAIN, ENV.config.max_hops + 1)
    rewards = np.stack([np.asarray(t.reward) for t in steps], axis=1)
    np.testing.assert_allclose(rewards.sum(axis=1), 1.0 + 0.1 * np.asarray(states.hops), rtol=1e-5)


def test_search_qa__oracle_first_action_uses_only_observed_facts():
    """Changing the facts of people not yet searched never changes the oracle's next action."""
    rng = np.random.default_rng(0)
    states, _ = BATCHED.reset(BATCHED.keys(8), TRAIN)
    checked = 0
    for turn in range(3):
        host = jax.device_get(states)
        for i in range(B):
            state = helpers.index(host, i)
            if state.done:
                continue
            first = ENV.oracle_actions(state)[0]
            hidden = ~np.asarray(state.searched)
            e = ENV.config.num_entities
            attrs = np.where(hidden[:, None], rng.integers(0, 8, (e, 3)), state.attrs)
            shift = rng.integers(1, e, (e, 2))
            rels = np.where(hidden[:, None], (np.arange(e)[:, None] + shift) % e, state.rels)
            changed = state.replace(attrs=attrs.astype(np.int32), rels=rels.astype(np.int32))
            assert ENV.oracle_actions(changed)[0] == first
            checked += 1
        ids = [(ENV.oracle_actions(helpers.index(host, i)) or [0])[0] for i in range(B)]
        states, _ = BATCHED.act(states, ids, TRAIN, seed=turn)
    assert checked > 2 * B


def test_search_qa__train_test_and_ood_tasks_are_disjoint():
    def tasks(batched, params, seeds):
        rows, hashes = [], []
        for seed in seeds:
            states, _ = batched.reset(batched.keys(seed), params)
            rows.append(_rows(states.replace(searched=states.searched[:, :0])))
            if batched is BATCHED:
                hashes.append(np.asarray(_hash_batch(states)))
        return rows, hashes

    (train_rows, train_hashes), (test_rows, test_hashes) = (
        tasks(BATCHED, TRAIN, range(200, 208)),
        tasks(BATCHED, TEST, range(300, 304)),
    )
    train = set(map(bytes, np.concatenate(train_rows)))
    test = set(map(bytes, np.concatenate(test_rows)))
    assert len(train) == 8 * B and len(test) == 4 * B and not train & test
    assert (np.concatenate(test_hashes) % 1000 < 200).all()
    assert (np.concatenate(train_hashes) % 1000 >= 200).all()
    ood_states, _ = BATCHED_OOD.reset(BATCHED_OOD.keys(5), OOD_PARAMS)
    # OOD questions chain three relations; training questions at most two.
    assert (np.asarray(ood_states.path) >= 0).all() and np.asarray(ood_states.path).shape[1] == 3
    train_states, _ = BATCHED.reset(BATCHED.keys(200), TRAIN)
    assert ((np.asarray(train_states.path) >= 0).sum(axis=1) <= 2).all()


def test_search_qa__generated_knowledge_bases_are_wellformed():
    states, _ = BATCHED.reset(BATCHED.keys(9), TEST)
    names, rels = np.asarray(states.names), np.asarray(states.rels)
    assert all(len(set(row)) == ENV.config.num_entities for row in names.tolist())
    assert (rels != np.arange(ENV.config.num_entities)[None, :, None]).all()  # never oneself
    assert ((rels >= 0) & (rels < ENV.config.num_entities)).all()
    sizes = np.array([len(pool) for pool in search_qa.POOLS])
    assert ((np.asarray(states.attrs) >= 0) & (np.asarray(states.attrs) < sizes)).all()
    for i in range(B):  # the chain's people are distinct
        people, on = search_qa.chain(helpers.index(states, i))
        chain_people = np.asarray(people)[np.asarray(on)]
        assert len(set(chain_people.tolist())) == len(chain_people)
        if i == 8:
            break
    paths, hops = np.asarray(states.path), np.asarray(states.hops)
    np.testing.assert_array_equal((paths >= 0).sum(axis=1), hops - 1)


def test_search_qa__anchors_equal_iff_states_equal():
    rng = np.random.default_rng(1)
    states, ts0 = BATCHED.reset(BATCHED.keys(10), TRAIN)
    seen = [(states, ts0.anchor)]
    for turn in range(4):
        names = np.asarray(states.names)
        ids = [
            int(rng.choice(names[i])) if rng.random() < 0.85 else ENV.num_searches for i in range(B)
        ]
        states, ts = BATCHED.act(states, ids, TRAIN, seed=turn)
        seen.append((states, ts.anchor))
    by_anchor, by_state = {}, {}
    for batch, anchors in seen:
        for anchor, row in zip(np.asarray(anchors).tolist(), map(bytes, _rows(batch))):
            by_anchor.setdefault(anchor, set()).add(row)
            by_state.setdefault(row, set()).add(anchor)
    assert len(by_state) > 200
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_search_qa__random_token_actions_are_penalised_turns():
    states, _ = BATCHED.reset(BATCHED.keys(11), TRAIN)
    tokens, lengths = helpers.random_actions(
        ENV.tokenizer.vocab_size, jax.random.key(12), jax.random.key(13), (B,), A
    )
    new, ts = BATCHED.step(BATCHED.keys(11), states, tokens, lengths, TRAIN)
    assert not np.asarray(ts.valid_action).any() and not np.asarray(ts.done).any()
    np.testing.assert_allclose(np.asarray(ts.reward), -0.05, rtol=1e-6)
    helpers.assert_same(new, states)
    helpers.assert_obs(ENV, helpers.index(ts, 0), INVALID)


def test_search_qa__render_is_readable():
    ((state, _),) = BATCHED.play(HAND, ["search Zeda"])
    lines = ENV.render(state).splitlines()
    assert lines[0] == "question: what is the birth year of the manager of the friend of Zeda ?"
    assert lines[1] == "* " + FACTS["Zeda"]
    assert lines[2] == "  " + FACTS["Kovo"]
    assert len(lines) == 1 + ENV.config.num_entities
    assert ENV.render(state.replace(done=np.asarray(True))).endswith("done\n")


def test_search_qa__oracle_on_hand_state():
    plan = [ENV.action_text(a) for a in ENV.oracle_actions(HAND)]
    assert plan == ["search Zeda", "search Brin", "search Mirel", "answer 1988"]
    (s1, _), (s2, _) = BATCHED.play(HAND, ["search Brin", "search Zeda"])
    assert [ENV.action_text(a) for a in ENV.oracle_actions(s2)] == ["search Mirel", "answer 1988"]
    assert ENV.oracle_actions(HAND.replace(done=jnp.asarray(True))) == []


def test_search_qa__arguments_and_splits_are_validated():
    with pytest.raises(ValueError, match="num_entities.*30"):
        search_qa.SearchQA(num_entities=30)
    with pytest.raises(ValueError, match="min_hops=3, max_hops=2"):
        search_qa.SearchQA(min_hops=3, max_hops=2)
    with pytest.raises(ValueError, match="ood_hops.*9"):
        search_qa.SearchQA(ood_hops=9)
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="allowed names"):
        ENV.search_action("Alice")


def test_search_qa__config_builds_a_matching_rollout():
    from configs import search_qa as config

    c = config.get_config()
    assert c.env.name == "search_qa" and c.credit.name == "grpo"
    env = registry.make("search_qa", **registry.validate("search_qa", dict(c.env.search_qa)))
    ood_env, _ = env.make_split("ood")
    assert c.rollout.max_action_len >= max(env.max_action_len, ood_env.max_action_len) + 1
    assert (
        c.rollout.max_turns > env.config.max_hops
        and c.train.ood_max_turns > ood_env.config.max_hops
    )
    assert config.get_config("ppo_gae").model.value_head == "shared"
