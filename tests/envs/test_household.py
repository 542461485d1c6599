"""Tests for rl4agents.envs.household: hand-checked dynamics, generation, splits, oracle.

Batched reset and step are jitted once per env at import (fixed batch B); episodes are played
turn by turn from Python so the oracle can act closed-loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import household, registry
from tests.envs import helpers
from tests.envs.chars import CharTokenizer

B = 64  # episodes per batched call
ENV = household.Household()
SHAPED = household.Household(progress_reward=0.1)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
A = ENV.max_action_len + 1  # action slots
TOK = ENV.tokenizer


BATCHED = helpers.StepBatch(ENV, A, B)
BATCHED_OOD = helpers.StepBatch(OOD_ENV, A, B)
BATCHED_SHAPED = helpers.StepBatch(SHAPED, A, B)


def _obs(ts) -> list[int]:
    return np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()


def _play(state, actions, env=ENV, batched=BATCHED):
    """[(state, TimeStep)] after each action string (or raw token list) from `state`."""
    return batched.play(state, [env.action_id(a) if isinstance(a, str) else a for a in actions])


KITCHEN = dict(
    objects={
        "mug 1": "countertop 1",
        "apple 2": "cabinet 1",
        "knife 1": "cabinet 1",
        "plate 1": "sink 1",
    },
    goal="put a clean mug in cabinet",
)


def test_household__registered_with_builtin_sizes():
    env = registry.make("household")
    assert isinstance(env, household.Household)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (179, 103, 23)
    assert env.num_actions == 446 and len(env.receptacles) == 10
    assert env.action_strings[0] == "go to countertop 1" and env.action_strings[-1] == "inventory"
    assert "take mug 2 from fridge 1" in env.action_strings
    assert "heat apple 3 with microwave" in env.action_strings
    assert OOD_ENV.config.num_objects == 9 and OOD_ENV.max_obs_len == 111
    with pytest.raises(ValueError, match="num_objects must be in"):
        household.Household(num_objects=1)
    with pytest.raises(ValueError, match="num_cabinets"):
        household.Household(num_cabinets=4)


def test_household__hand_checked_clean_and_place_episode():
    state = ENV.make_state(**KITCHEN)
    script = [
        ("look", "you are in the middle of a room ."),
        ("go to cabinet 1", "you arrive at cabinet 1 . it is closed ."),
        ("take apple 2 from cabinet 1", "nothing happens ."),
        ("open cabinet 1", "you open the cabinet 1 . in it you see an apple 2 , and a knife 1 ."),
        ("go to countertop 1", "you arrive at countertop 1 . on it you see a mug 1 ."),
        ("go to countertop 1", "nothing happens ."),
        ("take mug 1 from countertop 1", "you pick up the mug 1 from the countertop 1 ."),
        ("inventory", "you are carrying : a mug 1 ."),
        ("take knife 1 from cabinet 1", "nothing happens ."),
        ("clean mug 1 with sink", "nothing happens ."),
        ("go to sink 1", "you arrive at sink 1 . on it you see a plate 1 ."),
        ("clean mug 1 with sink", "you clean the mug 1 using the sink 1 ."),
        ("go to cabinet 2", "you arrive at cabinet 2 . it is closed ."),
        ("put mug 1 in cabinet 2", "nothing happens ."),
        ("open cabinet 2", "you open the cabinet 2 . in it you see nothing ."),
        ("put mug 1 in cabinet 2", "you put the mug 1 in the cabinet 2 . the task is done ."),
    ]
    steps = _play(state, [a for a, _ in script])
    for (action, expected), (_, ts) in zip(script, steps, strict=True):
        assert _obs(ts) == TOK.encode(expected + "\n"), (action, TOK.decode(_obs(ts)))
        assert bool(ts.valid_action)
    rewards = [float(ts.reward) for _, ts in steps]
    assert rewards == [0.0] * (len(script) - 1) + [1.0]
    assert [bool(ts.done) for _, ts in steps] == [False] * (len(script) - 1) + [True]
    final, last = steps[-1]
    assert bool(last.success) and bool(final.done) and int(final.steps) == len(script)
    assert ENV.render(final).splitlines()[:3] == [
        "goal: put a clean mug in cabinet",
        f"agent: at cabinet 2, step {len(script)}/40, done",
        "holding: nothing",
    ]
    assert "cabinet 2 [open, seen]: mug 1 (clean)" in ENV.render(final)
    # Absorbing afterwards.
    ((after, ts),) = _play(final, ["look"])
    jax.tree.map(np.testing.assert_array_equal, after, final)
    assert ts.done and ts.reward == 0 and ts.obs_len == 0 and not ts.success


def test_household__three_item_listing_heat_cool_and_pick_two():
    state = ENV.make_state(
        {"mug 1": "countertop 1", "apple 2": "countertop 1", "knife 1": "countertop 1"},
        goal="put a mug in shelf",
    )
    ((_, ts),) = _play(state, ["go to countertop 1"])
    expected = "you arrive at countertop 1 . on it you see an apple 2 , a knife 1 , and a mug 1 .\n"
    assert _obs(ts) == TOK.encode(expected)

    state = ENV.make_state(
        {"apple 1": "inventory"}, "put a hot apple in table", agent="microwave 1"
    )
    steps = _play(
        state, ["heat apple 1 with microwave", "go to fridge 1", "cool apple 1 with fridge"]
    )
    assert _obs(steps[0][1]) == TOK.encode("you heat the apple 1 using the microwave 1 .\n")
    assert _obs(steps[2][1]) == TOK.encode("you cool the apple 1 using the fridge 1 .\n")
    assert [int(s.obj_temp[0]) for s, _ in steps] == [1, 1, 2]
    assert not any(bool(ts.done) for _, ts in steps)

    state = ENV.make_state(
        {"mug 1": "drawer 1", "mug 2": "inventory"},
        "put two mugs in drawer",
        agent="drawer 2",
        opened=["drawer 2"],
    )
    ((_, ts),) = _play(state, ["put mug 2 in drawer 2"])
    assert bool(ts.success) and float(ts.reward) == 1.0


CHAR_ENV = household.Household(tokenizer=CharTokenizer())
INVALID = (
    "invalid action . valid actions: go to R , open R , close R , take O from R , put O in R , "
    "clean O with sink , heat O with microwave , cool O with fridge , look , inventory ."
)


def test_household__exact_text_spaces_every_fragment_and_fits_the_static_lengths():
    # A character-level tokenizer keeps every space: this is the text a chat model reads.
    env, tok = CHAR_ENV, CHAR_ENV.tokenizer
    step = jax.jit(env.step)

    def play(state, actions):
        texts = []
        for action in actions:
            ids = tok.encode(action)
            tokens = np.zeros((env.max_action_len,), np.int32)
            tokens[: len(ids)] = ids
            state, ts = step(jax.random.key(0), state, tokens, len(ids), TRAIN)
            texts.append(tok.decode(_obs(ts)))
            assert int(ts.obs_len) == len(texts[-1]) <= env.max_obs_len
        return texts

    script = [
        ("go to cabinet 1", "you arrive at cabinet 1 . it is closed ."),
        ("open cabinet 1", "you open the cabinet 1 . in it you see an apple 2 , and a knife 1 ."),
        ("take knife 1 from cabinet 1", "you pick up the knife 1 from the cabinet 1 ."),
        ("inventory", "you are carrying : a knife 1 ."),
        ("go to sink 1", "you arrive at sink 1 . on it you see a plate 1 ."),
        ("clean knife 1 with sink", "you clean the knife 1 using the sink 1 ."),
        ("go to cabinet 2", "you arrive at cabinet 2 . it is closed ."),
        ("open cabinet 2", "you open the cabinet 2 . in it you see nothing ."),
        ("put knife 1 in cabinet 2", "you put the knife 1 in the cabinet 2 ."),
        ("jump", INVALID),
    ]
    texts = play(env.make_state(**KITCHEN), [a for a, _ in script])
    assert texts == [e + "\n" for _, e in script]
    done = env.make_state(
        {"mug 1": "inventory"}, KITCHEN["goal"], "cabinet 2", opened=["cabinet 2"], clean=["mug 1"]
    )
    assert play(done, ["put mug 1 in cabinet 2"]) == [
        "you put the mug 1 in the cabinet 2 . the task is done .\n"
    ]
    # The bound: the grammar answer to an invalid action on the last turn, which reaches it.
    late = env.make_state(**KITCHEN, steps=env.config.max_steps - 1)
    (last,) = play(late, ["jump"])
    assert last == INVALID + " you ran out of steps .\n"
    assert env.max_obs_len == len(last) == 173 + 23 + 1

    state, ts = jax.jit(env.reset)(jax.random.key(0), TRAIN)
    listing = " , ".join(f"a {r}" for r in env.receptacles[:-1])
    intro = (
        "you are in the middle of a room . looking quickly around you , you see "
        f"{listing} , and a sink 1 .\n"
    )
    assert tok.decode(_obs(ts)) == f"{intro}your task is to : {env.goal_text(state.goal)} .\n"
    # The prompt bound joins the longest goal pieces (the head of "clean", the plural of
    # "pick_two", the longest receptacle type), more than any one goal reaches.
    longest = "your task is to : put a clean apples in countertop .\n"
    assert env.max_prompt_len == len(intro) + len(longest) == 210 + 53
    assert int(ts.obs_len) <= env.max_prompt_len


def test_household__progress_reward_follows_the_subgoals():
    state = SHAPED.make_state(**KITCHEN)
    actions = [
        "go to countertop 1",  # found: +1 stage
        "take mug 1 from countertop 1",  # held: +1
        "go to sink 1",
        "clean mug 1 with sink",  # clean: +1
        "put mug 1 in sink 1",  # put down elsewhere: back to "found" (-2)
        "take mug 1 from sink 1",  # +2
        "go to cabinet 1",
        "open cabinet 1",
        "put mug 1 in cabinet 1",  # placed: +1 and the goal
    ]
    steps = _play(state, actions, env=SHAPED, batched=BATCHED_SHAPED)
    rewards = [float(ts.reward) for _, ts in steps]
    np.testing.assert_allclose(rewards, [0.1, 0.1, 0, 0.1, -0.2, 0.2, 0, 0, 1.1], atol=1e-6)
    assert [float(SHAPED.potential(s)) for s, _ in steps][-1] == 4.0
    two = SHAPED.make_state({"mug 1": "countertop 1", "mug 2": "table 1"}, "put two mugs in shelf")
    steps = _play(two, ["go to countertop 1", "go to table 1"], env=SHAPED, batched=BATCHED_SHAPED)
    np.testing.assert_allclose([float(ts.reward) for _, ts in steps], [0.1, 0.1], atol=1e-6)


def test_household__invalid_action_is_penalised_and_reported():
    state = ENV.make_state(**KITCHEN)
    for tokens in (TOK.encode("fly to the moon"), TOK.encode("take mug 1"), []):
        ((new, ts),) = _play(state, [tokens])
        assert not ts.valid_action and not ts.done
        assert float(ts.reward) == pytest.approx(-0.05)
        assert TOK.decode(_obs(ts)).startswith("invalid action . valid actions: go to R")
        jax.tree.map(np.testing.assert_array_equal, new, state.replace(steps=jnp.asarray(1)))


def test_household__step_limit_ends_the_episode_unsolved():
    state = ENV.make_state(**KITCHEN, steps=ENV.config.max_steps - 1)
    ((new, ts),) = _play(state, ["look"])
    assert bool(ts.done) and not ts.success and float(ts.reward) == 0.0
    expected = "you are in the middle of a room . you ran out of steps .\n"
    assert _obs(ts) == TOK.encode(expected)
    assert int(new.steps) == ENV.config.max_steps and ENV.oracle_actions(new) is None


def test_household__vmap_reset_over_64_keys_is_wellformed():
    for params in (TRAIN, TEST):
        states, ts = BATCHED.reset(BATCHED.keys(0), params)
        assert ts.obs_tokens.shape == (B, ENV.max_prompt_len)
        for i in range(4):
            state = helpers.index(states, i)
            goal = ENV.goal_text(state.goal)
            listing = " , ".join(f"a {r}" for r in ENV.receptacles[:-1])
            prompt = (
                "you are in the middle of a room . looking quickly around you , you see "
                f"{listing} , and a sink 1 .\nyour task is to : {goal} .\n"
            )
            assert _obs(helpers.index(ts, i)) == TOK.encode(prompt)
        types, inst = np.asarray(states.obj_type), np.asarray(states.obj_inst)
        names = types * household.MAX_INSTANCES + inst - 1
        assert (np.diff(names, axis=1) > 0).all()  # canonical order, no duplicate names
        assert ((inst >= 1) & (inst <= household.MAX_INSTANCES)).all()
        goal = np.asarray(states.goal)
        need = np.where(goal[:, 0] == household.PICK_TWO, 2, 1)
        assert ((types == goal[:, 1:2]).sum(axis=1) >= need).all()
        assert not np.asarray(jax.vmap(ENV.goal_holds)(states)).any()
        assert (np.asarray(states.agent) == len(ENV.receptacles)).all()
        assert len(set(np.asarray(jax.vmap(household.task_hash)(states)).tolist())) == B


def _run_oracle(batched, params, seed):
    """Closed-loop oracle over B tasks: (success bool[B], return f32[B], turns int[B], states)."""
    env = batched.env
    states, _ = batched.reset(batched.keys(seed), params)
    success, total = np.zeros(B, bool), np.zeros(B, np.float32)
    turns = np.zeros(B, np.int32)
    trace = []
    for t in range(env.config.max_steps):
        host = jax.device_get(states)
        done = np.asarray(host.done)
        if done.all():
            break
        trace.append(host)
        ids = np.zeros(B, np.int32)
        for i in np.flatnonzero(~done):
            plan = env.oracle_actions(helpers.index(host, i))
            assert plan, (seed, i, env.render(helpers.index(host, i)))
            ids[i] = plan[0]
        states, ts = batched.act(states, ids, params, seed=seed * 1000 + t)
        success |= np.asarray(ts.success)
        total += np.asarray(ts.reward)
        turns += ~done
        assert np.asarray(ts.valid_action).all()
    return success, total, turns, trace


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_household__oracle_solves_every_generated_task(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    lengths = []
    for seed in range(4):  # 256 tasks
        success, total, turns, _ = _run_oracle(batched, params, seed)
        assert success.all(), np.flatnonzero(~success)
        np.testing.assert_allclose(total, 1.0)
        lengths.append(turns)
    lengths = np.concatenate(lengths)
    assert lengths.max() <= env.config.max_steps and lengths.min() >= 2
    assert lengths.mean() > 8  # tasks need exploring, not one lucky pick


def test_household__oracle_uses_only_what_the_agent_has_seen():
    """Moving objects between receptacles the agent has not seen never changes its action."""
    _, _, _, trace = _run_oracle(BATCHED, TRAIN, seed=11)
    rng = np.random.default_rng(0)
    num_rec, checked = len(ENV.receptacles), 0
    for host in trace[1::2]:
        for i in range(0, B, 4):
            state = helpers.index(host, i)
            if state.done:
                continue
            unseen = np.flatnonzero(~state.seen)
            hidden = (state.obj_loc >= 0) & (state.obj_loc < num_rec)
            hidden &= ~state.seen[np.clip(state.obj_loc, 0, num_rec - 1)]
            if not unseen.size or not hidden.any():
                continue
            loc = state.obj_loc.copy()
            loc[hidden] = rng.choice(unseen, hidden.sum())
            moved = state.replace(obj_loc=loc)
            if ENV.goal_holds(moved) or ENV.goal_holds(state):
                continue
            assert ENV.oracle_actions(moved)[0] == ENV.oracle_actions(state)[0]
            checked += 1
    assert checked > 60


def test_household__train_test_and_ood_tasks_are_disjoint():
    def tasks(batched, params, seeds):
        rows, goals = [], []
        for s in seeds:
            states, _ = batched.reset(batched.keys(s), params)
            parts = (states.obj_type, states.obj_inst, states.obj_loc, states.goal)
            rows.append(np.concatenate([np.asarray(p) for p in parts], axis=1))
            goals.append(np.asarray(states.goal))
        return np.concatenate(rows), np.concatenate(goals)

    train, train_goals = tasks(BATCHED, TRAIN, range(100, 108))  # 512 tasks
    test, test_goals = tasks(BATCHED, TEST, range(200, 204))
    ood, ood_goals = tasks(BATCHED_OOD, OOD_PARAMS, range(300, 302))
    set_train, set_test = set(map(bytes, train)), set(map(bytes, test))
    assert not set_train & set_test and len(set_train) == 512 and len(set_test) == 256
    hash_test = np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(test)))
    hash_train = np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(train)))
    assert (hash_test % 1000 < 200).all() and (hash_train % 1000 >= 200).all()
    held_out = {
        (household.GOAL_KINDS.index(k), household.OBJECT_TYPES.index(t))
        for k, t in household.HELD_OUT
    }
    assert not {tuple(g[:2]) for g in np.concatenate([train_goals, test_goals])} & held_out
    assert {tuple(g[:2]) for g in ood_goals} == held_out
    assert ood.shape[1] > train.shape[1]  # more objects (distractors)
    # Every in-distribution goal kind and receptacle type shows up in training.
    assert set(train_goals[:, 0]) == set(range(len(household.GOAL_KINDS)))
    assert len(set(train_goals[:, 2])) == len(household.GOAL_RECEPTACLE_TYPES)


def test_household__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(7), TRAIN)
    rng = np.random.default_rng(1)
    num_rec = len(ENV.receptacles)
    fields = lambda s: np.concatenate(  # noqa: E731
        [
            np.asarray(x).reshape(B, -1).astype(np.int32)
            for x in (s.obj_type, s.obj_inst, s.obj_loc, s.obj_clean, s.obj_temp)
            + (s.rec_open, s.seen, s.agent, s.goal)
        ],
        axis=1,
    )
    rows, anchors = [fields(states)], [np.asarray(ts0.anchor)]
    for t in range(30):
        # Go somewhere, or open / close where the agent is: states are revisited often.
        here = np.minimum(np.asarray(states.agent), num_rec - 1)
        kind = rng.integers(0, 3, B)
        ids = np.where(kind == 0, rng.integers(0, num_rec, B), kind * num_rec + here)
        states, ts = BATCHED.act(states, ids, TRAIN, seed=t)
        rows.append(fields(states))
        anchors.append(np.asarray(ts.anchor))
        np.testing.assert_array_equal(anchors[-1], np.asarray(jax.vmap(ENV.anchor)(states)))
    by_anchor, by_state = {}, {}
    for anchor, row in zip(np.concatenate(anchors).tolist(), map(bytes, np.concatenate(rows))):
        by_anchor.setdefault(anchor, set()).add(row)
        by_state.setdefault(row, set()).add(anchor)
    assert len(by_state) > 500
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_household__random_token_actions_are_penalised_turns():
    states, _ = BATCHED.reset(BATCHED.keys(9), TRAIN)
    key = jax.random.key(10)
    invalid_count = 0
    for t in range(10):
        key_tokens, key_len, key = jax.random.split(key, 3)
        tokens = jax.random.randint(key_tokens, (B, A), 0, TOK.vocab_size)
        lens = jax.random.randint(key_len, (B,), 0, A + 1)
        states, ts = BATCHED.step(BATCHED.keys(t), states, tokens, lens, TRAIN)
        reward, invalid = np.asarray(ts.reward), ~np.asarray(ts.valid_action)
        assert np.isfinite(reward).all() and invalid.all()
        np.testing.assert_allclose(reward, -0.05, rtol=1e-6)
        assert ((np.asarray(ts.obs_len) > 0) & (np.asarray(ts.obs_len) <= ENV.max_obs_len)).all()
        invalid_count += invalid.sum()
    assert invalid_count == 10 * B


def test_household__render_is_readable():
    state = ENV.make_state(
        {"mug 1": "inventory", "apple 2": "fridge 1"},
        "put a cool apple in countertop",
        agent="fridge 1",
        opened=["fridge 1"],
        seen=["fridge 1"],
        clean=["mug 1"],
        hot=["mug 1"],
    )
    assert ENV.render(state).splitlines() == [
        "goal: put a cool apple in countertop",
        "agent: at fridge 1, step 0/40",
        "holding: mug 1 (clean, hot)",
        "countertop 1 [unseen]: -",
        "table 1 [unseen]: -",
        "shelf 1 [unseen]: -",
        "cabinet 1 [closed, unseen]: -",
        "cabinet 2 [closed, unseen]: -",
        "drawer 1 [closed, unseen]: -",
        "drawer 2 [closed, unseen]: -",
        "fridge 1 [open, seen]: apple 2",
        "microwave 1 [closed, unseen]: -",
        "sink 1 [unseen]: -",
    ]
    # The oracle first puts down the useless mug, then takes and cools the apple.
    plan = [ENV.action_strings[a] for a in ENV.oracle_actions(state)]
    assert plan[:3] == [
        "put mug 1 in fridge 1",
        "take apple 2 from fridge 1",
        "cool apple 2 with fridge",
    ]
    assert plan[-1] == "put apple 2 in countertop 1"


def test_household__errors_name_the_bad_value():
    with pytest.raises(ValueError, match="bogus.*train"):
        ENV.make_split("bogus")
    with pytest.raises(ValueError, match="unknown receptacle 'attic'"):
        ENV.make_state({"mug 1": "attic"}, "put a mug in shelf")
    with pytest.raises(ValueError, match="unknown goal"):
        ENV.make_state({"mug 1": "table 1"}, "put a mug in sink")
    with pytest.raises(ValueError, match="not in the action table"):
        ENV.action_id("go to attic")
