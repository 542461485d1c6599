"""Tests for rl4agents.envs.terminal: hand-checked shell output, generation, splits, oracle.

Every jitted function is built once per env at import with a fixed batch, so the file compiles
each of them once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents.envs import registry, terminal
from tests.envs import helpers

B = 64  # episodes per batched call
ENV = terminal.Terminal()
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
A = ENV.max_action_len + 1  # action slots
TREE = {
    "docs": {
        "notes.md": ["key = 4817", "user: maple"],
        "logs": {"log.txt": ["port = 1024"]},
    },
    "readme": ["pin: amber"],
}
PROMPT = "$\n"


class Batched(helpers.StepBatch):
    """`helpers.StepBatch` over B episodes, plus closed-loop play of the env's oracle."""

    def __init__(self, env):
        super().__init__(env, A, B)

    def run_oracle(self, seed, params, num_batches=1, strategy="grep", max_turns=200):
        """Closed loop over batches of B tasks: the oracle's first action every turn, through
        the jitted step. Returns (final states, success, turns, total reward), [n] each."""
        runs = [self._run_oracle(seed + i, params, strategy, max_turns) for i in range(num_batches)]
        return [jax.tree.map(lambda *x: np.concatenate(x), *parts) for parts in zip(*runs)]

    def _run_oracle(self, seed, params, strategy, max_turns):
        n = B
        states, _ = self.reset(self.keys(seed, n), params)
        success, turns = np.zeros(n, bool), np.zeros(n, np.int32)
        total = np.zeros(n, np.float32)
        for _ in range(max_turns):
            host = jax.device_get(states)
            if host.done.all():
                break
            actions = np.zeros(n, np.int32)
            for i in np.flatnonzero(~host.done):
                plan = self.env.oracle_actions(helpers.index(host, i), strategy)
                assert plan, (strategy, self.env.render(helpers.index(host, i)))
                actions[i] = plan[0]
            turns += ~host.done
            states, ts = self.act(states, actions, params)
            success |= np.asarray(ts.success)
            total += np.asarray(ts.reward)
        return jax.device_get(states), success, turns, total


BATCHED = Batched(ENV)
BATCHED_OOD = Batched(OOD_ENV)
_step = jax.jit(ENV.step)
PROGRESS_ENV = terminal.Terminal(progress_reward=0.1)
_progress_step = jax.jit(PROGRESS_ENV.step)


def _run(commands, tree=TREE, field="key", cwd="/", env=ENV, step=_step):
    """Plays command strings from a hand-made state; returns [(state, timestep, text)]."""
    state = env.state_from_tree(tree, field, cwd)
    out = []
    for command in commands:
        state, ts = step(jax.random.key(0), state, *helpers.encode(env, command, A), TRAIN)
        obs = np.asarray(ts.obs_tokens)[: int(ts.obs_len)]
        out.append((state, ts, obs))
    return out


def _assert_output(env, obs, expected):
    """The observation's tokens are exactly the tokenization of `expected`."""
    assert obs.tolist() == env.tokenizer.encode(expected), (
        env.tokenizer.decode(obs),
        expected,
    )


def test_terminal__registered_with_builtin_sizes():
    env = registry.make("terminal")
    assert isinstance(env, terminal.Terminal)
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (75, 161, 9)
    assert len(terminal.VALUES) == len(set(terminal.VALUES)) == 256
    assert env.num_actions == 3 + 2 * 19 + (10 + 256) + 256 == len(set(env.commands))
    assert (OOD_ENV.config.depth, OOD_ENV.config.width, OOD_ENV.max_obs_len) == (3, 3, 186)
    assert OOD_ENV.num_actions == env.num_actions


def test_terminal__prompt_states_the_task():
    states, ts = BATCHED.reset(BATCHED.keys(1), TRAIN)
    field = terminal.FIELDS[int(states.target_field[0])]
    expected = f"find the value of {field} and submit it\n" + terminal.HELP + PROMPT
    obs = np.asarray(ts.obs_tokens[0])[: int(ts.obs_len[0])]
    _assert_output(ENV, obs, expected)


def test_terminal__ls_cd_pwd_cat_outputs():
    steps = _run(["ls", "pwd", "cd docs", "pwd", "ls", "cat notes.md", "cd logs", "pwd", "cd .."])
    expected = [
        "docs/\nreadme\n",
        "/\n",
        "",
        "/docs\n",
        "logs/\nnotes.md\n",
        "key = 4817\nuser: maple\n",
        "",
        "/docs/logs\n",
        "",
    ]
    for (_, ts, obs), text in zip(steps, expected, strict=True):
        _assert_output(ENV, obs, text + PROMPT)
        assert ts.valid_action and not ts.done and ts.reward == 0.0 and not ts.success
    state = steps[-1][0]
    assert int(state.cwd) == 1 and bool(state.found)  # back in /docs; cat showed the key
    assert np.asarray(state.listed)[[0, 1]].all() and np.asarray(state.visited)[[0, 1, 3]].all()


def test_terminal__errors_are_valid_turns_with_error_output():
    steps = _run(["cd readme", "cd tmp", "cat docs", "cat todo.txt", "cd ..", "pwd"])
    expected = [
        "cd: readme: not a directory\n",
        "cd: tmp: no such directory\n",
        "cat: docs: is a directory\n",
        "cat: todo.txt: no such file\n",
        "",  # cd .. in "/" stays in "/"
        "/\n",
    ]
    for (state, ts, obs), text in zip(steps, expected, strict=True):
        _assert_output(ENV, obs, text + PROMPT)
        assert ts.valid_action and ts.reward == 0.0 and not ts.done
        assert int(state.cwd) == 0 and not bool(state.found)


def test_terminal__grep_is_recursive_from_the_working_directory():
    (found, _, obs), (_, _, obs_value) = _run(["grep key", "grep 1024"])
    _assert_output(ENV, obs, "docs/notes.md: key = 4817\n" + PROMPT)
    _assert_output(ENV, obs_value, "docs/logs/log.txt: port = 1024\n" + PROMPT)
    assert bool(found.found)
    (not_yet, _, obs_rel), (_, _, obs_none), (found, _, obs_key) = _run(
        ["grep port", "grep amber", "grep key"], cwd="/docs"
    )
    _assert_output(ENV, obs_rel, "logs/log.txt: port = 1024\n" + PROMPT)
    _assert_output(ENV, obs_none, PROMPT)  # readme is outside /docs: no output
    _assert_output(ENV, obs_key, "notes.md: key = 4817\n" + PROMPT)
    assert not bool(not_yet.found) and bool(found.found)


def test_terminal__long_grep_output_is_clipped_with_ellipsis():
    tree = {
        "app.cfg": ["mode = 4817", "host = 4817"],
        "bin": {"data.csv": ["user = 4817", "port = 4817"], "env.txt": ["level: 4817"]},
        "docs": {"log.txt": ["mode: 4817", "key = 4817"]},
    }
    (state, ts, obs), (state_key, _, _) = _run(["grep 4817", "grep key"], tree=tree)
    lines = [
        "app.cfg: mode = 4817",
        "app.cfg: host = 4817",
        "bin/data.csv: user = 4817",
        "bin/data.csv: port = 4817",
        "bin/env.txt: level: 4817",
    ]
    _assert_output(ENV, obs, "\n".join(lines) + "\n...\n" + PROMPT)
    assert not bool(state.found)  # the key line was the 7th match, clipped away
    assert bool(state_key.found)
    assert int(ts.obs_len) <= ENV.max_obs_len


def test_terminal__submit_ends_the_episode_and_is_absorbing():
    (wrong, ts_wrong, obs_wrong), (after, ts_after, _) = _run(["submit 1024", "submit 4817"])
    _assert_output(ENV, obs_wrong, "wrong\n")
    assert ts_wrong.done and not ts_wrong.success and ts_wrong.reward == 0.0
    jax.tree.map(np.testing.assert_array_equal, after, wrong)
    assert ts_after.done and ts_after.reward == 0.0 and ts_after.obs_len == 0
    assert ts_after.anchor == ts_wrong.anchor and not ts_after.success
    (_, ts, obs), (_, ts2, _) = _run(["submit 4817", "ls"])
    _assert_output(ENV, obs, "correct\n")
    assert ts.done and ts.success and ts.reward == 1.0
    assert ts2.done and not ts2.success and ts2.obs_len == 0


def test_terminal__invalid_commands_are_penalised_and_change_nothing():
    start = ENV.state_from_tree(TREE, "key")
    for command in ("ls -l", "cat", "submit 12", "cd docs logs", "rm readme", ""):
        ((state, ts, obs),) = _run([command])
        _assert_output(ENV, obs, terminal.MESSAGES["invalid"] + PROMPT)
        assert not ts.valid_action and not ts.done and ts.reward == pytest.approx(-0.05)
        jax.tree.map(np.testing.assert_array_equal, state, start)


def test_terminal__progress_reward_for_key_path_and_key_file():
    steps = _run(
        ["cd docs", "cd ..", "cd docs", "cd logs", "cd ..", "cat notes.md", "cat notes.md"],
        env=PROGRESS_ENV,
        step=_progress_step,
    )
    rewards = [float(ts.reward) for _, ts, _ in steps]
    np.testing.assert_allclose(rewards, [0.1, 0, 0, 0, 0, 0.1, 0], atol=1e-7)


def test_terminal__progress_reward_follows_the_grep_oracle():
    states, _ = BATCHED.reset(BATCHED.keys(13), TRAIN)  # same geometry as PROGRESS_ENV
    for i in range(4):
        state, total = helpers.index(states, i), 0.0
        for _ in range(8):
            if state.done:
                break
            action = PROGRESS_ENV.oracle_actions(state)[0]
            tokens = helpers.encode(PROGRESS_ENV, PROGRESS_ENV.commands[action], A)
            state, ts = _progress_step(jax.random.key(0), state, *tokens, TRAIN)
            total += float(ts.reward)
        key_depth = ENV._tree.dir_depth[ENV._tree.file_dir[int(state.target_file)]]
        assert bool(state.done) and total == pytest.approx(1.0 + 0.1 * (key_depth + 1))


# Slow (~12 s, op-by-op dispatch): the contract and fuzz tests run this env jitted on every
# split; FrozenLake's and Sokoban's jit-vs-eager tests stay in the default suite.
@pytest.mark.slow
def test_terminal__jit_matches_eager_on_short_episode():
    states, _ = BATCHED.reset(BATCHED.keys(3), TRAIN)
    start = helpers.index(states, 0)
    commands = ["grep key", "bogus", "submit 1024"]

    def episode(step_fn):
        state, out = start, []
        for i, command in enumerate(commands):
            state, ts = step_fn(jax.random.key(i), state, *helpers.encode(ENV, command, A), TRAIN)
            out.append(ts)
        return state, out

    jax.tree.map(np.testing.assert_array_equal, episode(_step), episode(ENV.step))


def _check_trees(env, states, min_depth):
    t = env._tree
    s = jax.device_get(states)
    n = s.cwd.shape[0]
    rows = np.arange(n)
    # Exactly one line with the task's field, in the key file, at depth >= min_key_depth.
    is_key = s.line_field == s.target_field[:, None, None]
    assert (is_key.sum(axis=(1, 2)) == 1).all()
    assert is_key[rows, s.target_file, s.target_line].all()
    assert np.isin(s.target_field, np.arange(len(terminal.SECRET_FIELDS))).all()
    assert (t.dir_depth[t.file_dir[s.target_file]] >= min_depth).all()
    assert s.file_present[rows, s.target_file].all()
    # Present children sorted by name in the first slots; absent slots -1.
    for i in range(n):
        for slot in range(t.num_dirs):
            kids = [c for c in t.children[slot] if c >= 0]
            names = s.dir_name[i, kids]
            present = s.dir_present[i, kids]
            assert (present == (names >= 0)).all()
            assert (np.diff(present.astype(int)) <= 0).all()  # present first
            assert (np.diff(names[present]) > 0).all()  # distinct, ascending
            if not s.dir_present[i, slot]:
                assert not present.any()
    assert ((s.file_name >= 0) == s.file_present).all()
    assert ((s.line_field >= 0) <= s.file_present[:, :, None]).all()


def test_terminal__vmap_reset_over_64_keys_gives_wellformed_trees():
    for params in (TRAIN, TEST):
        states, ts = BATCHED.reset(BATCHED.keys(0), params)
        assert ts.obs_tokens.shape == (B, ENV.max_prompt_len)
        assert not np.asarray(ts.done).any()
        _check_trees(ENV, states, ENV.config.min_key_depth)
        fields = np.asarray(states.target_field)
        assert len(set(fields.tolist())) == len(terminal.SECRET_FIELDS)
        for i in range(3):
            decoded = ENV.tokenizer.decode(np.asarray(ts.obs_tokens[i])).replace(" ", "")
            field = terminal.FIELDS[fields[i]]
            assert decoded.startswith(f"findthevalueof{field}andsubmitit\n")


def test_terminal__ood_trees_are_deeper_and_wider():
    states, ts = BATCHED_OOD.reset(BATCHED_OOD.keys(5), OOD_PARAMS)
    assert states.dir_present.shape == (B, 40) and ts.obs_tokens.shape == (B, 75)
    _check_trees(OOD_ENV, states, 1)
    depth = OOD_ENV._tree.dir_depth
    assert (np.asarray(states.dir_present)[:, depth == 3]).any(axis=1).mean() > 0.5
    assert np.asarray(states.dir_present).sum(axis=1).mean() > 7  # train trees: <= 7 dirs


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_terminal__grep_oracle_solves_every_generated_task(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    final, success, turns, total = batched.run_oracle(11, params, 4)
    assert np.asarray(final.done).all() and success.all()
    np.testing.assert_allclose(total, 1.0)
    # grep, cd down to the key's directory, cat, submit.
    key_depth = env._tree.dir_depth[env._tree.file_dir[np.asarray(final.target_file)]]
    np.testing.assert_array_equal(turns, key_depth + 3)


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("strategy", ["grep_submit", "dfs"])
def test_terminal__other_oracle_strategies_solve_train_and_ood(strategy):
    for batched, params in ((BATCHED, TRAIN), (BATCHED_OOD, OOD_PARAMS)):
        final, success, turns, _ = batched.run_oracle(12, params, 1, strategy)
        assert success.all()
        if strategy == "grep_submit":
            assert (turns == 2).all()
        else:
            assert turns.max() > 5


def test_terminal__oracle_is_closed_loop_from_any_state():
    # From /docs/logs after an ls: back up to "/", grep, then down again.
    state = ENV.state_from_tree(TREE, "key", cwd="/docs/logs")
    plan = [ENV.commands[i] for i in ENV.oracle_actions(state)]
    assert plan == ["cd ..", "cd ..", "grep key", "cd docs", "cat notes.md", "submit 4817"]
    dfs = [ENV.commands[i] for i in ENV.oracle_actions(ENV.state_from_tree(TREE, "key"), "dfs")]
    assert dfs == ["ls", "cat readme", "cd docs", "ls", "cat notes.md", "submit 4817"]
    with pytest.raises(ValueError, match="bfs.*grep"):
        ENV.oracle_actions(state, "bfs")


def _task_bytes(states):
    words = jax.vmap(lambda s: jnp.concatenate(terminal.task_words(s)))(states)
    return [bytes(np.asarray(w)) for w in words]


def test_terminal__train_and_test_tasks_are_disjoint():
    train = [
        t for s in range(8) for t in _task_bytes(BATCHED.reset(BATCHED.keys(100 + s), TRAIN)[0])
    ]
    test_states = [BATCHED.reset(BATCHED.keys(200 + s), TEST)[0] for s in range(4)]
    test = [t for s in test_states for t in _task_bytes(s)]
    assert not set(train) & set(test)
    assert len(set(train)) > 500 and len(set(test)) > 250
    hashes = np.concatenate([np.asarray(jax.vmap(terminal.task_hash)(s)) for s in test_states])
    assert (hashes % 1000 < 200).all()


def test_terminal__anchors_equal_iff_states_equal():
    states, ts0 = BATCHED.reset(BATCHED.keys(7), TRAIN)
    rng = np.random.default_rng(0)
    # Few tasks, many random valid commands, so states repeat across turns.
    states = jax.tree.map(lambda x: jnp.repeat(x[:4], B // 4, axis=0), states)
    by_anchor, by_state = {}, {}
    for _ in range(12):
        states, ts = BATCHED.act(
            states, rng.integers(0, 3 + 2 * 19 + len(terminal.FIELDS), B), TRAIN
        )
        flat = jax.vmap(
            lambda s: jnp.concatenate([jnp.ravel(x).astype(jnp.int32) for x in jax.tree.leaves(s)])
        )(states)
        for anchor, words in zip(np.asarray(ts.anchor).tolist(), np.asarray(flat), strict=True):
            by_anchor.setdefault(anchor, set()).add(bytes(words))
            by_state.setdefault(bytes(words), set()).add(anchor)
    assert len(by_state) > 30 and len(by_state) < 12 * B  # distinct states, some repeated
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())
    # Anchors follow states: the same tree, another working directory differs.
    a = ENV.anchor(ENV.state_from_tree(TREE, "key"))
    assert a != ENV.anchor(ENV.state_from_tree(TREE, "key", cwd="/docs"))
    assert a == ENV.anchor(ENV.state_from_tree(TREE, "key"))


def test_terminal__random_token_actions_never_crash():
    invalid, rewards, obs_len = BATCHED.random_turns(TRAIN, 9, 6)
    assert ((obs_len > 0) & (obs_len <= ENV.max_obs_len)).all()
    assert invalid.mean() > 0.9
    np.testing.assert_allclose(rewards[invalid], -0.05, rtol=1e-6)


def test_terminal__render_is_readable():
    text = ENV.render(ENV.state_from_tree(TREE, "key", cwd="/docs"))
    assert text.splitlines() == [
        "task: find the value of key (4817 in /docs/notes.md)",
        "cwd: /docs  found: False  done: False",
        "/",
        "  readme",
        "    | pin: amber",
        "  docs/",
        "    notes.md",
        "      | key = 4817",
        "      | user: maple",
        "    logs/",
        "      log.txt",
        "        | port = 1024",
    ]
    states, _ = BATCHED.reset(BATCHED.keys(0), TRAIN)
    assert ENV.render(helpers.index(states, 0)).startswith("task: find the value of ")


def test_terminal__bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="width must be in .* got 0"):
        terminal.Terminal(width=0)
    with pytest.raises(ValueError, match="max_output_lines must be >= 5"):
        terminal.Terminal(max_output_lines=3)
    with pytest.raises(ValueError, match="field 'user' is not allowed"):
        ENV.state_from_tree(TREE, "user")
    with pytest.raises(ValueError, match="not a valid command"):
        ENV.action_id("rm -rf")
