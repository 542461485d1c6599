"""Tests for rl4agents.envs.two_agent: roles, hand-checked dynamics, credit split, oracle.

Batched reset and step are jitted once per env at import (fixed batch B); single-episode steps
go through the batched step, and episodes are played turn by turn so the oracle acts
closed-loop.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import registry, two_agent
from tests.envs import helpers
from tests.envs.chars import CharTokenizer

B = 64  # episodes per batched call
ENV = two_agent.TwoAgent()
SHAPED = two_agent.TwoAgent(progress_reward=0.1)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
A = ENV.max_action_len + 1  # action slots
TOK = ENV.tokenizer
SAY = {d: i for i, d in enumerate(two_agent.DIRECTIONS)}  # guide message ids
MOVE = {d: i + len(two_agent.DIRECTIONS) for i, d in enumerate(two_agent.DIRECTIONS)}
MAP = "W____\n_##__\n___#_\n_#___\n___#G"
# Invalid messages as the policy would send them: a walker's move on a guide turn and back.
GUIDE_INVALID = "invalid message . allowed: say up , say down , say left , say right , say stay\n"
WALKER_INVALID = "invalid move . allowed: up , down , left , right , stay\n"


def _obs(ts) -> list[int]:
    return np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()


BATCHED = helpers.StepBatch(ENV, A, B)
BATCHED_OOD = helpers.StepBatch(OOD_ENV, A, B)
BATCHED_SHAPED = helpers.StepBatch(SHAPED, A, B)


def test_two_agent__registered_with_builtin_sizes_and_roles():
    env = registry.make("two_agent")
    assert isinstance(env, two_agent.TwoAgent)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (109, 90, 4)
    assert env.num_actions == 10 and env.num_agents == 2
    assert two_agent.ACTIONS[:2] == ("say up", "say down") and two_agent.ACTIONS[5] == "up"
    assert (OOD_ENV.config.size, OOD_ENV.config.max_steps, OOD_ENV.max_prompt_len) == (7, 64, 135)
    assert [ENV.agent_of_turn(k) for k in range(4)] == [0, 1, 0, 1]
    np.testing.assert_array_equal(two_agent.TwoAgent.agent_of_turn(jnp.arange(5)), [0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="max_steps must be >= 2 \\* min_distance"):
        two_agent.TwoAgent(max_steps=4)
    with pytest.raises(ValueError, match="size must be >= 3"):
        two_agent.TwoAgent(size=2)


def test_two_agent__hand_checked_turns_alternate_roles():
    state = ENV.state_from_text(MAP)
    script = [
        (SAY["right"], "walker:\nguide says right\n###\n#W_\n#_#\n", 0.0, True),
        (MOVE["right"], "guide:\n_W___\n_##__\n___#_\n_#___\n___#G\n", 0.0, True),
        # A move on a guide turn: the guide is penalised, the walker hears nothing.
        (MOVE["up"], GUIDE_INVALID + "walker:\nguide says nothing\n###\n_W_\n_##\n", -0.05, False),
        # A message on a walker turn: the walker is penalised and stays.
        (SAY["down"], WALKER_INVALID + "guide:\n_W___\n_##__\n___#_\n_#___\n___#G\n", -0.05, False),
        (SAY["down"], "walker:\nguide says down\n###\n_W_\n_##\n", 0.0, True),
        (MOVE["down"], "guide:\n_W___\n_##__\n___#_\n_#___\n___#G\n", 0.0, True),  # wall
        (SAY["left"], "walker:\nguide says left\n###\n_W_\n_##\n", 0.0, True),
        (MOVE["left"], "guide:\nW____\n_##__\n___#_\n_#___\n___#G\n", 0.0, True),
    ]
    steps = BATCHED.play(state, [a for a, *_ in script])
    for k, ((_, expected, reward, valid), (new, ts)) in enumerate(zip(script, steps)):
        assert _obs(ts) == TOK.encode(expected), (k, TOK.decode(_obs(ts)))
        assert float(ts.reward) == pytest.approx(reward) and bool(ts.valid_action) == valid
        assert not ts.done and int(new.steps) == k + 1
        role = two_agent.AGENTS[ENV.agent_of_turn(k + 1)]  # the next observation's role
        assert f"{role}:\n" in expected
    no_message = two_agent.NO_MESSAGE
    assert [int(s.message) for s, _ in steps[:3]] == [SAY["right"], no_message, no_message]


def test_two_agent__exact_text_spaces_the_message_and_fits_the_static_lengths():
    # A character-level tokenizer keeps every space: this is the text a chat model reads.
    env = two_agent.TwoAgent(tokenizer=CharTokenizer())
    tok = env.tokenizer
    step = jax.jit(env.step)
    state = env.state_from_text(MAP)
    view = "###\n#W_\n#_#\n"
    for action, expected in (
        ("say up", "walker:\nguide says up\n" + view),
        ("up", GUIDE_INVALID + "walker:\nguide says nothing\n" + view),
    ):
        ids = tok.encode(action)
        tokens = np.zeros((env.max_action_len,), np.int32)
        tokens[: len(ids)] = ids
        _, ts = step(jax.random.key(0), state, tokens, len(ids), TRAIN)
        assert tok.decode(_obs(ts)) == expected and int(ts.obs_len) == len(expected)
    # The bound: the longer invalid prefix, the longer status line, then the longer view (the
    # walker's with the longest message, "nothing": 3 rows of 3 cells).
    walker = len("walker:\nguide says nothing\n") + 3 * len("###\n")
    guide = len("guide:\n") + 5 * len("#####\n")
    status = len("the walker reached the goal .\n")
    assert env.max_obs_len == len(GUIDE_INVALID) + status + max(walker, guide) == 79 + 30 + 39
    intro = len(
        "the guide sees the map and says a move , the walker sees only nearby cells and "
        "moves : bring the walker W to the goal G .\n"
    )
    assert env.max_prompt_len == intro + guide


def test_two_agent__reaching_the_goal_and_running_out_of_turns():
    near = "_____\n_##__\n___#_\n_#__W\n___#G"
    state = ENV.state_from_text(near, steps=1, message="down")
    (reached, ts), (after, ts_after) = BATCHED.play(state, [MOVE["down"], SAY["up"]])
    expected = "the walker reached the goal .\nguide:\n_____\n_##__\n___#_\n_#___\n___#W\n"
    assert _obs(ts) == TOK.encode(expected)
    assert ts.done and ts.success and float(ts.reward) == 1.0 and ENV.oracle_actions(reached) == []
    jax.tree.map(np.testing.assert_array_equal, after, reached)
    assert ts_after.done and ts_after.reward == 0 and ts_after.obs_len == 0
    assert ts_after.anchor == ts.anchor and not ts_after.success

    late = ENV.state_from_text(MAP, steps=ENV.config.max_steps - 1, message="right")
    ((ended, ts),) = BATCHED.play(late, [MOVE["stay"]])
    expected = "out of turns .\nguide:\nW____\n_##__\n___#_\n_#___\n___#G\n"
    assert _obs(ts) == TOK.encode(expected)
    assert ts.done and not ts.success and float(ts.reward) == 0.0
    assert ENV.oracle_actions(ended) is None


def test_two_agent__walker_cannot_see_the_goal_and_reset_shows_the_map():
    state = ENV.state_from_text("_____\n_____\n_____\n___W_\n____G", steps=0)
    ((_, ts),) = BATCHED.play(state, [SAY["right"]])
    assert _obs(ts) == TOK.encode("walker:\nguide says right\n___\n_W_\n___\n")  # goal hidden
    states, first = BATCHED.reset(BATCHED.keys(0), TRAIN)
    for i in range(3):
        grid = ENV.render(helpers.index(states, i)).split("turn")[0]
        intro = (
            "the guide sees the map and says a move , the walker sees only nearby cells and "
            "moves : bring the walker W to the goal G .\n"
        )
        assert _obs(helpers.index(first, i)) == TOK.encode(intro + "guide:\n" + grid)


def test_two_agent__progress_reward_on_walker_turns_only():
    state = SHAPED.state_from_text(MAP)
    actions = [SAY["right"], MOVE["right"], SAY["left"], MOVE["left"], SAY["down"]]
    actions += [MOVE["down"], SAY["up"], MOVE["up"], SAY["up"], SAY["up"]]
    steps = BATCHED_SHAPED.play(state, actions)
    # right: closer (+), left: back (-), down: closer (+), up: back (-), then a walker's
    # message: invalid, no progress.
    expected = [0, 0.1, 0, -0.1, 0, 0.1, 0, -0.1, 0, -0.05]
    np.testing.assert_allclose([float(ts.reward) for _, ts in steps], expected, atol=1e-6)
    assert int(state.dist[0, 0]) == 8 and int(state.dist[4, 4]) == 0


def test_two_agent__per_agent_returns_split_team_reward_and_own_penalties():
    rewards = np.array([[0, 0, -0.05, 0, -0.05, 1.0, 5.0], [-0.05, -0.05, 0, 0, 0, 0, 0]])
    valid = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]], bool)
    action_valid = np.array([[1, 1, 0, 1, 0, 1, 1], [0, 0, 1, 1, 1, 1, 1]], bool)
    expected = [[0.9, 1.0], [-0.05, -0.05]]
    np.testing.assert_allclose(ENV.per_agent_returns(rewards, valid, action_valid), expected)
    np.testing.assert_allclose(ENV.per_agent_returns(rewards, valid), expected)
    # With shaping a step away is a (team) negative reward: validity must be given.
    shaped = np.array([[0, -0.1, -0.05, 0.1, 0, 1.0]])
    ok = np.ones_like(shaped, bool)
    act_ok = np.array([[1, 1, 0, 1, 1, 1]], bool)  # only the guide's second message was bad
    np.testing.assert_allclose(SHAPED.per_agent_returns(shaped, ok, act_ok), [[0.95, 1.0]])
    with pytest.raises(ValueError, match="needs turn_action_valid"):
        SHAPED.per_agent_returns(shaped, ok)


def test_two_agent__invalid_and_random_tokens_are_penalised_turns():
    state = ENV.state_from_text(MAP)
    for tokens in (TOK.encode("north"), TOK.encode("stay"), TOK.encode("up up"), []):
        ((new, ts),) = BATCHED.play(state, [tokens])
        assert not ts.valid_action and float(ts.reward) == pytest.approx(-0.05)
        prefix = TOK.encode(GUIDE_INVALID + "walker:\nguide says nothing\n")
        assert _obs(ts)[: len(prefix)] == prefix
        np.testing.assert_array_equal(new.pos, state.pos)
    states, _ = BATCHED.reset(BATCHED.keys(9), TRAIN)
    key = jax.random.key(10)
    for t in range(6):
        key_tokens, key_len, key = jax.random.split(key, 3)
        tokens = jax.random.randint(key_tokens, (B, A), 5, TOK.vocab_size)
        lens = jax.random.randint(key_len, (B,), 2, A + 1)
        states, ts = BATCHED.step(BATCHED.keys(t), states, tokens, lens, TRAIN)
        assert not np.asarray(ts.valid_action).any()
        np.testing.assert_allclose(np.asarray(ts.reward), -0.05, rtol=1e-6)
        assert (np.asarray(ts.obs_len) <= ENV.max_obs_len).all()


def _run_oracle(batched, params, seed):
    """Closed-loop oracle over B maps: success bool[B], turns int[B], per-agent returns."""
    env = batched.env
    states, _ = batched.reset(batched.keys(seed), params)
    start = jax.device_get(states)
    success, turns = np.zeros(B, bool), np.zeros(B, np.int32)
    rewards, alive, action_valid = [], [], []
    for t in range(env.config.max_steps):
        host = jax.device_get(states)
        done = np.asarray(host.done)
        if done.all():
            break
        ids = np.zeros(B, np.int32)
        for i in np.flatnonzero(~done):
            plan = env.oracle_actions(helpers.index(host, i))
            assert plan, (seed, i, env.render(helpers.index(host, i)))
            ids[i] = plan[0]
            assert (ids[i] < 5) == (env.agent_of_turn(t) == two_agent.GUIDE)
        states, ts = batched.act(states, ids, params, seed=seed * 1000 + t)
        success |= np.asarray(ts.success)
        turns += ~done
        rewards.append(np.asarray(ts.reward))
        alive.append(~done)
        action_valid.append(np.asarray(ts.valid_action))
    stack = lambda x: np.stack(x, axis=1)  # noqa: E731
    returns = env.per_agent_returns(stack(rewards), stack(alive), stack(action_valid))
    return start, success, turns, returns


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_two_agent__oracle_solves_every_generated_map_on_a_shortest_path(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    for seed in range(4):  # 256 maps
        start, success, turns, returns = _run_oracle(batched, params, seed)
        assert success.all(), np.flatnonzero(~success)
        dist = np.asarray(start.dist)[np.arange(B), start.pos[:, 0], start.pos[:, 1]]
        np.testing.assert_array_equal(turns, 2 * dist)  # one message and one move per step
        assert (dist >= env.config.min_distance).all() and (turns <= env.config.max_steps).all()
        np.testing.assert_allclose(returns, 1.0)  # no penalties: both agents get the team reward


def test_two_agent__oracle_roles_use_only_their_own_observation():
    states, _ = BATCHED.reset(BATCHED.keys(21), TRAIN)
    rng = np.random.default_rng(0)
    for i in range(16):
        state = helpers.index(states, i)
        # Guide: the first move of a shortest path (a neighbour one step closer).
        say = ENV.oracle_actions(state)[0]
        nxt = state.pos + two_agent.DELTAS[say]
        assert state.dist[tuple(nxt)] == state.dist[tuple(state.pos)] - 1
        # Walker: whatever the message says, whatever the map.
        message = int(rng.integers(0, two_agent.NO_MESSAGE + 1))
        walker_turn = state.replace(steps=np.int32(1), message=np.int32(message))
        move = ENV.oracle_actions(walker_turn)[0] - len(two_agent.DIRECTIONS)
        assert move == (message if message < two_agent.NO_MESSAGE else two_agent.STAY)


def test_two_agent__train_test_maps_disjoint_and_ood_larger():
    def maps(batched, params, seeds):
        rows = []
        for s in seeds:
            st, _ = batched.reset(batched.keys(s), params)
            walls = np.asarray(st.walls).reshape(B, -1).astype(np.int32)
            rows.append(np.concatenate([walls, np.asarray(st.pos), np.asarray(st.goal)], axis=1))
        return np.concatenate(rows)

    train, test = maps(BATCHED, TRAIN, range(100, 108)), maps(BATCHED, TEST, range(200, 204))
    set_train, set_test = set(map(bytes, train)), set(map(bytes, test))
    assert not set_train & set_test and len(set_train) > 500 and len(set_test) > 250
    hash_test = np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(test)))
    hash_train = np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(train)))
    assert (hash_test % 1000 < 200).all() and (hash_train % 1000 >= 200).all()
    ood = maps(BATCHED_OOD, OOD_PARAMS, [300])
    assert ood.shape[1] == 7 * 7 + 4
    states, ts = BATCHED_OOD.reset(BATCHED_OOD.keys(300), OOD_PARAMS)
    assert ts.obs_tokens.shape == (B, OOD_ENV.max_prompt_len)
    dist = np.asarray(states.dist)[np.arange(B), states.pos[:, 0], states.pos[:, 1]]
    assert dist.mean() > 4.5  # farther apart than on 5x5 maps


def test_two_agent__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(7), TRAIN)
    rng = np.random.default_rng(1)

    def fields(s):
        parts = (s.walls.reshape(B, -1), s.goal, s.pos, (s.steps % 2)[:, None], s.message[:, None])
        return np.concatenate([np.asarray(p, np.int32) for p in parts], axis=1)

    rows, anchors = [fields(states)], [np.asarray(ts0.anchor)]
    for t in range(30):
        ids = rng.integers(0, 5, B) + (t % 2) * 5  # a random message or move for the role
        states, ts = BATCHED.act(states, ids, TRAIN, seed=t)
        rows.append(fields(states))
        anchors.append(np.asarray(ts.anchor))
    by_anchor, by_state = collections.defaultdict(set), collections.defaultdict(set)
    for anchor, row in zip(np.concatenate(anchors).tolist(), map(bytes, np.concatenate(rows))):
        by_anchor[anchor].add(row)
        by_state[row].add(anchor)
    assert len(by_state) > 500 and len(by_state) < 31 * B  # states are revisited
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_two_agent__render_is_readable_and_round_trips():
    state = ENV.state_from_text(MAP, steps=3, message="left")
    assert ENV.render(state) == MAP + "\nturn 3/40, walker to act, message: left\n"
    again = ENV.state_from_text(ENV.render(state).split("turn")[0], steps=3, message="left")
    jax.tree.map(np.testing.assert_array_equal, again, state)
    with pytest.raises(ValueError, match="unknown message 'north'"):
        ENV.state_from_text(MAP, message="north")
    with pytest.raises(ValueError, match="bogus.*train"):
        ENV.make_split("bogus")
