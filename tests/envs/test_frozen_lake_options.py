"""FrozenLake options: local view (`view_radius`), slip probability (`success_rate`) and the
distance-based process reward (`progress_reward`), checked on hand-written maps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import frozen_lake

UP, DOWN, LEFT, RIGHT = range(4)
WIDTH = 2  # action slots passed to `step`


def action(env, action_id):
    """(int32[WIDTH] tokens, int32[] length) of an action id."""
    ids = env.action_tokens(action_id)
    tokens = np.full((WIDTH,), env.tokenizer.pad_id, np.int32)
    tokens[: len(ids)] = ids
    return jnp.asarray(tokens), jnp.asarray(len(ids), jnp.int32)


def invalid_action(env):
    """(tokens, length) of a word that is not an action."""
    ids = env.tokenizer.encode("jump")[:WIDTH]
    tokens = np.full((WIDTH,), env.tokenizer.pad_id, np.int32)
    tokens[: len(ids)] = ids
    return jnp.asarray(tokens), jnp.asarray(len(ids), jnp.int32)


def decode(env, timestep) -> str:
    """The observation text of a TimeStep, without the tokenizer's spaces between tokens."""
    ids = np.asarray(timestep.obs_tokens)[: int(timestep.obs_len)]
    return env.tokenizer.decode(ids).replace(" ", "")


def window(grid: str, row: int, col: int, r: int) -> str:
    """Reference view: the (2r+1)^2 window of `grid` text around (row, col), "#" off-grid."""
    rows = grid.strip().split("\n")
    n = len(rows)
    out = []
    for i in range(row - r, row + r + 1):
        cells = [
            rows[i][j] if 0 <= i < n and 0 <= j < n else "#" for j in range(col - r, col + r + 1)
        ]
        out.append("".join(cells) + "\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# view_radius


VIEW = frozen_lake.FrozenLake(view_radius=1)
VIEW_STEP = jax.jit(VIEW.step)
PARAMS = VIEW.default_params()


def test_view_radius__sizes_fit_the_window():
    # 3 x 3 one-token cells, 2 row breaks, the end-of-observation "\n".
    assert VIEW.max_prompt_len == 9 + 2 + 1
    full = frozen_lake.FrozenLake()
    assert VIEW.max_obs_len - VIEW.max_prompt_len == full.max_obs_len - full.max_prompt_len


@pytest.mark.parametrize(
    "grid, move, expected",
    [
        # Top-left corner: bumping the top wall keeps the agent at (0, 0).
        ("P_O_\n____\n_O__\n___G", UP, "###\n#P_\n#__\n"),
        # Middle: (1, 1) -> (1, 2); rows 0..2, columns 1..3.
        ("__O_\n_P__\n_O__\n___G", RIGHT, "_O_\n_P_\nO__\n"),
        # Bottom edge next to the goal: (3, 1) -> (3, 2); the row below the grid is wall.
        ("____\n____\n_O__\n_P_G", RIGHT, "O__\n_PG\n###\n"),
    ],
)
def test_view_radius__observation_is_the_window_around_the_agent(grid, move, expected):
    state = VIEW.state_from_text(grid)
    new, ts = VIEW_STEP(jax.random.key(0), state, *action(VIEW, move), PARAMS)
    assert ts.valid_action and not ts.done
    assert int(ts.obs_len) == VIEW.max_prompt_len
    assert decode(VIEW, ts) == expected
    pos = np.asarray(new.pos)
    assert window(VIEW.render(new), pos[0], pos[1], 1) == expected  # the reference agrees


def test_view_radius__invalid_action_prefixes_the_message():
    state = VIEW.state_from_text("P_O_\n____\n_O__\n___G")
    _, ts = VIEW_STEP(jax.random.key(0), state, *invalid_action(VIEW), PARAMS)
    assert not ts.valid_action
    assert decode(VIEW, ts) == "invalidaction\n###\n#P_\n#__\n"


def test_view_radius__reset_shows_the_start_window_of_random_maps():
    keys = jax.random.split(jax.random.key(0), 16)
    states, ts = jax.jit(jax.vmap(VIEW.reset, in_axes=(0, None)))(keys, PARAMS)
    for i in range(16):
        state = jax.tree.map(lambda x, i=i: x[i], states)
        step = jax.tree.map(lambda x, i=i: x[i], ts)
        assert decode(VIEW, step) == window(VIEW.render(state), 0, 0, 1)


def test_view_radius__radius_two_on_a_three_by_three_map():
    env = frozen_lake.FrozenLake(size=3, view_radius=2)
    state = env.state_from_text("_P_\n___\n__G")
    step = jax.jit(env.step)
    _, ts = step(jax.random.key(0), state, *action(env, DOWN), env.default_params())
    assert decode(env, ts) == "#####\n#___#\n#_P_#\n#__G#\n#####\n"  # centred at (1, 1)
    _, ts = step(jax.random.key(0), state, *action(env, UP), env.default_params())
    assert decode(env, ts) == "#####\n#####\n#_P_#\n#___#\n#__G#\n"  # bumped: still (0, 1)


# --------------------------------------------------------------------------------------------
# success_rate


@functools.cache
def _vmapped_step(env):
    """jit(vmap over keys) of `env.step`, compiled once per env and batch size."""
    return jax.jit(jax.vmap(env.step, in_axes=(0, None, None, None, None)))


def _step_many(env, grid, move, num_keys, seed=0):
    """(states, TimeSteps) of one step of `move` from `grid` under `num_keys` keys."""
    state = env.state_from_text(grid)
    tokens, length = action(env, move)
    keys = jax.random.split(jax.random.key(seed), num_keys)
    return _vmapped_step(env)(keys, state, tokens, length, env.default_params())


OPEN = "____\n_P__\n____\n___G"  # agent at (1, 1), all four moves stay on the grid


def test_success_rate__one_is_the_deterministic_dynamics():
    sure = frozen_lake.FrozenLake(slippery=True, success_rate=1.0)
    plain = frozen_lake.FrozenLake()
    for grid in (OPEN, "P_O_\n____\n_O__\n___G", "____\n____\n_O__\n__PG"):
        for move in range(4):
            a = _step_many(sure, grid, move, 64)
            b = _step_many(plain, grid, move, 64)
            jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize(
    "move, intended, perpendicular",
    [(RIGHT, (1, 2), [(0, 1), (2, 1)]), (UP, (0, 1), [(1, 0), (1, 2)])],
)
def test_success_rate__intended_move_with_its_probability(move, intended, perpendicular):
    env = frozen_lake.FrozenLake(slippery=True, success_rate=0.8)
    new, _ = _step_many(env, OPEN, move, 4000)
    pos = np.asarray(new.pos)

    def freq(cell):
        return np.mean((pos == cell).all(axis=1))

    # Binomial standard deviations over 4000 draws: 0.0063 (p = 0.8) and 0.0047 (p = 0.1).
    assert abs(freq(intended) - 0.8) < 0.03
    for cell in perpendicular:
        assert abs(freq(cell) - 0.1) < 0.025
    assert freq(intended) + sum(freq(c) for c in perpendicular) == pytest.approx(1.0)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_success_rate__outside_zero_one_raises(rate):
    with pytest.raises(ValueError, match=r"success_rate must be in \(0, 1\]"):
        frozen_lake.FrozenLake(slippery=True, success_rate=rate)


def test_view_radius__negative_raises():
    with pytest.raises(ValueError, match="view_radius must be >= 0"):
        frozen_lake.FrozenLake(view_radius=-1)


# --------------------------------------------------------------------------------------------
# progress_reward

C = 0.5
PROGRESS = frozen_lake.FrozenLake(progress_reward=C)
PROGRESS_STEP = jax.jit(PROGRESS.step)


@pytest.mark.parametrize(
    "grid, move, reward, done",
    [
        # d(s) = 2 (N - 1) - row - col on the 4x4 map: the Manhattan distance to the goal.
        ("P_O_\n____\n_O__\n___G", RIGHT, C * (6 - 5), False),  # toward the goal
        ("____\n_P__\n_O__\n___G", LEFT, C * (4 - 5), False),  # away from it
        ("____\n_P__\n_O__\n___G", UP, C * (4 - 5), False),  # away, the other axis
        ("P_O_\n____\n_O__\n___G", UP, 0.0, False),  # bumping the wall: no move, no reward
        ("P_O_\n____\n_O__\n___G", LEFT, 0.0, False),
        ("_PO_\n____\n_O__\n___G", RIGHT, C * (5 - 4), True),  # into a hole: closer, so +C
        ("____\n____\n_O__\n__PG", RIGHT, 1.0 + C * (1 - 0), True),  # goal reward + progress
    ],
)
def test_progress_reward__is_c_times_the_distance_decrease(grid, move, reward, done):
    state = PROGRESS.state_from_text(grid)
    _, ts = PROGRESS_STEP(jax.random.key(0), state, *action(PROGRESS, move), PARAMS)
    assert ts.valid_action and bool(ts.done) == done
    assert float(ts.reward) == pytest.approx(reward, abs=1e-6)


def test_progress_reward__invalid_action_gets_only_the_invalid_penalty():
    state = PROGRESS.state_from_text("____\n_P__\n_O__\n___G")
    new, ts = PROGRESS_STEP(jax.random.key(0), state, *invalid_action(PROGRESS), PARAMS)
    assert not ts.valid_action
    assert float(ts.reward) == pytest.approx(-PROGRESS.config.invalid_penalty, abs=1e-7)
    np.testing.assert_array_equal(new.pos, state.pos)


def test_progress_reward__zero_keeps_the_sparse_rewards():
    plain = frozen_lake.FrozenLake()
    state = plain.state_from_text("P_O_\n____\n_O__\n___G")
    _, ts = jax.jit(plain.step)(jax.random.key(0), state, *action(plain, RIGHT), PARAMS)
    assert float(ts.reward) == 0.0


def test_ood_size__defaults_to_two_cells_larger_than_the_training_maps():
    assert frozen_lake.FrozenLake().make_split("ood")[0].config.size == 6
    assert frozen_lake.FrozenLake(size=8).make_split("ood")[0].config.size == 10
    assert frozen_lake.FrozenLake(size=8, ood_size=12).make_split("ood")[0].config.size == 12
    with pytest.raises(ValueError, match=r"ood_size must be >= 0 \(0 = size \+ 2\), got -1"):
        frozen_lake.FrozenLake(ood_size=-1)
