"""Tests for rl4agents.envs.sokoban: hand-checked dynamics, generation, splits, oracle.

Every jitted function is built once per env at import with a fixed batch B and episode length L,
so the file compiles each of them once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import registry, sokoban
from tests.envs import helpers

A = 4  # action slots
B = 64  # episodes per batched call
UP, DOWN, LEFT, RIGHT = range(4)
ENV = sokoban.Sokoban()
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
TWO_BOXES = "######\n#@$._#\n#____#\n#_$._#\n#____#\n######"


def _batched(env):
    """Batched reset and play of L = 2 N^2 turns (longer than any oracle plan)."""
    return helpers.ScanBatch(env, B, length=2 * env.config.size * env.config.size)


BATCHED = _batched(ENV)
BATCHED_OOD = _batched(OOD_ENV)
_step = jax.jit(ENV.step)


def _codes(states):
    """uint8[B, N * N] exact room contents of a batch of states."""
    codes = jax.vmap(sokoban.cell_codes)(states)
    return np.asarray(codes).reshape(codes.shape[0], -1).astype(np.uint8)


def _play_text(room, actions, env=ENV):
    state = env.state_from_text(room)
    out = []
    for action in actions:
        state, ts = _step(jax.random.key(0), state, *helpers.action(env, action, A), TRAIN)
        out.append((state, ts))
    return out


def test_sokoban__registered_with_builtin_sizes():
    env = registry.make("sokoban")
    assert isinstance(env, sokoban.Sokoban)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (42, 45, 1)
    assert env.num_actions == 4 and (env.carve_steps, env.reverse_steps) == (20, 40)
    assert (OOD_ENV.config.size, OOD_ENV.config.num_boxes, OOD_ENV.max_prompt_len) == (7, 2, 56)


def test_sokoban__push_onto_and_off_target_rewards():
    (s1, ts1), (s2, ts2), (s3, ts3) = _play_text(TWO_BOXES, [RIGHT, RIGHT, RIGHT])
    assert ts1.reward == pytest.approx(1.0 - 0.1) and not ts1.done
    assert ENV.render(s1).startswith("######\n#_@*_#\n")
    assert ts2.reward == pytest.approx(-1.0 - 0.1) and not ts2.done
    assert ENV.render(s2).startswith("######\n#__+$#\n")
    # Box against the wall: nothing moves, only the step penalty.
    assert ts3.reward == pytest.approx(-0.1) and ts3.valid_action
    jax.tree.map(np.testing.assert_array_equal, s3, s2)


def test_sokoban__box_cannot_be_pushed_into_box_or_walk_into_wall():
    room = "######\n#@$$.#\n#____#\n#___.#\n#____#\n######"
    start = ENV.state_from_text(room)
    for action in (RIGHT, UP, LEFT):
        ((state, ts),) = _play_text(room, [action])
        jax.tree.map(np.testing.assert_array_equal, state, start)
        assert ts.reward == pytest.approx(-0.1) and ts.valid_action and not ts.done


def test_sokoban__solving_gives_finish_bonus_and_is_absorbing():
    steps = _play_text(TWO_BOXES, [RIGHT, DOWN, LEFT, DOWN, RIGHT, LEFT])
    rewards = [float(ts.reward) for _, ts in steps[:5]]
    np.testing.assert_allclose(rewards, [0.9, -0.1, -0.1, -0.1, 1.0 - 0.1 + 10.0], rtol=1e-6)
    solved, ts = steps[4]
    assert ts.done and ts.success and bool(solved.done)
    after, ts_after = steps[5]
    jax.tree.map(np.testing.assert_array_equal, after, solved)
    assert ts_after.done and ts_after.reward == 0.0 and ts_after.obs_len == 0
    assert ts_after.anchor == ts.anchor
    ((_, ts_one),) = _play_text("######\n#@$._#\n#____#\n#____#\n#____#\n######", [RIGHT])
    assert ts_one.done and ts_one.success and ts_one.reward == pytest.approx(10.9)


def test_sokoban__invalid_action_is_penalised_and_reported():
    state = ENV.state_from_text(TWO_BOXES)
    tokens = jnp.asarray(ENV.tokenizer.encode("push box") + [0, 0], jnp.int32)
    new, ts = _step(jax.random.key(0), state, tokens, jnp.asarray(2), TRAIN)
    assert not ts.valid_action and not ts.done
    assert ts.reward == pytest.approx(-0.2)
    jax.tree.map(np.testing.assert_array_equal, new, state)
    decoded = ENV.tokenizer.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])
    assert decoded.startswith("invalid action\n")
    assert decoded.split("\n", 1)[1].replace(" ", "") == ENV.render(state)
    assert int(ts.obs_len) == ENV.max_obs_len


def test_sokoban__jit_matches_eager_on_short_episode():
    states, _ = BATCHED.reset(BATCHED.keys(3), TRAIN)
    start = helpers.index(states, 0)
    actions = [helpers.action(ENV, a, A) for a in (RIGHT, DOWN, LEFT)]
    actions += [(jnp.full((A,), 9, jnp.int32), jnp.asarray(2))]
    actions += [helpers.action(ENV, a, A) for a in (UP, UP, RIGHT, DOWN)]

    def episode(step_fn):
        state, out = start, []
        for i, (tokens, length) in enumerate(actions):
            state, ts = step_fn(jax.random.key(i), state, tokens, length, TRAIN)
            out.append(ts)
        return state, out

    jax.tree.map(np.testing.assert_array_equal, episode(_step), episode(ENV.step))


def test_sokoban__vmap_reset_over_64_keys_gives_wellformed_rooms():
    for params in (TRAIN, TEST):
        states, ts = BATCHED.reset(BATCHED.keys(0), params)
        assert ts.obs_tokens.shape == (B, ENV.max_prompt_len)
        assert (np.asarray(ts.obs_len) == ENV.max_prompt_len).all()
        walls, boxes = np.asarray(states.walls), np.asarray(states.boxes)
        targets, player = np.asarray(states.targets), np.asarray(states.player)
        assert walls[:, 0].all() and walls[:, -1].all()
        assert walls[:, :, 0].all() and walls[:, :, -1].all()
        assert (boxes.sum(axis=(1, 2)) == 1).all() and (targets.sum(axis=(1, 2)) == 1).all()
        assert not (boxes & walls).any() and not (targets & walls).any()
        rows = np.arange(B)
        assert not walls[rows, player[:, 0], player[:, 1]].any()
        assert not boxes[rows, player[:, 0], player[:, 1]].any()
        assert (np.asarray(jax.vmap(sokoban.box_distance)(states)) >= 2).all()
        assert not np.asarray(ts.done).any() and not np.asarray(states.done).any()
        assert len(set(map(bytes, _codes(states)))) > B // 2  # small rooms repeat sometimes
        first = ENV.tokenizer.decode(np.asarray(ts.obs_tokens[0])).replace(" ", "")
        assert first == ENV.render(helpers.index(states, 0))


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_sokoban__oracle_solves_every_generated_room(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    for seed in range(4 if split != "ood" else 3):
        states, _ = batched.reset(batched.keys(seed), params)
        plans = np.zeros((B, batched.length), np.int32)  # padding turns act after done
        lengths = np.zeros((B,), np.int32)
        for i in range(B):
            plan = env.oracle_actions(helpers.index(states, i))
            assert plan is not None and 0 < len(plan) <= batched.length
            plans[i, : len(plan)], lengths[i] = plan, len(plan)
        final, _, ts = batched.play(seed, states, *helpers.ids_to_tokens(env, plans, A), params)
        assert np.asarray(final.done).all()
        assert np.asarray(ts.success).any(axis=1).all()
        on_target = np.asarray(states.boxes & states.targets).sum(axis=(1, 2))
        expected = -0.1 * lengths + (env.config.num_boxes - on_target) + 10.0
        np.testing.assert_allclose(np.asarray(ts.reward).sum(axis=1), expected, atol=1e-4)
        # The plan solves the room exactly at its last move.
        solved_at = np.asarray(ts.success).argmax(axis=1)
        np.testing.assert_array_equal(solved_at, lengths - 1)


def test_sokoban__train_and_test_puzzles_are_disjoint():
    """No puzzle (walls, targets, boxes) is in both splits, whatever the player's start: the
    split class hashes the room without the player."""

    def puzzles(params, num_batches):
        states = [BATCHED.reset(BATCHED.keys(100 + s), params)[0] for s in range(num_batches)]
        states = jax.tree.map(lambda *x: np.concatenate(x), *states)
        static = np.asarray(jax.vmap(sokoban.world._static_cells)(states))
        static = static.reshape(len(states.player), -1)
        return static, np.asarray(jax.vmap(sokoban.puzzle_hash)(states)), _codes(states)

    train, _, train_rooms = puzzles(TRAIN, 8)  # 512 rooms
    test, hash_test, test_rooms = puzzles(TEST, 4)  # 256 rooms
    set_train, set_test = set(map(bytes, train)), set(map(bytes, test))
    assert not set_train & set_test
    assert len(set_train) > 350 and len(set_test) > 175
    assert (hash_test % 1000 < 200).all()
    room = sokoban.fallback_room(ENV.config.size, ENV.config.num_boxes)
    fallback = _codes(jax.tree.map(lambda x: x[None], room))[0]
    assert not (train_rooms == fallback).all(axis=1).any()
    assert not (test_rooms == fallback).all(axis=1).any()


def test_sokoban__puzzle_hash_ignores_the_player_and_room_hash_does_not():
    state = ENV.state_from_text("######\n#__@_#\n#_$__#\n###_.#\n######\n######")
    moved = state.replace(player=jnp.asarray([2, 1], state.player.dtype))
    assert int(sokoban.puzzle_hash(state)) == int(sokoban.puzzle_hash(moved))
    assert int(sokoban.room_hash(state)) != int(sokoban.room_hash(moved))


def test_sokoban__ood_rooms_are_larger_with_two_boxes():
    states, ts = BATCHED_OOD.reset(BATCHED_OOD.keys(5), OOD_PARAMS)
    assert states.walls.shape == (B, 7, 7) and ts.obs_tokens.shape == (B, 56)
    assert (np.asarray(states.boxes).sum(axis=(1, 2)) == 2).all()
    assert (np.asarray(jax.vmap(sokoban.box_distance)(states)) >= 4).all()


def test_sokoban__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(7), TRAIN)
    ids = np.asarray(jax.random.randint(jax.random.key(8), (B, BATCHED.length), 0, 4))
    _, seq, ts = BATCHED.play(7, states, *helpers.ids_to_tokens(ENV, ids, A), TRAIN)
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), seq)
    codes = np.concatenate([_codes(states), _codes(flat)])
    anchors = np.concatenate([np.asarray(ts0.anchor), np.asarray(ts.anchor).ravel()])
    by_anchor, by_state = {}, {}
    for anchor, code in zip(anchors.tolist(), map(bytes, codes), strict=True):
        by_anchor.setdefault(anchor, set()).add(code)
        by_state.setdefault(code, set()).add(anchor)
    assert len(by_state) > 500
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_sokoban__random_token_actions_never_crash():
    states, _ = BATCHED.reset(BATCHED.keys(9), TRAIN)
    shape = (B, BATCHED.length)
    tokens, lengths = helpers.random_actions(
        ENV.tokenizer.vocab_size, jax.random.key(10), jax.random.key(11), shape, A
    )
    _, _, ts = BATCHED.play(9, states, tokens, lengths, TRAIN)
    reward, obs_len = np.asarray(ts.reward), np.asarray(ts.obs_len)
    assert np.isfinite(reward).all()
    assert ((obs_len >= 0) & (obs_len <= ENV.max_obs_len)).all()
    invalid = ~np.asarray(ts.valid_action)
    assert invalid.mean() > 0.5
    np.testing.assert_allclose(reward[invalid], -0.2, rtol=1e-6)


def test_sokoban__render_round_trips_through_state_from_text():
    assert ENV.render(ENV.state_from_text(TWO_BOXES)) == TWO_BOXES + "\n"
    states, _ = BATCHED.reset(BATCHED.keys(0), TRAIN)
    for i in range(4):
        state = helpers.index(states, i)
        room = ENV.render(state)
        assert room.count("\n") == 6 and set(room) <= set("#_.$*@+\n")
        assert room.count("@") + room.count("+") == 1
        jax.tree.map(np.testing.assert_array_equal, ENV.state_from_text(room), state)


def test_sokoban__oracle_on_hand_rooms():
    plan = ENV.oracle_actions(ENV.state_from_text(TWO_BOXES))
    # the shortest solutions: push the top box right, walk to the bottom box's left side
    # (three moves), push it right
    assert len(plan) == 5
    played = _play_text(TWO_BOXES, plan)
    finished = [bool(ts.done) for _, ts in played]
    assert finished == [False] * 4 + [True] and bool(played[-1][1].success)
    assert "$" not in ENV.render(played[-1][0]) and ENV.render(played[-1][0]).count("*") == 2
    # 5 steps at -0.1, each box pushed onto a target +1, the room solved +10
    total = sum(float(ts.reward) for _, ts in played)
    assert total == pytest.approx(5 * -0.1 + 2 * 1.0 + 10.0)
    stuck = "######\n#$___#\n#____#\n#__._#\n#@___#\n######"  # box in a corner
    assert ENV.oracle_actions(ENV.state_from_text(stuck)) is None
    done = "######\n#*___#\n#____#\n#____#\n#@___#\n######"
    assert ENV.oracle_actions(ENV.state_from_text(done)) == []


def test_sokoban__unknown_split_raises():
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
