"""Tests for rl4agents.envs.maze: hand-checked dynamics, generation, splits, both oracles.

Each jitted function is built once per env at import (batched reset and one batched turn over
B episodes, one single-episode step), so the file compiles each of them once; multi-turn play
loops over the batched turn on the host, which also lets the oracles act closed-loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import maze, registry
from tests.envs import helpers

UP, DOWN, LEFT, RIGHT = range(4)
B = 64  # episodes per batched call
ENV = maze.Maze()
A = ENV.max_action_len + 2  # action slots passed to `step` (room for junk tokens)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
SHAPED = maze.Maze(progress_reward=0.1, explore_reward=0.01)
# Not a perfect maze (the right half is cut off from the rest): dynamics only.
HAND = """\
#########
#P__#___#
###_#_###
#___#___#
#_#####_#
#_____#_#
#####_#_#
#G____#_#
#########"""
CUT_OFF = HAND.replace("#P__#___#", "#___#_P_#")  # the agent in the right half


class Batched(helpers.StepBatch):
    """`helpers.StepBatch` over B episodes, plus closed-loop play of a policy."""

    def __init__(self, env):
        super().__init__(env, A, B)

    def closed_loop(self, states, policy, params, max_turns):
        """Plays `policy(state) -> plan` every turn (first action) until all are done.

        Returns (final states, int[B] turns taken, bool[B] success, float[B] return).
        """
        turns, success, ret = np.zeros(B, int), np.zeros(B, bool), np.zeros(B)
        for _ in range(max_turns):
            host = jax.device_get(states)
            if np.asarray(host.done).all():
                break
            actions = []
            for i in range(B):
                plan = None if host.done[i] else policy(helpers.index(host, i))
                actions.append(plan[0] if plan else 0)
            turns += ~np.asarray(host.done)
            states, ts = self.act(states, actions, params)
            success |= np.asarray(ts.success)
            ret += np.asarray(ts.reward)
        return states, turns, success, ret


BATCHED = Batched(ENV)
BATCHED_OOD = Batched(OOD_ENV)
_step = jax.jit(ENV.step)
_shaped_step = jax.jit(SHAPED.step)


def _decode(env, ts) -> str:
    """Observation text of a TimeStep without the tokenizer's spaces between tokens."""
    ids = np.asarray(ts.obs_tokens)[: int(ts.obs_len)]
    return env.tokenizer.decode(ids).replace(" ", "")


def _window(render: str, pos, r=1) -> str:
    """Reference view: the (2r+1)^2 window of a rendered maze around pos, "#" off-grid."""
    rows = render.replace(".", "_").strip().split("\n")
    out = []
    for i in range(pos[0] - r, pos[0] + r + 1):
        row = [
            rows[i][j] if 0 <= i < len(rows) and 0 <= j < len(rows) else "#"
            for j in range(pos[1] - r, pos[1] + r + 1)
        ]
        out.append("".join(row) + "\n")
    return "".join(out)


def _play(env, start, actions, step=_step):
    state, out = start, []
    for a in actions:
        tokens = helpers.encode(env, "jump", A) if a is None else helpers.action(env, a, A)
        state, ts = step(jax.random.key(0), state, *tokens, env.default_params())
        out.append((state, ts))
    return out


def _reachable(free, start):
    """Set of cells 4-connected to start through free cells (host flood fill)."""
    seen, todo = {start}, [start]
    while todo:
        row, col = todo.pop()
        for drow, dcol in maze.DELTAS.tolist():
            nxt = (row + drow, col + dcol)
            if free[nxt] and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _keys(states):
    """bytes per episode of (walls, goal, pos): the environment state the anchor hashes."""
    walls = np.asarray(states.walls).reshape(len(states.pos), -1).astype(np.uint8)
    rest = np.concatenate([np.asarray(states.goal), np.asarray(states.pos)], axis=1)
    return [w.tobytes() + r.astype(np.int32).tobytes() for w, r in zip(walls, rest)]


def test_maze__registered_with_builtin_sizes():
    env = registry.make("maze")
    assert isinstance(env, maze.Maze)
    # 3 x 3 one-token cells, 2 row breaks, the end "\n"; "invalid action allowed: ..." is 8.
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (12, 20, 1)
    assert env.num_actions == 4 and env.side == 9
    compact = maze.Maze(compact=True)
    assert (compact.max_prompt_len, compact.max_obs_len) == (10, 11)
    assert (OOD_ENV.config.size, OOD_ENV.side, OOD_ENV.max_prompt_len) == (6, 13, 12)
    assert maze.Maze(view_radius=2).max_prompt_len == 25 + 4 + 1


def test_maze__moves_walls_and_window_by_hand():
    start = ENV.state_from_text(HAND)
    (s1, ts1), (s2, ts2), (s3, ts3) = _play(ENV, start, [RIGHT, UP, LEFT])
    assert _decode(ENV, ts1) == "###\n_P_\n##_\n"
    assert ts1.valid_action and ts1.reward == 0.0 and not ts1.done
    np.testing.assert_array_equal(s1.pos, [1, 2])
    # Into a wall: a valid turn that moves nothing.
    assert _decode(ENV, ts2) == "###\n_P_\n##_\n"
    assert ts2.valid_action and ts2.reward == 0.0
    np.testing.assert_array_equal(s2.pos, [1, 2])
    assert _decode(ENV, ts3) == "###\n#P_\n###\n"
    assert ENV.render(s3).split("\n")[1] == "#P._#___#"  # visited cells render as "."
    assert int(np.asarray(s3.visited).sum()) == 2


def test_maze__goal_shows_only_in_view_and_ends_the_episode():
    start = ENV.state_from_text(HAND.replace("P", "_").replace("#G____#", "#G__P_#"))
    steps = _play(ENV, start, [LEFT, LEFT, LEFT, RIGHT])
    (s1, ts1), (s2, ts2), (s3, ts3), (s4, ts4) = steps
    assert _decode(ENV, ts1) == "###\n_P_\n###\n" and ts1.reward == 0.0
    assert _decode(ENV, ts2) == "###\nGP_\n###\n" and not ts2.done
    assert _decode(ENV, ts3) == "###\n#P_\n###\n"
    assert ts3.done and ts3.success and ts3.reward == pytest.approx(1.0) and bool(s3.done)
    # Absorbing: state frozen, empty observation, no reward, same anchor, no second success.
    jax.tree.map(np.testing.assert_array_equal, s4, s3)
    assert ts4.done and not ts4.success and ts4.reward == 0.0 and ts4.obs_len == 0
    assert ts4.anchor == ts3.anchor


def test_maze__invalid_action_is_penalised_and_lists_the_allowed_words():
    start = ENV.state_from_text(HAND)
    ((state, ts),) = _play(ENV, start, [None])
    assert not ts.valid_action and not ts.done and ts.reward == pytest.approx(-0.05)
    jax.tree.map(np.testing.assert_array_equal, state, start)
    decoded = ENV.tokenizer.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])
    assert decoded.startswith("invalid action allowed: up down left right\n")
    assert decoded.split("\n", 1)[1].replace(" ", "") == "###\n#P_\n###\n"
    assert int(ts.obs_len) == ENV.max_obs_len
    compact = maze.Maze(compact=True)
    ((_, ts_c),) = _play(compact, compact.state_from_text(HAND), [None], step=jax.jit(compact.step))
    assert _decode(compact, ts_c) == "invalid###" + "#P_###\n"


def test_maze__progress_and_explore_rewards():
    start = SHAPED.state_from_text(HAND)
    assert int(start.dist[1, 1]) == 18  # the hand maze's path to the goal
    steps = _play(SHAPED, start, [RIGHT, UP, LEFT, RIGHT, None], step=_shaped_step)
    rewards = [float(ts.reward) for _, ts in steps]
    # Toward the goal and new: 0.1 + 0.01; wall: 0; back (away, seen): -0.1; again: +0.1.
    np.testing.assert_allclose(rewards, [0.11, 0.0, -0.1, 0.1, -0.05], rtol=1e-5)
    right_half = SHAPED.state_from_text(CUT_OFF)
    assert int(right_half.dist[1, 6]) == maze.far_distance(9)  # cut off from the goal
    ((_, ts),) = _play(SHAPED, right_half, [LEFT], step=_shaped_step)
    assert float(ts.reward) == pytest.approx(0.01)  # no distance change between far cells


def test_maze__vmapped_reset_gives_perfect_mazes():
    n, side = ENV.config.size, ENV.side
    for params in (TRAIN, TEST):
        states, ts = BATCHED.reset(BATCHED.keys(0), params)
        walls = np.asarray(states.walls)
        assert walls.shape == (B, side, side) and ts.obs_tokens.shape == (B, ENV.max_prompt_len)
        assert walls[:, 0].all() and walls[:, -1].all() and walls[:, :, 0].all()
        assert walls[:, :, -1].all() and walls[:, ::2, ::2].all()
        assert not walls[:, 1::2, 1::2].any()  # every room open
        assert ((~walls).sum(axis=(1, 2)) == n * n + n * n - 1).all()  # n^2 - 1 passages
        dist = np.asarray(states.dist)
        assert (dist[~walls] < maze.far_distance(side)).all()  # connected, hence a tree
        goal, pos = np.asarray(states.goal), np.asarray(states.pos)
        assert (goal % 2 == 1).all() and (pos % 2 == 1).all() and (goal != pos).any(axis=1).all()
        assert (np.asarray(states.visited).sum(axis=(1, 2)) == 1).all()
        assert not np.asarray(ts.done).any() and (np.asarray(ts.obs_len) == 12).all()
        # DFS mazes of 4 x 4 rooms repeat now and then (about 3.8k distinct in 20k draws).
        assert len(set(map(bytes, walls.reshape(B, -1)))) > B - 6
        for i in range(4):
            state = helpers.index(states, i)
            assert _decode(ENV, helpers.index(ts, i)) == _window(ENV.render(state), state.pos)


def test_maze__carve_and_distance_map_helpers():
    for algorithm in maze.ALGORITHMS:
        env = maze.Maze(algorithm=algorithm)
        bits = jax.random.bits(jax.random.key(3), (16, env.carve_bits), jnp.uint32)
        walls = np.asarray(jax.vmap(env.carve)(bits))
        assert ((~walls).sum(axis=(1, 2)) == 31).all() and not walls[:, 1::2, 1::2].any()
        assert walls[:, ::2, ::2].all() and walls[:, 0].all() and walls[:, :, -1].all()
        for w in walls:  # connected with n^2 - 1 passages: a spanning tree of the rooms
            assert len(_reachable(~w, (1, 1))) == 31
        assert len(set(map(bytes, walls))) == 16
    assert maze.Maze(algorithm="prim").carve_bits == 1 + 15 * 24
    serp = maze.serpentine_walls(3)
    assert "".join("".join("#_"[int(c)] for c in ~row) + "\n" for row in serp) == (
        "#######\n#_____#\n#####_#\n#_____#\n#_#####\n#_____#\n#######\n"
    )
    dist = np.asarray(maze.distance_map(jnp.asarray(serp), jnp.asarray([5, 5])))
    assert dist[5, 5] == 0 and dist[1, 1] == 16 and dist[0, 0] == 49


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_maze__bfs_oracle_solves_every_generated_task(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    for seed in range(4):  # 256 tasks
        states, _ = batched.reset(batched.keys(100 + seed), params)
        start = jax.device_get(states)
        final, turns, success, ret = batched.closed_loop(
            states, env.oracle_actions, params, max_turns=2 * env.config.size**2
        )
        assert success.all() and np.asarray(final.done).all()
        np.testing.assert_allclose(ret, 1.0)
        # Shortest paths: exactly the BFS distance from the start.
        rows = np.arange(B)
        np.testing.assert_array_equal(turns, start.dist[rows, start.pos[:, 0], start.pos[:, 1]])
        assert (turns >= env.config.min_distance).all()


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_maze__exploration_oracle_solves_every_generated_task(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    states, _ = batched.reset(batched.keys(200), params)
    # A depth-first traversal of the tree's 2 n^2 - 2 edges, both ways.
    bound = 4 * env.config.size**2
    _, turns, success, ret = batched.closed_loop(states, env.explore_actions, params, bound)
    assert success.all()
    np.testing.assert_allclose(ret, 1.0)
    assert (turns <= bound - 4).all()
    start = jax.device_get(states)
    shortest = start.dist[np.arange(B), start.pos[:, 0], start.pos[:, 1]]
    assert (turns >= shortest).all() and (turns > shortest).any()


def test_maze__exploration_oracle_ignores_unseen_cells():
    states, _ = BATCHED.reset(BATCHED.keys(5), TRAIN)
    ids = np.asarray(jax.random.randint(jax.random.key(6), (6, B), 0, 4))
    for turn_ids in ids:
        states, _ = BATCHED.act(states, turn_ids, TRAIN)
    host = jax.device_get(states)
    rng = np.random.default_rng(0)
    checked = 0
    for i in range(B):
        state = helpers.index(host, i)
        seen = ENV.seen_cells(state)
        if state.done or seen[tuple(state.goal)]:
            continue
        plan = ENV.explore_actions(state)
        # Any other maze behind the seen cells, and the goal anywhere unseen: same action.
        walls = np.where(seen, state.walls, rng.random(state.walls.shape) < 0.5)
        open_unseen = np.argwhere(~seen & ~walls)
        if len(open_unseen) == 0:
            continue
        other = state.replace(walls=walls, goal=open_unseen[rng.integers(len(open_unseen))])
        assert ENV.explore_actions(other)[0] == plan[0]
        checked += 1
    assert checked > B // 2


def test_maze__oracles_on_the_hand_maze():
    state = ENV.state_from_text(HAND)
    plan = ENV.oracle_actions(state)
    assert len(plan) == 18 and plan[:4] == [RIGHT, RIGHT, DOWN, DOWN]
    assert ENV.explore_actions(state) == [RIGHT]  # (1, 2) still has unseen cells around it
    cut_off = ENV.state_from_text(CUT_OFF)
    assert ENV.oracle_actions(cut_off) is None
    at_goal = _play(
        ENV, ENV.state_from_text(HAND.replace("G_", "GP").replace("P_", "__", 1)), [LEFT]
    )
    assert ENV.oracle_actions(at_goal[0][0]) == [] and ENV.explore_actions(at_goal[0][0]) == []


def test_maze__vmapped_step_matches_single_episode_step():
    states, _ = BATCHED.reset(BATCHED.keys(7), TRAIN)
    ids = np.arange(B) % 4
    new, ts = BATCHED.act(states, ids, TRAIN)
    for i in (0, 1, 2, 3, B - 1):
        single, ts_single = _step(
            jax.random.key(0), helpers.index(states, i), *helpers.action(ENV, ids[i], A), TRAIN
        )
        jax.tree.map(np.testing.assert_array_equal, single, helpers.index(new, i))
        jax.tree.map(np.testing.assert_array_equal, ts_single, helpers.index(ts, i))


def test_maze__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(8), TRAIN)
    keys, anchors = _keys(jax.device_get(states)), list(np.asarray(ts0.anchor))
    ids = np.asarray(jax.random.randint(jax.random.key(9), (24, B), 0, 4))
    for turn_ids in ids:
        states, ts = BATCHED.act(states, turn_ids, TRAIN)
        keys += _keys(jax.device_get(states))
        anchors += list(np.asarray(ts.anchor))
    by_anchor, by_state = {}, {}
    for anchor, key in zip(anchors, keys, strict=True):
        by_anchor.setdefault(int(anchor), set()).add(key)
        by_state.setdefault(key, set()).add(int(anchor))
    assert len(by_state) > 300
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())
    # The visited history is not part of the anchor.
    state = ENV.state_from_text(HAND)
    revisited = state.replace(visited=state.visited.at[1, 2].set(True))
    assert ENV.anchor(state) == ENV.anchor(revisited)
    assert ENV.anchor(state) != ENV.anchor(state.replace(pos=jnp.asarray([1, 2])))


def test_maze__train_test_and_ood_layouts_are_disjoint_classes():
    def layouts(batched, params, seeds):
        return np.concatenate(
            [
                np.asarray(batched.reset(batched.keys(300 + s), params)[0].walls).reshape(B, -1)
                for s in range(seeds)
            ]
        )

    train, test = layouts(BATCHED, TRAIN, 8), layouts(BATCHED, TEST, 4)  # 512 and 256
    set_train, set_test = set(map(bytes, train)), set(map(bytes, test))
    assert not set_train & set_test and len(set_train) > 400 and len(set_test) > 180
    hashes = lambda x: np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(x, jnp.int32)))  # noqa: E731
    assert (hashes(test) % 1000 < 200).all() and (hashes(train) % 1000 >= 200).all()
    ood = layouts(BATCHED_OOD, OOD_PARAMS, 2)
    assert ood.shape[1] == 13 * 13
    ood_test = hashes(ood) % 1000 < 200
    assert ood_test.any() and not ood_test.all()  # either class
    serpentine = maze.serpentine_walls(ENV.config.size).ravel()
    assert not (train == serpentine).all(axis=1).any()


def test_maze__random_token_actions_are_penalised_turns():
    states, _ = BATCHED.reset(BATCHED.keys(10), TRAIN)
    vocab = ENV.tokenizer.vocab_size
    for turn in range(8):
        key_tok, key_len = jax.random.split(jax.random.key(11 + turn))
        tokens, lengths = helpers.random_actions(vocab, key_tok, key_len, (B,), A)
        new, ts = BATCHED.step(BATCHED.keys(turn), states, tokens, lengths, TRAIN)
        invalid = ~np.asarray(ts.valid_action)
        assert invalid.mean() > 0.8
        np.testing.assert_allclose(np.asarray(ts.reward)[invalid], -0.05, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(new.pos)[invalid], np.asarray(states.pos)[invalid])
        obs_len = np.asarray(ts.obs_len)
        assert (obs_len[invalid] == ENV.max_obs_len).all()
        states = new


def test_maze__render_is_readable_and_round_trips():
    assert ENV.render(ENV.state_from_text(HAND)) == HAND + "\n"
    states, _ = BATCHED.reset(BATCHED.keys(12), TRAIN)
    states, _ = BATCHED.act(states, np.full(B, RIGHT), TRAIN)
    for i in range(4):
        state = helpers.index(states, i)
        picture = ENV.render(state)
        assert picture.count("\n") == 9 and set(picture) <= set("#_.GP\n")
        assert picture.count("P") == 1 and picture.count("G") == 1
        back = ENV.state_from_text(picture)
        jax.tree.map(np.testing.assert_array_equal, back, state)


def test_maze__arguments_and_splits_are_validated():
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="size must be >= 2"):
        maze.Maze(size=1)
    with pytest.raises(ValueError, match="view_radius must be >= 1"):
        maze.Maze(view_radius=0)
    with pytest.raises(ValueError, match="algorithm 'kruskal' is not allowed.*prim"):
        maze.Maze(algorithm="kruskal")
    with pytest.raises(ValueError, match="min_distance must be >= 2"):
        maze.Maze(min_distance=1)
    with pytest.raises(ValueError, match="test_fraction"):
        maze.Maze(test_fraction=1.5)
    with pytest.raises(ValueError, match="expected a 9x9 maze"):
        ENV.state_from_text("###\n#P#\n###")
