"""The environment base (rl4agents/envs/base.py): split ids and params, the settings helper,
the split predicate, the bits-to-uniform conversion generators rely on, and what `TextEnv`
asks of a subclass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import base
from tests.envs.chars import CharTokenizer


def test_split_id__names_and_unknown_split():
    assert [base.split_id(s) for s in base.SPLITS] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"unknown split 'val'; allowed splits: \['train'"):
        base.split_id("val")


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_uniform_from_bits__matches_jax_random_uniform_and_bernoulli(shape):
    key = jax.random.key(11)
    bits = jax.random.bits(key, shape, jnp.uint32)
    u = base.uniform_from_bits(bits)
    np.testing.assert_array_equal(u, jax.random.uniform(key, shape))
    np.testing.assert_array_equal(u < 0.3, jax.random.bernoulli(key, 0.3, shape))
    assert u.dtype == jnp.float32 and ((u >= 0) & (u < 1)).all()


def test_in_split_class__train_test_and_either():
    hashes = jnp.arange(1000, dtype=jnp.uint32)
    test = np.asarray(base.in_split_class(hashes, 200, jnp.int32(1)))
    train = np.asarray(base.in_split_class(hashes, 200, jnp.int32(0)))
    assert test.sum() == 200 and test[:200].all() and (train == ~test).all()
    assert np.asarray(base.in_split_class(hashes, 200, jnp.int32(2))).all()


@dataclasses.dataclass(frozen=True)
class _Config:
    size: int = 3
    test_fraction: float = 0.2


class _Partial(base.TextEnv):
    """Only the constructor: what the base asks for raises naming the missing method."""

    def __init__(self, size: int = 3, test_fraction: float = 0.2, tokenizer=None):
        super().__init__(base.settings(_Config, locals()), tokenizer)


def test_text_env__settings_params_and_missing_methods():
    env = _Partial(size=5)
    assert env.config == _Config(size=5) and env.test_threshold == 200
    params = env.default_params("test")
    assert isinstance(params, base.SplitParams) and int(params.split) == 1
    same, train = env.make_split("train")
    assert same is env and int(train.split) == 0
    with pytest.raises(NotImplementedError, match="_Partial does not implement ood_config"):
        env.make_split("ood")
    with pytest.raises(NotImplementedError, match="does not implement reset_env"):
        env.reset(jax.random.key(0), params)
    with pytest.raises(NotImplementedError, match="does not implement fragment_tables"):
        env.fragment_tables()
    with pytest.raises(ValueError, match="unknown split"):
        env.make_split("dev")


def test_check_range__bounds_edges_nan_and_messages():
    base.check_range("size", 2, 2)
    base.check_range("size", 5, 2, 5)
    with pytest.raises(ValueError, match=r"^size must be >= 2 \(rooms\), got 1$"):
        base.check_range("size", 1, 2, note=" (rooms)")
    with pytest.raises(ValueError, match=r"^width must be in \[1, 4\], got 5$"):
        base.check_range("width", 5, 1, 4)
    with pytest.raises(ValueError, match=r"^p must be in \[0, 1\], got nan$"):
        base.check_range("p", float("nan"), 0, 1)


@dataclasses.dataclass(frozen=True)
class _Rewards:
    size: int = -1  # not a shared setting: never checked here
    step_penalty: float = 0.1
    goal_reward: float = 1.0
    explore_reward: float = 0.0
    test_fraction: float = 0.2
    num_candidates: int = 1


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("step_penalty", -0.1, r"^step_penalty must be >= 0 \(it is subtracted\), got -0.1$"),
        ("goal_reward", float("nan"), r"^goal_reward must be >= 0, got nan$"),
        ("explore_reward", -1.0, r"^explore_reward must be >= 0 \(0 = off\), got -1.0$"),
        ("test_fraction", 1.0, r"^test_fraction must be in \(0, 1\), got 1.0$"),
        ("test_fraction", 0.0004, r"round\(test_fraction \* 1000\) in \[1, 999\]"),
        ("num_candidates", 0, r"^num_candidates must be >= 1, got 0$"),
    ],
)
def test_check_shared_settings__each_bad_field_names_itself(field, value, match):
    base.check_shared_settings(_Rewards())
    base.check_shared_settings(_Rewards(goal_reward=0.0, step_penalty=0.0))  # 0 is allowed
    with pytest.raises(ValueError, match=match):
        base.check_shared_settings(dataclasses.replace(_Rewards(), **{field: value}))


def test_check_shared_settings__positive_fields_order_and_missing_fields():
    with pytest.raises(ValueError, match=r"^goal_reward must be > 0, got 0.0$"):
        base.check_shared_settings(_Rewards(goal_reward=0.0), positive=("goal_reward",))
    with pytest.raises(ValueError, match=r"positive names \['bonus'\] are not fields of _Config"):
        base.check_shared_settings(_Config(), positive=("bonus",))
    base.check_shared_settings(_Config())  # no reward fields, no num_candidates: skipped
    # test_fraction first, then num_candidates, then the rewards in field order.
    bad = _Rewards(step_penalty=-1.0, goal_reward=-1.0, test_fraction=2.0, num_candidates=0)
    with pytest.raises(ValueError, match="^test_fraction"):
        base.check_shared_settings(bad)
    with pytest.raises(ValueError, match="^num_candidates"):
        base.check_shared_settings(dataclasses.replace(bad, test_fraction=0.2))
    with pytest.raises(ValueError, match="^step_penalty"):
        base.check_shared_settings(dataclasses.replace(bad, test_fraction=0.2, num_candidates=1))


def test_grid_text__fragment_order_and_sizes():
    # One token per character: P = S^2 * longest cell + (S - 1) * newline + end, O = invalid + P.
    cells = {"wall": "#", "open": "__"}
    grid = base.grid_text(
        CharTokenizer(), cells, 3, compact=False, invalid="bad\n", extra={"x": "?"}
    )
    names = ["wall", "open", "x", "newline", "end", "invalid"]
    assert [grid.frags.id(n) for n in names] == list(range(6))
    assert grid.frags.lengths.tolist() == [1, 2, 1, 1, 1, 4]
    assert (grid.max_prompt_len, grid.max_obs_len) == (9 * 2 + 2 * 1 + 1, 4 + 21)
    compact = base.grid_text(CharTokenizer(), cells, 3, compact=True, invalid="bad\n")
    assert compact.frags.lengths.tolist() == [1, 2, 0, 1, 7]  # "", "\n", "invalid"
    assert (compact.max_prompt_len, compact.max_obs_len) == (9 * 2 + 1, 7 + 19)


def test_grid_ids_and_grid_observation__text_of_a_hand_grid():
    tok = CharTokenizer()
    grid = base.grid_text(tok, {"wall": "#", "open": "__"}, 2, compact=False, invalid="bad\n")
    ids = base.grid_ids(grid.frags, jnp.asarray([[0, 1], [1, 1]]))
    assert ids.dtype == jnp.int32 and ids.tolist() == [0, 1, 2, 1, 1, 3]  # newline 2, end 3
    for valid, want in ((True, "#__\n____\n"), (False, "bad\n#__\n____\n")):
        obs, obs_len = base.grid_observation(
            grid.frags, jnp.asarray(valid), ids, tok.pad_id, grid.max_obs_len
        )
        assert obs.shape == (grid.max_obs_len,) and int(obs_len) == len(want)
        assert tok.decode(np.asarray(obs)[: int(obs_len)]) == want
        assert (np.asarray(obs)[int(obs_len) :] == tok.pad_id).all()


class _Anchored(_Partial):
    def anchor(self, state):
        return jnp.uint32(7) * state


def test_text_env__end_turn_builds_the_timestep_of_new_state():
    env = _Anchored()
    obs, obs_len = jnp.arange(4, dtype=jnp.int32), jnp.int32(3)
    state, ts = env.end_turn(
        jnp.uint32(3), obs, obs_len, jnp.asarray(2, jnp.int32), done=True, valid=False, success=True
    )
    assert int(state) == 3 and ts.obs_tokens.tolist() == [0, 1, 2, 3] and int(ts.obs_len) == 3
    assert ts.reward.dtype == jnp.float32 and float(ts.reward) == 2.0
    assert int(ts.anchor) == 21  # the anchor of the new state
    assert (bool(ts.done), bool(ts.valid_action), bool(ts.success)) == (True, False, True)
