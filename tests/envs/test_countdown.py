"""Tests for rl4agents.envs.countdown: hand-checked dynamics, generation, splits, oracle.

Every jitted function is built once per env at import with a fixed batch B, so the file compiles
each of them once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import countdown, registry
from tests.envs import helpers

A = 8  # action slots (the longest action is 6 tokens)
B = 64  # episodes per batched call
ENV = countdown.Countdown()
SHAPED = countdown.Countdown(progress_reward=0.1)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
INVALID = "invalid action , allowed: calc a op b or answer n\n"


BATCHED = helpers.StepBatch(ENV, A, B)
BATCHED_OOD = helpers.StepBatch(OOD_ENV, A, B)
BATCHED_SHAPED = helpers.StepBatch(SHAPED, A, B)
_distance_batch = jax.jit(jax.vmap(countdown.calc_distance, in_axes=(0, 0, None)), static_argnums=2)
_hash_batch = jax.jit(jax.vmap(countdown.task_hash))


def _distance(numbers, targets, max_value):
    """int32[n] calc distances of n <= B tasks (padded to the compiled batch of B)."""
    numbers, targets = np.asarray(numbers, np.int32), np.asarray(targets, np.int32)
    n = len(targets)
    pad = lambda x: np.concatenate([x, np.repeat(x[:1], B - n, axis=0)])  # noqa: E731
    return np.asarray(_distance_batch(pad(numbers), pad(targets), max_value))[:n]


def _decode(env, ts):
    return env.tokenizer.decode(np.asarray(ts.obs_tokens)[: int(ts.obs_len)])


def _play(state, actions, batched=BATCHED):
    return batched.play(state, actions)


def test_countdown__registered_with_builtin_sizes():
    env = registry.make("countdown")
    assert isinstance(env, countdown.Countdown)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (56, 26, 6)
    assert env.num_actions == 3 * 31 * 31 + 31 == 2914
    ood = OOD_ENV.config
    assert (ood.num_numbers, ood.max_value, ood.min_target) == (4, 60, 31)
    assert (OOD_ENV.max_prompt_len, OOD_ENV.max_obs_len, OOD_ENV.max_action_len) == (59, 29, 6)
    assert OOD_ENV.num_actions == 3 * 61 * 61 + 61
    assert env.action_text(env.calc_action(3, "*", 5)) == "calc 3 * 5"
    assert env.action_text(env.answer_action(22)) == "answer 22"


def test_countdown__prompt_lists_rules_target_and_numbers():
    states, ts = BATCHED.reset(BATCHED.keys(0), TRAIN)
    for i in range(4):
        state, first = helpers.index(states, i), helpers.index(ts, i)
        held = " , ".join(str(v) for v in state.numbers if v >= 0)
        expected = (
            "make the target with calc a op b ( op is + - * , results 0 to 30 ) then answer n\n"
            f"target {int(state.target)}\nleft: {held}\n"
        )
        helpers.assert_obs(ENV, first, expected)


def test_countdown__calcs_then_correct_answer_wins_and_absorbs():
    start = ENV.state_from_numbers([7, 3, 5], 22)
    steps = _play(start, ["calc 3 * 5", "calc 15 + 7", "answer 22", "answer 22"])
    (s1, t1), (s2, t2), (s3, t3), (s4, t4) = steps
    helpers.assert_obs(ENV, t1, "3 * 5 = 15\nleft: 7 , 15\n")
    np.testing.assert_array_equal(s1.numbers, [7, 15, -1])
    helpers.assert_obs(ENV, t2, "15 + 7 = 22\nleft: 22\n")
    np.testing.assert_array_equal(s2.numbers, [22, -1, -1])
    helpers.assert_obs(ENV, t3, "you won\n")
    assert [float(t.reward) for t in (t1, t2, t3)] == [0.0, 0.0, 1.0]
    assert [bool(t.done) for t in (t1, t2, t3)] == [False, False, True]
    assert bool(t3.success) and not bool(t2.success) and all(t.valid_action for t in (t1, t2, t3))
    # Absorbing: state frozen, nothing appended, no reward, same anchor, success not repeated.
    helpers.assert_same(s4, s3)
    assert t4.done and t4.reward == 0.0 and t4.obs_len == 0 and not t4.success
    assert t4.anchor == t3.anchor


def test_countdown__subtraction_and_equal_operands():
    start = ENV.state_from_numbers([4, 4, 9], 5)
    (s1, t1), (s2, t2) = _play(start, ["calc 9 - 4", "calc 5 - 4"])
    helpers.assert_obs(ENV, t1, "9 - 4 = 5\nleft: 4 , 5\n")
    helpers.assert_obs(ENV, t2, "5 - 4 = 1\nleft: 1\n")
    ((s, t),) = _play(start, ["calc 4 * 4"])
    helpers.assert_obs(ENV, t, "4 * 4 = 16\nleft: 9 , 16\n")
    ((s, t),) = _play(start, ["calc 4 - 4"])
    helpers.assert_obs(ENV, t, "4 - 4 = 0\nleft: 0 , 9\n")


@pytest.mark.parametrize(
    "action, message",
    [
        ("calc 4 + 5", "invalid calc , use the numbers left\n"),  # 4 not held
        ("calc 5 + 5", "invalid calc , use the numbers left\n"),  # 5 held once
        ("calc 5 * 7", "invalid calc , result not in 0 to 30\n"),  # 35 > 30
        ("calc 3 - 5", "invalid calc , result not in 0 to 30\n"),  # negative
        ("calc 3 ^ 5", INVALID),
        ("calc 3 + 5 + 7", INVALID),
        ("answer", INVALID),
        ("answer 31", INVALID),  # beyond max_value: not in the action table
        ("", INVALID),
    ],
)
def test_countdown__invalid_turns_are_penalised_and_explained(action, message):
    start = ENV.state_from_numbers([3, 5, 7], 22)
    ((state, ts),) = _play(start, [action])
    helpers.assert_obs(ENV, ts, message + "left: 3 , 5 , 7\n")
    assert not ts.valid_action and not ts.done and not ts.success
    assert ts.reward == pytest.approx(-0.05)
    helpers.assert_same(state, start)
    assert ts.anchor == ENV.anchor(start)


def test_countdown__answers_that_lose():
    start = ENV.state_from_numbers([3, 5, 7], 22)
    # A wrong number ends the episode without reward.
    ((_, ts),) = _play(start, ["answer 7"])
    helpers.assert_obs(ENV, ts, "you lost , not the target\n")
    assert ts.done and ts.valid_action and ts.reward == 0.0 and not ts.success
    # Guessing the target without building it with the tool cannot score.
    ((_, ts),) = _play(start, ["answer 22"])
    helpers.assert_obs(ENV, ts, "you lost , make the target with calc first\n")
    assert ts.done and ts.reward == 0.0 and not ts.success
    (_, (_, ts)) = _play(start, ["calc 3 + 5", "answer 22"])
    helpers.assert_obs(ENV, ts, "you lost , make the target with calc first\n")
    assert ts.done and ts.reward == 0.0 and not ts.success
    # The target held from the start (never generated) still needs one calc first.
    held = ENV.state_from_numbers([3, 5, 22], 22)
    ((_, ts),) = _play(held, ["answer 22"])
    assert ts.done and not ts.success and ts.reward == 0.0
    (_, (_, ts)) = _play(held, ["calc 5 - 3", "answer 22"])
    assert ts.done and ts.success and ts.reward == 1.0


def test_countdown__calc_distance_by_hand():
    numbers = [[3, 5, 7], [7, 15, -1], [22, -1, -1], [7, 8, -1], [3, 5, 7], [-1, -1, -1]]
    targets = [22, 22, 22, 22, 3, 4]
    np.testing.assert_array_equal(_distance(numbers, targets, 30), [2, 1, 0, 3, 0, 3])
    # Four numbers: 29 = (2 * 3) * 5 - 4 needs all three calcs; no two calcs make it.
    np.testing.assert_array_equal(_distance([[2, 3, 4, 5]], [29], 60), [3])
    assert len(countdown.solve((2, 3, 4, 5), 29, 60, 4)) == 3
    np.testing.assert_array_equal(_distance([[2, 3, 4, 5], [1, 1, 1, -1]], [60, 59], 60), [2, 4])


def test_countdown__progress_reward_is_potential_shaping_on_calc_distance():
    start = SHAPED.state_from_numbers([3, 5, 7], 22)  # distance 2
    steps = _play(start, ["calc 3 * 5", "calc 15 + 7", "answer 22"], BATCHED_SHAPED)
    np.testing.assert_allclose([float(t.reward) for _, t in steps], [0.1, 0.1, 1.0], rtol=1e-6)
    # A dead end ({7, 8} cannot make 22): distance 2 -> 3 (unreachable = N); then an invalid
    # turn and an answer leave the numbers, hence the potential, unchanged.
    steps = _play(start, ["calc 3 + 5", "calc 5 * 7", "answer 8"], BATCHED_SHAPED)
    np.testing.assert_allclose([float(t.reward) for _, t in steps], [-0.1, -0.05, 0.0], atol=1e-6)


def test_countdown__vmap_reset_over_64_keys_gives_solvable_tasks():
    for params in (TRAIN, TEST):
        states, ts = BATCHED.reset(BATCHED.keys(1), params)
        assert ts.obs_tokens.shape == (B, ENV.max_prompt_len)
        numbers, target = np.asarray(states.numbers), np.asarray(states.target)
        assert numbers.shape == (B, 3) and ((numbers >= 1) & (numbers <= 9)).all()
        assert (np.diff(numbers, axis=1) >= 0).all()
        assert ((target >= 10) & (target <= 30)).all()
        assert not (numbers == target[:, None]).any()  # the tool is needed
        dist = _distance(states.numbers, states.target, 30)
        assert ((dist >= 1) & (dist <= 2)).all()
        assert not np.asarray(ts.done).any() and np.asarray(ts.valid_action).all()
        assert len({(tuple(n), t) for n, t in zip(numbers.tolist(), target.tolist())}) > B // 2


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_countdown__oracle_solves_every_generated_task_closed_loop(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    for seed in range(4):  # 256 tasks per split
        states, _ = batched.reset(batched.keys(100 + seed), params)
        plan_lens = [len(env.oracle_actions(helpers.index(states, i))) for i in range(B)]
        dist = _distance(states.numbers, states.target, env.config.max_value)
        np.testing.assert_array_equal(np.asarray(plan_lens), dist + 1)  # calcs + answer
        final, steps = batched.oracle_turns(states, params, env.config.num_numbers + 1)
        assert np.asarray(final.done).all()
        success = np.stack([np.asarray(t.success) for t in steps], axis=1)
        rewards = np.stack([np.asarray(t.reward) for t in steps], axis=1)
        assert (success.sum(axis=1) == 1).all()
        np.testing.assert_array_equal(success.argmax(axis=1), np.asarray(plan_lens) - 1)
        np.testing.assert_allclose(rewards.sum(axis=1), 1.0)
        assert all(np.asarray(t.valid_action).all() for t in steps)


def test_countdown__shaped_oracle_return_is_goal_plus_c_times_distance():
    states, _ = BATCHED.reset(BATCHED.keys(7), TRAIN)  # SHAPED generates the same tasks
    dist = _distance(states.numbers, states.target, 30)
    final, steps = BATCHED_SHAPED.oracle_turns(states, TRAIN, SHAPED.config.num_numbers + 1)
    assert np.asarray(final.done).all()
    rewards = np.stack([np.asarray(t.reward) for t in steps], axis=1)
    np.testing.assert_allclose(rewards.sum(axis=1), 1.0 + 0.1 * dist, rtol=1e-5)
    # Every oracle calc is on a shortest route: +c each.
    solved_at = np.stack([np.asarray(t.success) for t in steps], axis=1).argmax(axis=1)
    before = np.arange(rewards.shape[1])[None, :] < solved_at[:, None]
    np.testing.assert_allclose(rewards[before], 0.1, rtol=1e-5)
    np.testing.assert_array_equal(before.sum(axis=1), dist)


def _tasks(states):
    numbers, target = np.asarray(states.numbers), np.asarray(states.target)
    return {(tuple(n), t) for n, t in zip(numbers.tolist(), target.tolist())}


def test_countdown__train_test_and_ood_tasks_are_disjoint():
    train, test = set(), set()
    for seed in range(8):
        train |= _tasks(BATCHED.reset(BATCHED.keys(200 + seed), TRAIN)[0])
        test |= _tasks(BATCHED.reset(BATCHED.keys(300 + seed), TEST)[0])
    assert not train & test
    assert len(train) > 250 and len(test) > 100  # ~1500 distinct tasks in all
    for tasks, is_test in ((sorted(test)[:B], True), (sorted(train)[:B], False)):
        numbers = jnp.asarray([n for n, _ in tasks], jnp.int32)
        hashes = np.asarray(_hash_batch(numbers, jnp.asarray([t for _, t in tasks], jnp.int32)))
        assert ((hashes % 1000 < 200) == is_test).all()
    ood_states, _ = BATCHED_OOD.reset(BATCHED_OOD.keys(5), OOD_PARAMS)
    ood = _tasks(ood_states)
    assert all(len(n) == 4 and 31 <= t <= 60 for n, t in ood)  # more numbers, larger targets
    assert not {n for n, _ in ood} & {n for n, _ in train | test}
    dist = _distance(ood_states.numbers, ood_states.target, 60)
    assert ((dist >= 1) & (dist <= 3)).all() and (dist == 3).any()


def test_countdown__anchors_equal_iff_states_equal():
    rng = np.random.default_rng(0)
    states, ts0 = BATCHED.reset(BATCHED.keys(9), TRAIN)
    seen = [(states, ts0.anchor)]
    for turn in range(4):
        ids = []
        for i in range(B):
            held = [int(v) for v in np.asarray(states.numbers)[i] if v >= 0]
            if len(held) >= 2 and rng.random() < 0.8:
                a, b = sorted(rng.choice(held, 2, replace=False).tolist(), reverse=True)
                ids.append(ENV.calc_action(a, str(rng.choice(["+", "-"])), b))
            else:
                ids.append(ENV.answer_action(int(rng.choice(held))))
        states, ts = BATCHED.act(states, ids, TRAIN, seed=turn)
        seen.append((states, ts.anchor))
    by_anchor, by_state = {}, {}
    for batch, anchors in seen:
        rows = np.concatenate(
            [
                np.asarray(batch.numbers),
                np.asarray(batch.target)[:, None],
                np.asarray(batch.done)[:, None].astype(np.int32),
            ],
            axis=1,
        )
        for anchor, row in zip(np.asarray(anchors).tolist(), map(bytes, rows.astype(np.int32))):
            by_anchor.setdefault(anchor, set()).add(row)
            by_state.setdefault(row, set()).add(anchor)
    assert len(by_state) > 150
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())
    # The anchor tells apart states that differ only in done.
    state = ENV.state_from_numbers([3, 5, 7], 22)
    assert ENV.anchor(state) != ENV.anchor(state.replace(done=jnp.asarray(True)))


def test_countdown__random_token_actions_are_penalised_turns():
    states, _ = BATCHED.reset(BATCHED.keys(11), TRAIN)
    tokens, lengths = helpers.random_actions(
        ENV.tokenizer.vocab_size, jax.random.key(12), jax.random.key(13), (B,), A
    )
    new, ts = BATCHED.step(BATCHED.keys(11), states, tokens, lengths, TRAIN)
    assert not np.asarray(ts.valid_action).any()
    np.testing.assert_allclose(np.asarray(ts.reward), -0.05, rtol=1e-6)
    assert not np.asarray(ts.done).any()
    helpers.assert_same(new, states)
    for i in range(3):
        assert _decode(ENV, helpers.index(ts, i)).startswith(
            "invalid action , allowed: calc a o p b"
        )


def test_countdown__render_is_readable():
    state = ENV.state_from_numbers([7, 3, 5], 22)
    assert ENV.render(state) == "target: 22\nnumbers: 3 5 7\n"
    ((after, _),) = _play(state, ["calc 3 * 5"])
    assert ENV.render(after) == "target: 22\nnumbers: 7 15\n"
    assert ENV.render(after.replace(done=jnp.asarray(True))).endswith("done\n")


def test_countdown__oracle_on_hand_states():
    assert [ENV.action_text(a) for a in ENV.oracle_actions(ENV.state_from_numbers([3, 5, 7], 22))]
    plan = ENV.oracle_actions(ENV.state_from_numbers([3, 5, 7], 22))
    assert [ENV.action_text(a) for a in plan] == ["calc 5 * 3", "calc 15 + 7", "answer 22"]
    assert ENV.oracle_actions(ENV.state_from_numbers([7, 8], 22)) is None
    assert ENV.oracle_actions(ENV.state_from_numbers([22], 22)) == [ENV.answer_action(22)]
    done = ENV.state_from_numbers([22], 22, done=True)
    assert ENV.oracle_actions(done) == []


def test_countdown__arguments_and_splits_are_validated():
    with pytest.raises(ValueError, match="num_numbers.*9"):
        countdown.Countdown(num_numbers=9)
    with pytest.raises(ValueError, match="max_value.*150"):
        countdown.Countdown(max_value=150)
    with pytest.raises(ValueError, match="min_target.*40"):
        countdown.Countdown(min_target=40)
    with pytest.raises(ValueError, match="ood_min_target"):
        countdown.Countdown(ood_max_value=30)
    with pytest.raises(ValueError, match="no task"):
        countdown.Countdown(num_numbers=2, max_start=2, min_target=30)
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="0..30"):
        ENV.answer_action(31)


def test_countdown__config_builds_a_matching_rollout():
    from configs import countdown as config

    c = config.get_config()
    assert c.env.name == "countdown" and c.credit.name == "grpo"
    kwargs = registry.validate("countdown", dict(c.env.countdown))
    env = registry.make("countdown", **kwargs)
    assert c.rollout.max_action_len >= env.max_action_len + 1
    ood_env, _ = env.make_split("ood")
    assert c.rollout.max_action_len >= ood_env.max_action_len + 1
    assert c.rollout.max_turns > env.config.num_numbers
    assert c.train.ood_max_turns > ood_env.config.num_numbers
    assert config.get_config("ppo_gae").model.value_head == "shared"
    names = {w for table in text.env_fragment_tables(env) for w in table.names}
    assert "calc 30 * 30" in names
