"""Tests for rl4agents.envs.frozen_lake: hand-checked dynamics, generation, splits, oracle.

Every jitted function is built once per env at import with a fixed batch B and episode length L,
so the file compiles each of them once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import frozen_lake, registry
from tests.envs import helpers

A = 4  # action slots
B = 64  # episodes per batched call
UP, DOWN, LEFT, RIGHT = range(4)
ENV = frozen_lake.FrozenLake()
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
MAP = "P_O_\n____\n_O__\n___G"


def _batched(env):
    """Batched reset and play of L = 2 N^2 turns (longer than any oracle plan)."""
    return helpers.ScanBatch(env, B, length=2 * env.config.size * env.config.size)


BATCHED = _batched(ENV)
BATCHED_OOD = _batched(OOD_ENV)
_step = jax.jit(ENV.step)


def test_frozen_lake__registered_with_builtin_sizes():
    env = registry.make("frozen_lake")
    assert isinstance(env, frozen_lake.FrozenLake)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (20, 23, 1)
    assert env.num_actions == 4
    assert (OOD_ENV.config.size, OOD_ENV.max_prompt_len, OOD_ENV.max_obs_len) == (6, 42, 45)


def test_frozen_lake__hole_ends_episode_without_reward():
    state = ENV.state_from_text(MAP)
    state, ts = _step(jax.random.key(0), state, *helpers.action(ENV, RIGHT, A), TRAIN)
    assert not ts.done and ts.reward == 0.0 and ts.valid_action
    state, ts = _step(jax.random.key(0), state, *helpers.action(ENV, RIGHT, A), TRAIN)
    assert ts.done and not ts.success and ts.reward == 0.0
    assert tuple(np.asarray(state.pos)) == (0, 2)


def test_frozen_lake__goal_gives_reward_and_success():
    state = ENV.state_from_text("____\n____\n_O__\n__PG")
    state, ts = _step(jax.random.key(0), state, *helpers.action(ENV, RIGHT, A), TRAIN)
    assert ts.done and ts.success and ts.reward == pytest.approx(1.0)
    assert ENV.render(state) == "____\n____\n_O__\n___P\n"


def test_frozen_lake__off_grid_move_stays_without_penalty():
    state = ENV.state_from_text(MAP)
    for action in (UP, LEFT):
        new, ts = _step(jax.random.key(0), state, *helpers.action(ENV, action, A), TRAIN)
        assert ts.valid_action and ts.reward == 0.0 and not ts.done
        assert tuple(np.asarray(new.pos)) == (0, 0)
        assert ts.anchor == ENV.anchor(state)


def test_frozen_lake__invalid_action_is_penalised_and_reported():
    state = ENV.state_from_text(MAP)
    tokens = jnp.asarray(ENV.tokenizer.encode("jump now") + [0, 0], jnp.int32)
    new, ts = _step(jax.random.key(0), state, tokens, jnp.asarray(2), TRAIN)
    assert not ts.valid_action and not ts.done
    assert ts.reward == pytest.approx(-0.05)
    jax.tree.map(np.testing.assert_array_equal, new, state)
    decoded = ENV.tokenizer.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])
    assert decoded.startswith("invalid action\n")
    assert decoded.split("\n", 1)[1].replace(" ", "") == ENV.render(state)
    assert int(ts.obs_len) == ENV.max_obs_len
    # A valid word followed by junk, or a truncated length, is invalid too.
    up = int(ENV.action_tokens(UP)[0])
    for tokens, length in (([up, up, 0, 0], 2), ([up, 0, 0, 0], 0)):
        _, ts = _step(jax.random.key(0), state, jnp.asarray(tokens), jnp.asarray(length), TRAIN)
        assert not ts.valid_action


def test_frozen_lake__step_after_done_is_absorbing():
    state = ENV.state_from_text("____\n____\n_O__\n__PG")
    state, ts = _step(jax.random.key(0), state, *helpers.action(ENV, RIGHT, A), TRAIN)
    assert ts.done
    again, ts2 = _step(jax.random.key(1), state, *helpers.action(ENV, LEFT, A), TRAIN)
    jax.tree.map(np.testing.assert_array_equal, again, state)
    assert ts2.done and ts2.reward == 0.0 and ts2.obs_len == 0 and ts2.anchor == ts.anchor
    assert (np.asarray(ts2.obs_tokens) == ENV.tokenizer.pad_id).all()


def test_frozen_lake__jit_matches_eager_on_short_episode():
    states, _ = BATCHED.reset(BATCHED.keys(3), TRAIN)
    start = helpers.index(states, 0)
    actions = [helpers.action(ENV, a, A) for a in (RIGHT, DOWN)]
    actions += [(jnp.full((A,), 7, jnp.int32), jnp.asarray(3))]
    actions += [helpers.action(ENV, a, A) for a in (DOWN, RIGHT, DOWN, RIGHT, DOWN)]

    def episode(step_fn):
        state, out = start, []
        for i, (tokens, length) in enumerate(actions):
            state, ts = step_fn(jax.random.key(i), state, tokens, length, TRAIN)
            out.append(ts)
        return state, out

    jitted = episode(_step)
    eager = episode(ENV.step)  # op by op
    jax.tree.map(np.testing.assert_array_equal, jitted, eager)
    assert not jitted[1][2].valid_action and jitted[1][0].valid_action


def test_frozen_lake__vmap_reset_over_64_keys():
    states, ts = BATCHED.reset(BATCHED.keys(0), TRAIN)
    assert states.holes.shape == (B, 4, 4) and ts.obs_tokens.shape == (B, ENV.max_prompt_len)
    assert (np.asarray(ts.obs_len) == ENV.max_prompt_len).all()
    assert not np.asarray(ts.done).any() and (np.asarray(states.pos) == 0).all()
    assert len({np.asarray(h).tobytes() for h in states.holes}) > 20  # maps differ across keys
    first = ENV.tokenizer.decode(np.asarray(ts.obs_tokens[0])).replace(" ", "")
    assert first == ENV.render(helpers.index(states, 0))


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_frozen_lake__oracle_solves_every_generated_map(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    for seed in range(4):  # 256 maps
        states, _ = batched.reset(batched.keys(seed), params)
        plans = np.zeros((B, batched.length), np.int32)  # padding turns act after done
        for i in range(B):
            plan = env.oracle_actions(helpers.index(states, i))
            assert plan is not None and 2 * (env.config.size - 1) <= len(plan) <= batched.length
            plans[i, : len(plan)] = plan
        final, _, ts = batched.play(seed, states, *helpers.ids_to_tokens(env, plans, A), params)
        assert np.asarray(final.done).all()
        assert np.asarray(ts.success).any(axis=1).all()
        np.testing.assert_allclose(np.asarray(ts.reward).sum(axis=1), 1.0)


def test_frozen_lake__train_and_test_layouts_are_disjoint():
    def layouts(params, num_batches):
        holes = [BATCHED.reset(BATCHED.keys(100 + s), params)[0].holes for s in range(num_batches)]
        return np.concatenate([np.asarray(h) for h in holes])

    train, test = layouts(TRAIN, 32), layouts(TEST, 32)  # 2048 maps each
    hash_train = np.asarray(jax.vmap(frozen_lake.layout_hash)(train)) % 1000
    hash_test = np.asarray(jax.vmap(frozen_lake.layout_hash)(test)) % 1000
    assert (hash_train >= 200).all() and (hash_test < 200).all()
    set_train, set_test = {h.tobytes() for h in train}, {h.tobytes() for h in test}
    assert not set_train & set_test
    assert len(set_test) > 50 and len(set_train) > 300
    assert np.asarray(jax.vmap(frozen_lake.solvable)(test)).all()
    # The hole-free fallback (a train-class layout) never shows up among 2048 test maps.
    assert test.any(axis=(1, 2)).all()


def test_frozen_lake__ood_maps_are_larger_and_solvable():
    states, ts = BATCHED_OOD.reset(BATCHED_OOD.keys(5), OOD_PARAMS)
    assert states.holes.shape == (B, 6, 6) and ts.obs_tokens.shape == (B, 42)
    assert np.asarray(jax.vmap(frozen_lake.solvable)(states.holes)).all()


def test_frozen_lake__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(7), TRAIN)
    ids = np.asarray(jax.random.randint(jax.random.key(8), (B, BATCHED.length), 0, 4))
    _, seq, ts = BATCHED.play(7, states, *helpers.ids_to_tokens(ENV, ids, A), TRAIN)
    holes = np.concatenate([np.asarray(states.holes)[:, None], np.asarray(seq.holes)], axis=1)
    pos = np.concatenate([np.asarray(states.pos)[:, None], np.asarray(seq.pos)], axis=1)
    anchors = np.concatenate([np.asarray(ts0.anchor)[:, None], np.asarray(ts.anchor)], axis=1)
    pairs = zip(holes.reshape(-1, 16), pos.reshape(-1, 2), strict=True)
    exact = [h.tobytes() + p.tobytes() for h, p in pairs]
    by_anchor, by_state = {}, {}
    for anchor, state in zip(anchors.ravel().tolist(), exact, strict=True):
        by_anchor.setdefault(anchor, set()).add(state)
        by_state.setdefault(state, set()).add(anchor)
    assert len(by_state) > 200
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_frozen_lake__random_token_actions_never_crash():
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
    np.testing.assert_allclose(reward[invalid], -0.05)


def test_frozen_lake__slippery_moves_perpendicular_a_third_of_the_time():
    env = frozen_lake.FrozenLake(slippery=True)
    state = env.state_from_text("____\n_P__\n____\n___G")
    tokens, length = helpers.action(env, RIGHT, A)
    step = jax.jit(jax.vmap(env.step, in_axes=(0, None, None, None, None)))
    keys = jax.random.split(jax.random.key(0), 3000)
    new, _ = step(keys, state, tokens, length, env.default_params())
    pos = np.asarray(new.pos)
    freq = [np.mean((pos == target).all(axis=1)) for target in ([1, 2], [0, 1], [2, 1])]
    assert sum(freq) == pytest.approx(1.0)
    assert all(0.28 < f < 0.39 for f in freq), freq


def test_frozen_lake__render_shows_the_grid():
    assert ENV.render(ENV.state_from_text(MAP)) == MAP + "\n"
    states, _ = BATCHED.reset(BATCHED.keys(0), TRAIN)
    rows = ENV.render(helpers.index(states, 3)).rstrip("\n").split("\n")
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert rows[0][0] == "P" and rows[3][3] == "G"
    assert set("".join(rows)) <= set("_OGP")


def test_frozen_lake__oracle_handles_terminal_and_blocked_states():
    assert ENV.oracle_actions(ENV.state_from_text("____\n____\n____\n___P")) == []
    plan = ENV.oracle_actions(ENV.state_from_text("_P__\n____\n____\n___G"))
    assert sorted(plan) == [DOWN, DOWN, DOWN, RIGHT, RIGHT]
    assert ENV.oracle_actions(ENV.state_from_text("P___\n____\n___O\n__OG")) is None


def test_frozen_lake__unknown_split_raises():
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="allowed"):
        ENV.default_params("dev")
