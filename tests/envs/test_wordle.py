"""Tests for rl4agents.envs.wordle: feedback rule, hand-checked turns, secrets, the oracle.

Each jitted function is built once per env at import (batched reset and one batched turn over
B episodes, one single-episode step); multi-turn play loops over the batched turn on the host,
which lets the oracle act closed-loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import text
from rl4agents.envs import registry, wordle
from tests.envs import helpers

B = 64  # episodes per batched call
ENV = wordle.Wordle()
A = ENV.max_action_len + 2  # action slots passed to `step` (room for junk tokens)
OOD_ENV, OOD_PARAMS = ENV.make_split("ood")
TRAIN, TEST = ENV.default_params("train"), ENV.default_params("test")
SHAPED = wordle.Wordle(progress_reward=0.1, turns_left_bonus=0.1)


def _reference_feedback(guess: str, secret: str) -> str:
    """Two-pass Wordle rule written plainly: greens, then yellows consuming leftover letters."""
    marks = ["-"] * 5
    left = []
    for i in range(5):
        if guess[i] == secret[i]:
            marks[i] = "+"
        else:
            left.append(secret[i])
    for i in range(5):
        if marks[i] != "+" and guess[i] in left:
            marks[i] = "?"
            left.remove(guess[i])
    return "".join(f" {g}{m}" for g, m in zip(guess, marks))


class Batched(helpers.StepBatch):
    """`helpers.StepBatch` whose action id -1 is the junk action "guess"."""

    def act(self, states, action_ids, params):
        """One turn of B episodes from int[B] action ids (-1: the junk action "guess")."""
        ids = np.asarray(action_ids)
        tokens, lens = self.table[np.maximum(ids, 0)], self.lengths[np.maximum(ids, 0)]
        lens = np.where(ids < 0, 1, lens)  # "guess" alone: not an action
        return self.step(self.keys(0), states, jnp.asarray(tokens), jnp.asarray(lens), params)


BATCHED = Batched(ENV, A, B)
BATCHED_OOD = Batched(OOD_ENV, A, B)
_step = jax.jit(ENV.step)
_shaped_step = jax.jit(SHAPED.step)


def _obs_ids(ts):
    return np.asarray(ts.obs_tokens)[: int(ts.obs_len)].tolist()


def _play(env, state, actions, step=_step):
    """Steps through action texts; returns [(state, ts)]."""
    out = []
    for action in actions:
        state, ts = step(
            jax.random.key(0), state, *helpers.encode(env, action, A), env.default_params()
        )
        out.append((state, ts))
    return out


def test_wordle__registered_with_builtin_sizes_and_word_list():
    env = registry.make("wordle")
    assert isinstance(env, wordle.Wordle)
    # "guess" + 5 letters; 5 (letter, mark) pairs + "\n"; the prompt's 60 tokens.
    assert (env.max_prompt_len, env.max_obs_len, env.max_action_len) == (60, 11, 6)
    assert env.num_actions == len(wordle.WORDS) == 879
    words = wordle.WORDS
    assert len(set(words)) == len(words) and list(words) == sorted(words)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in words)
    assert not set(words) & set(env.tokenizer.words)  # always 5 letter tokens
    assert env.tokenizer.decode(env.action_tokens(env.word_id("crane"))) == "guess c r a n e"
    assert OOD_ENV.config.max_guesses == 4 and OOD_ENV.max_prompt_len == 60
    # The minimal vocabulary of the train env also spells the OOD prompt (its "4").
    minimal = text.minimal_tokenizer(env)
    ood = wordle.Wordle(tokenizer=minimal).make_split("ood")[0]
    prompt_ids = ood._frags.tokens[ood._frags.id("prompt")]
    assert minimal.unk_id not in prompt_ids.tolist() and "4" in minimal.decode(prompt_ids)
    prompt = BATCHED.reset(BATCHED.keys(0), TRAIN)[1]
    assert env.tokenizer.decode(np.asarray(prompt.obs_tokens[0])).startswith(
        "guess the 5 l e t t e r w o r d in 6 turns\n"
    )


@pytest.mark.parametrize(
    "guess, secret, expected",
    [
        ("crane", "cable", " c+ r- a? n- e+"),
        ("speed", "abide", " s- p- e? e- d?"),  # one e in the secret: only the first is yellow
        ("speed", "erase", " s? p- e? e? d-"),  # two e's: both yellow
        ("eerie", "there", " e? e- r? i- e+"),  # the green e uses up one of the secret's two
        ("lolly", "hello", " l- o? l+ l+ y-"),  # greens take both l's: the first l is gray
        ("geese", "sweet", " g- e? e+ s? e-"),
    ],
)
def test_wordle__feedback_follows_the_duplicate_letter_rule(guess, secret, expected):
    assert _reference_feedback(guess, secret) == expected
    g, s = wordle.letters((guess, secret))
    colors = np.asarray(jax.jit(wordle.feedback)(jnp.asarray(g), jnp.asarray(s)))
    assert "".join(f" {ch}{wordle.MARKS[c]}" for ch, c in zip(guess, colors)) == expected
    np.testing.assert_array_equal(wordle.feedback_np(g, s), colors)


def test_wordle__feedback_matches_reference_on_random_pairs():
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 4, (2000, 2, 5))  # a 4-letter alphabet: many repeated letters
    colors = np.asarray(jax.jit(jax.vmap(wordle.feedback))(pairs[:, 0], pairs[:, 1]))
    np.testing.assert_array_equal(wordle.feedback_np(pairs[:, 0], pairs[:, 1]), colors)
    for (g, s), c in zip(pairs[:300], colors[:300]):
        guess, secret = ("".join(wordle.ALPHABET[i] for i in w) for w in (g, s))
        got = "".join(f" {ch}{wordle.MARKS[k]}" for ch, k in zip(guess, c))
        assert got == _reference_feedback(guess, secret)
    table = wordle.pattern_table(wordle.WORDS)
    crane, cable = ENV.word_id("crane"), ENV.word_id("cable")
    assert table[cable, cable] == 0  # all green
    assert table[crane, cable] == wordle.pattern_code([0, 2, 1, 2, 0]) == 0 + 2 * 3 + 9 + 2 * 27


def test_wordle__guesses_show_feedback_and_solving_ends_the_episode():
    start = ENV.make_state("cable")
    (s1, ts1), (s2, ts2), (s3, ts3), (s4, ts4) = _play(
        ENV, start, ["guess crane", "guess hello", "guess cable", "guess cable"]
    )
    assert ENV.feedback_text("crane", "cable") == " c+ r- a? n- e+"
    assert _obs_ids(ts1) == ENV.tokenizer.encode(" c+ r- a? n- e+\n")
    assert ts1.valid_action and not ts1.done and ts1.reward == 0.0 and int(s1.turn) == 1
    assert int(s1.guesses[0]) == ENV.word_id("crane")
    np.testing.assert_array_equal(s1.greens, [True, False, False, False, True])
    assert _obs_ids(ts2) == ENV.tokenizer.encode(" h- e? l- l+ o-\n")
    assert _obs_ids(ts3) == ENV.tokenizer.encode(" c+ a+ b+ l+ e+\n")
    assert ts3.done and ts3.success and ts3.reward == pytest.approx(1.0) and int(s3.turn) == 3
    # Absorbing after solving.
    jax.tree.map(np.testing.assert_array_equal, s4, s3)
    assert ts4.done and not ts4.success and ts4.reward == 0.0 and ts4.obs_len == 0
    assert ts4.anchor == ts3.anchor
    jax.tree.map(
        np.testing.assert_array_equal, s3, ENV.make_state("cable", ("crane", "hello", "cable"))
    )


def test_wordle__invalid_turns_are_penalised_and_use_the_budget():
    start = ENV.make_state("cable", ("crane",))
    actions = ["guess zzzzz", "guess", "crane", "guess crane crane", "guess hello"]
    steps = _play(ENV, start, actions)
    for _, ts in steps[:4]:
        assert not ts.valid_action and ts.reward == pytest.approx(-0.1)
        assert ENV.tokenizer.decode(_obs_ids(ts)) == "invalid action allowed: guess w o r d\n"
        assert int(ts.obs_len) == 9
    final, ts = steps[-1]
    # Turn 6 of 6: out of turns, unsolved.
    assert ts.valid_action and ts.done and not ts.success and ts.reward == 0.0
    crane, hello = ENV.word_id("crane"), ENV.word_id("hello")
    np.testing.assert_array_equal(final.guesses, [crane, -1, -1, -1, -1, hello])
    assert int(final.turn) == 6 and bool(final.done)
    assert ENV.oracle_actions(final) is None
    assert ENV.render(final).splitlines()[-3:] == [
        "(invalid)",
        "hello h- e? l- l+ o-",
        "out of turns",
    ]


def test_wordle__progress_reward_and_turns_left_bonus():
    steps = _play(
        SHAPED,
        SHAPED.make_state("cable"),
        ["guess crane", "guess crane", "guess table", "guess cable"],
        step=_shaped_step,
    )
    rewards = [float(ts.reward) for _, ts in steps]
    # New greens c, e; none new; a, b, l; solved at turn 4 of 6: 1 + 0.1 * 2 (no new greens).
    np.testing.assert_allclose(rewards, [0.2, 0.0, 0.3, 1.2], rtol=1e-5)


def test_wordle__secret_pools_follow_the_hash_classes():
    classes = wordle.heldout_mask(wordle.WORDS, 200)
    hashes = np.asarray(jax.vmap(text.hash_u32)(jnp.asarray(wordle.letters(wordle.WORDS))))
    np.testing.assert_array_equal(classes, hashes % 1000 < 200)
    train, test, ood = (ENV.pools[i, : ENV.pool_sizes[i]] for i in range(3))
    assert not set(train) & set(test) and len(train) + len(test) == len(wordle.WORDS)
    assert not classes[train].any() and classes[test].all() and len(ood) == len(wordle.WORDS)
    turns = wordle.oracle_turns(wordle.WORDS)
    assert turns.max() == 6 and (turns <= 4).sum() == 856 == OOD_ENV.pool_sizes[2]
    assert (turns[OOD_ENV.pools[2, :856]] <= 4).all()


def test_wordle__reset_draws_disjoint_train_and_test_secrets():
    def secrets(batched, params, seeds):
        return np.concatenate(
            [
                np.asarray(batched.reset(batched.keys(50 + s), params)[0].secret)
                for s in range(seeds)
            ]
        )

    train, test = secrets(BATCHED, TRAIN, 8), secrets(BATCHED, TEST, 4)  # 512 and 256
    classes = wordle.heldout_mask(wordle.WORDS, 200)
    assert not classes[train].any() and classes[test].all()
    assert len(set(train)) > 250 and len(set(test)) > 120  # 716 and 163 possible secrets
    ood = secrets(BATCHED_OOD, OOD_PARAMS, 2)
    assert classes[ood].any() and not classes[ood].all()  # either class
    assert (wordle.oracle_turns(wordle.WORDS)[ood] <= 4).all()
    states, ts = BATCHED.reset(BATCHED.keys(0), TRAIN)
    assert (np.asarray(states.guesses) == -1).all() and not np.asarray(states.done).any()
    assert (np.asarray(ts.obs_len) == ENV.max_prompt_len).all()


@pytest.mark.slow  # a few hundred generated tasks per split: tests -m slow
@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_wordle__oracle_solves_every_generated_task_closed_loop(split):
    env, params = ENV.make_split(split)
    batched = BATCHED_OOD if split == "ood" else BATCHED
    expected_turns = wordle.oracle_turns(wordle.WORDS)
    for seed in range(4):  # 256 tasks
        states, _ = batched.reset(batched.keys(seed), params)
        secrets = np.asarray(states.secret)
        success, turns, ret = np.zeros(B, bool), np.zeros(B, int), np.zeros(B)
        for _ in range(env.config.max_guesses):
            host = jax.device_get(states)
            actions = []
            for i in range(B):
                plan = env.oracle_actions(helpers.index(host, i))
                assert plan is not None
                actions.append(plan[0] if plan else 0)
            turns += ~np.asarray(host.done)
            states, ts = batched.act(states, actions, params)
            success |= np.asarray(ts.success)
            ret += np.asarray(ts.reward)
        assert success.all() and np.asarray(states.done).all()
        np.testing.assert_allclose(ret, 1.0)
        np.testing.assert_array_equal(turns, expected_turns[secrets])


def test_wordle__oracle_uses_only_the_observed_feedback():
    table = wordle.pattern_table(wordle.WORDS)
    rng = np.random.default_rng(1)
    checked = 0
    for secret in rng.choice(len(wordle.WORDS), 40, replace=False):
        plan = ENV.oracle_actions(ENV.make_state(ENV.words[secret]))
        history = [ENV.words[g] for g in plan[:2] if g != secret]
        if not history:
            continue
        state = ENV.make_state(ENV.words[secret], tuple(history))
        # Another secret with the same feedback so far: the same next guess.
        same = np.ones(len(wordle.WORDS), bool)
        for word in history:
            g = ENV.word_id(word)
            same &= table[g] == table[g, secret]
        others = [s for s in np.flatnonzero(same) if s != secret]
        if not others:
            continue
        other = ENV.make_state(ENV.words[others[0]], tuple(history))
        assert ENV.oracle_actions(other)[0] == ENV.oracle_actions(state)[0]
        checked += 1
    assert checked >= 10
    assert ENV.words[ENV.oracle_actions(ENV.make_state("cable"))[0]] == "crate"
    assert ENV.oracle_actions(ENV.make_state("crate", ("crate",))) == []


def test_wordle__vmapped_step_matches_single_episode_step():
    states, _ = BATCHED.reset(BATCHED.keys(3), TRAIN)
    ids = (np.arange(B) * 37) % ENV.num_actions
    ids[::5] = -1
    new, ts = BATCHED.act(states, ids, TRAIN)
    for i in (0, 1, 2, 5, B - 1):
        text_ = "guess" if ids[i] < 0 else f"guess {ENV.words[ids[i]]}"
        ((single, ts_single),) = _play(ENV, helpers.index(states, i), [text_])
        jax.tree.map(np.testing.assert_array_equal, single, helpers.index(new, i))
        jax.tree.map(np.testing.assert_array_equal, ts_single, helpers.index(ts, i))


def test_wordle__anchors_equal_iff_states_equal():
    # Few secrets and few guesses, so that many episodes reach equal states.
    secrets = ("cable", "crane", "sweet", "hello")
    starts = [ENV.make_state(secrets[i % 4]) for i in range(B)]
    states = jax.tree.map(lambda *x: jnp.stack(x), *starts)
    choices = np.array([ENV.word_id(w) for w in ("crane", "hello", "sweet")] + [-1])
    rng = np.random.default_rng(2)
    anchors, keys = [], []
    for _ in range(ENV.config.max_guesses + 1):
        states, ts = BATCHED.act(states, rng.choice(choices, B), TRAIN)
        host = jax.device_get(states)
        anchors += list(np.asarray(ts.anchor))
        keys += [
            (int(host.secret[i]), tuple(host.guesses[i].tolist()), int(host.turn[i]))
            for i in range(B)
        ]
    by_anchor, by_state = {}, {}
    for anchor, key in zip(anchors, keys, strict=True):
        by_anchor.setdefault(int(anchor), set()).add(key)
        by_state.setdefault(key, set()).add(int(anchor))
    assert 50 < len(by_state) < len(keys) / 2
    assert all(len(v) == 1 for v in by_anchor.values())
    assert all(len(v) == 1 for v in by_state.values())


def test_wordle__random_token_actions_are_penalised_turns():
    states, _ = BATCHED.reset(BATCHED.keys(4), TRAIN)
    vocab = ENV.tokenizer.vocab_size
    for turn in range(3):
        key_tok, key_len = jax.random.split(jax.random.key(20 + turn))
        tokens, lengths = helpers.random_actions(vocab, key_tok, key_len, (B,), A)
        new, ts = BATCHED.step(BATCHED.keys(turn), states, tokens, lengths, TRAIN)
        assert not np.asarray(ts.valid_action).any()
        np.testing.assert_allclose(np.asarray(ts.reward), -0.1, rtol=1e-6)
        assert (np.asarray(new.turn) == turn + 1).all() and (
            np.asarray(new.guesses)[:, turn] == -1
        ).all()
        assert (np.asarray(ts.obs_len) == 9).all()
        states = new


def test_wordle__render_is_readable():
    state = ENV.make_state("cable", ("crane", None, "cable"))
    assert ENV.render(state) == (
        "secret cable, turn 3/6\ncrane c+ r- a? n- e+\n(invalid)\ncable c+ a+ b+ l+ e+\nsolved\n"
    )
    assert ENV.render(ENV.make_state("sweet")) == "secret sweet, turn 0/6\n"


def test_wordle__arguments_and_splits_are_validated():
    with pytest.raises(ValueError, match="validation.*train"):
        ENV.make_split("validation")
    with pytest.raises(ValueError, match="max_guesses must be >= 3"):
        wordle.Wordle(max_guesses=2)
    with pytest.raises(ValueError, match="ood_max_guesses must be >= 3"):
        wordle.Wordle(ood_max_guesses=1)
    with pytest.raises(ValueError, match="test_fraction"):
        wordle.Wordle(test_fraction=0.0)
    with pytest.raises(ValueError, match="'zzzzz' is not in the word list"):
        ENV.make_state("zzzzz")
