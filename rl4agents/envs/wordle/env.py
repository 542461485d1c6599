"""The Wordle environment: its settings, the turn dynamics and the feedback text (the package
docstring describes the task)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.wordle.oracle import feedback_np, oracle_guess, oracle_turns, pattern_table
from rl4agents.envs.wordle.world import (
    ALPHABET,
    GREEN,
    MARKS,
    WORD_LEN,
    WORDS,
    WordleParams,
    WordleState,
    feedback,
    heldout_mask,
    letters,
)
from rl4agents.types import TimeStep


def _prompt(max_guesses: int) -> str:
    return (
        f"guess the {WORD_LEN} letter word in {max_guesses} turns\n"
        "feedback per letter: + right place ? elsewhere - absent"
    )


@dataclasses.dataclass(frozen=True)
class WordleConfig:
    """Static settings (the constructor's arguments; see `Wordle`), checked when built."""

    max_guesses: int = 6
    goal_reward: float = 1.0
    turns_left_bonus: float = 0.0
    progress_reward: float = 0.0
    invalid_penalty: float = 0.1
    test_fraction: float = 0.2
    ood_max_guesses: int = 4

    def __post_init__(self):
        base.check_range("max_guesses", self.max_guesses, 3)
        base.check_range("ood_max_guesses", self.ood_max_guesses, 3)
        base.check_shared_settings(self)
        is_test = heldout_mask(WORDS, int(round(self.test_fraction * 1000)))
        if is_test.all() or not is_test.any():
            raise ValueError(
                "test_fraction must leave at least one word in each class (train and test), "
                f"got {self.test_fraction}"
            )


@registry.register("wordle")
class Wordle(base.TextEnv):
    """Wordle text environment (see the package docstring).

    Attributes:
      config: `WordleConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
      words: the word list (allowed guesses and possible secrets).
      max_prompt_len: P, length of the instructions returned by `reset`.
      max_obs_len: O, length of the observation returned by `step`.
      max_action_len: longest action ("guess <word>") in tokens.
      num_actions: W, one "guess <word>" per listed word (action id = word id).
      pools: int32[3, L] secret word ids per split (train, test, ood), padded with -1.
      pool_sizes: int32[3] number of secrets per split.

    Args (a value out of its range raises ValueError at construction):
      max_guesses: M, the turn budget, >= 3.
      goal_reward: reward for solving, >= 0.
      turns_left_bonus: added per turn left after the solving guess, >= 0 (0 = off).
      progress_reward: per newly found green position, >= 0 (0 = off).
      invalid_penalty: subtracted on a turn that is not "guess <listed word>", >= 0.
      test_fraction: share of the words in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] and at least one word in each class.
      ood_max_guesses: the turn budget of the "ood" env, >= 3.
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        max_guesses: int = 6,
        goal_reward: float = 1.0,
        turns_left_bonus: float = 0.0,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.1,
        test_fraction: float = 0.2,
        ood_max_guesses: int = 4,
        tokenizer: text.Tokenizer | None = None,
    ):
        super().__init__(base.settings(WordleConfig, locals()), tokenizer)
        self.words = WORDS
        self._letters = letters(self.words)
        # The split's classes, over this module's word list (cached per threshold).
        is_test = heldout_mask(WORDS, self.test_threshold)

        # Secrets per split: the class's words the oracle solves within the budget.
        solvable = oracle_turns(self.words) <= max_guesses
        pools = [
            np.flatnonzero(solvable & ~is_test),
            np.flatnonzero(solvable & is_test),
            np.flatnonzero(solvable),
        ]
        self.pool_sizes = np.array([len(p) for p in pools], np.int32)
        self.pools = np.full((3, self.pool_sizes.max()), -1, np.int32)
        for i, pool in enumerate(pools):
            self.pools[i, : len(pool)] = pool

        self.action_table = text.FragmentTable.build(
            self.tokenizer, {f"guess {w}": f"guess {w}" for w in self.words}
        )
        marks = {
            # A leading space keeps letters apart under tokenizers that keep whitespace.
            f"{ch}{mark}": f" {ch}{mark}"
            for ch in ALPHABET
            for mark in MARKS
        }
        self._frags = text.FragmentTable.build(
            self.tokenizer,
            {
                **marks,  # fragment id = 3 * letter + color
                # Ends every observation: the policy's next token is its action.
                "end": "\n",
                "invalid": "invalid action allowed: guess word",
                "prompt": _prompt(max_guesses),
                # Never emitted here: keeps the OOD env's prompt (another budget) within this
                # env's text surface, so `text.minimal_tokenizer(env)` has its digit too.
                "ood_prompt": _prompt(ood_max_guesses),
            },
        )
        self.num_actions = len(self.words)
        self.max_action_len = int(self.action_table.lengths.max())
        lengths = self._frags.lengths
        end_len = int(lengths[self._frags.id("end")])
        feedback_len = WORD_LEN * int(lengths[: 3 * len(ALPHABET)].max())
        invalid_len = int(lengths[self._frags.id("invalid")])
        self.max_prompt_len = int(lengths[self._frags.id("prompt")]) + end_len
        self.max_obs_len = max(feedback_len, invalid_len) + end_len

    def ood_config(self) -> WordleConfig:
        """A turn budget of `ood_max_guesses`."""
        return dataclasses.replace(self.config, max_guesses=self.config.ood_max_guesses)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self.action_table, self._frags)

    def reset_env(
        self, key: jax.Array, params: WordleParams
    ) -> tuple[WordleState, jax.Array, jax.Array]:
        """Draws a secret of the params' split uniformly from its pool.

        Returns:
          The state, the instructions obs_tokens int32[P] and obs_len int32[].
        """
        size = jnp.asarray(self.pool_sizes)[params.split]
        index = jax.random.randint(key, (), 0, size)
        secret = jnp.asarray(self.pools)[params.split, index]
        state = WordleState(
            secret=secret,
            guesses=jnp.full((self.config.max_guesses,), -1, jnp.int32),
            turn=jnp.zeros((), jnp.int32),
            greens=jnp.zeros((WORD_LEN,), bool),
            done=jnp.zeros((), bool),
        )
        ids = jnp.asarray([self._frags.id("prompt"), self._frags.id("end")], jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, obs, obs_len

    def step_env(
        self,
        key: jax.Array,
        state: WordleState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: WordleParams,
    ) -> tuple[WordleState, TimeStep]:
        """One turn: parse "guess <word>", score it against the secret, show the feedback.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `WordleState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `WordleParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c = self.config
        table = jnp.asarray(self._letters)
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        guess = table[jnp.maximum(action, 0)]
        colors = feedback(guess, table[state.secret])
        solved = valid & jnp.all(colors == GREEN)
        new_greens = valid & (colors == GREEN) & ~state.greens
        turn = state.turn + 1
        done = solved | (turn >= c.max_guesses)
        new_state = state.replace(
            guesses=state.guesses.at[state.turn].set(action, mode="drop"),
            turn=turn,
            greens=state.greens | new_greens,
            done=done,
        )

        marks = jnp.where(valid, 3 * guess + colors, -1)
        message = jnp.where(valid, -1, self._frags.id("invalid"))
        ids = jnp.concatenate([marks, jnp.stack([message, self._frags.id("end")])])
        obs, obs_len = text.concat_fragments(
            self._frags, ids.astype(jnp.int32), self.tokenizer.pad_id, self.max_obs_len
        )
        bonus = c.goal_reward + c.turns_left_bonus * (c.max_guesses - turn)
        reward = (
            jnp.where(valid, 0.0, -c.invalid_penalty)
            + jnp.where(solved, bonus, 0.0)
            + c.progress_reward * new_greens.sum()
        )
        return self.end_turn(
            new_state, obs, obs_len, reward, done=done, valid=valid, success=solved
        )

    def anchor(self, state: WordleState) -> jax.Array:
        """uint32[] hash of (secret, guesses per turn, turns taken): the full state.

        The secret is hidden from the agent, yet it is part of the exact state GiGPO groups by;
        within a group of samples of one task (one secret) the anchor is the guess history.
        """
        state = jax.tree.map(jnp.asarray, state)
        return text.hash_u32(jnp.concatenate([state.secret[None], state.guesses, state.turn[None]]))

    def word_id(self, word: str) -> int:
        """Id of a listed word (= the id of the action guessing it); unknown words raise."""
        try:
            return self.words.index(word)
        except ValueError:
            raise ValueError(f"{word!r} is not in the word list (Wordle.words)") from None

    def make_state(self, secret: str, guesses: tuple[str | None, ...] = ()) -> WordleState:
        """A state after `guesses` (None = an invalid turn) against `secret` (host side)."""
        max_guesses = self.config.max_guesses
        if len(guesses) > max_guesses:
            raise ValueError(f"at most {max_guesses} guesses, got {len(guesses)}")
        secret_id = self.word_id(secret)
        ids = np.full((max_guesses,), -1, np.int32)
        greens = np.zeros((WORD_LEN,), bool)
        solved = False
        for i, word in enumerate(guesses):
            if solved:
                raise ValueError(f"guesses continue after solving: {guesses}")
            if word is not None:
                ids[i] = self.word_id(word)
                greens |= self._letters[ids[i]] == self._letters[secret_id]
                solved = ids[i] == secret_id
        return WordleState(
            secret=jnp.asarray(secret_id, jnp.int32),
            guesses=jnp.asarray(ids),
            turn=jnp.asarray(len(guesses), jnp.int32),
            greens=jnp.asarray(greens),
            done=jnp.asarray(solved or len(guesses) == max_guesses),
        )

    def feedback_text(self, guess: str, secret: str) -> str:
        """The feedback line for `guess` against `secret`, e.g. " c+ r- a? n- e+" (host side)."""
        colors = feedback_np(
            self._letters[self.word_id(guess)], self._letters[self.word_id(secret)]
        )
        return "".join(f" {ch}{MARKS[c]}" for ch, c in zip(guess, colors.tolist()))

    def render(self, state: WordleState) -> str:
        """The board as text (host side): the secret, then one line per turn taken."""
        state = jax.device_get(state)
        secret = self.words[int(state.secret)]
        turn = int(state.turn)
        lines = [f"secret {secret}, turn {turn}/{self.config.max_guesses}"]
        for guess in np.asarray(state.guesses)[:turn].tolist():
            if guess < 0:
                lines.append("(invalid)")
            else:
                lines.append(self.words[guess] + self.feedback_text(self.words[guess], secret))
        if bool(state.done):
            solved = turn and int(np.asarray(state.guesses)[turn - 1]) == int(state.secret)
            lines.append("solved" if solved else "out of turns")
        return "".join(line + "\n" for line in lines)

    def oracle_actions(self, state: WordleState) -> list[int] | None:
        """The consistent-guess oracle's guesses (action ids) from this state, or None.

        The first action uses only the feedback observed so far (the guesses in the state and
        their feedback); the rest of the plan replays the same strategy against the feedback
        the secret will give, so the plan solves the task when it returns one. Returns [] once
        solved and None when the episode ended unsolved or the strategy cannot solve it within
        the turns left.
        """
        state = jax.device_get(state)
        secret, turn = int(state.secret), int(state.turn)
        guesses = np.asarray(state.guesses)[:turn].tolist()
        if bool(state.done):
            return [] if guesses and guesses[-1] == secret else None
        table = pattern_table(self.words)
        history = [(g, int(table[g, secret])) for g in guesses if g >= 0]
        plan = []
        while turn + len(plan) < self.config.max_guesses:
            guess = oracle_guess(self.words, history)
            plan.append(guess)
            if guess == secret:
                return plan
            history.append((guess, int(table[guess, secret])))
        return None
