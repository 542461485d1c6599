"""Wordle-style word guessing as a multi-turn text environment.

A secret 5-letter word is drawn from a word list shipped in this module (`WORDS`, 879 common
English words written for rl4agents; none is a single token of the built-in vocabulary, so with
the built-in tokenizer every guess is "guess" plus five letter tokens). Each turn the agent
answers "guess <word>" with a word of the list; the environment replies with one token pair per
letter, the letter and its mark, on one line:

  "+" right letter in the right place (green), "?" in the word elsewhere (yellow),
  "-" not in the word (gray); e.g. the guess "crane" for the secret "cable" gives
  " c+ r- a? n- e+".

Duplicate letters follow the standard rule: greens first, then each remaining guess letter, left
to right, is yellow while the secret still has an unmatched copy of it, else gray. The prompt
states the word length, the turn budget (`max_guesses`, default 6) and this legend.

Every turn uses one turn of the budget, including a turn whose text is not "guess <listed
word>" (then `valid_action=False`, reward -`invalid_penalty`, and the observation says what is
allowed). Solving gives `goal_reward + turns_left_bonus * (turns left after the guess)` and ends
the episode (success); spending the budget ends it unsolved. `progress_reward` adds a process
reward per newly found green position (a sub-goal: positions never green in an earlier guess).

Splits: a word is test-class when `hash_u32(letters) % 1000 < test_fraction * 1000`; "train"
draws only train-class secrets, "test" only test-class ones (disjoint sets of secrets; the
allowed guesses are always the whole list). "ood" allows fewer turns (`ood_max_guesses`,
default 4) with secrets of either class.

Oracle (`oracle_actions`): a consistent-guess ("hard mode") strategy that uses only the
feedback observed so far: among the words of the list consistent with every feedback line, it
guesses the one whose feedback splits the remaining candidates into the most parts (ties: the
smaller largest part, then the earlier word). It solves every listed secret within 6 guesses
(1 guess: 1 word, 2: 124, 3: 530, 4: 201, 5: 19, 6: 4) and 856 of the 879 within 4. "pound" and
"wound" were left out of the list: with them "sound" needed 7. Each split draws its secrets only
among those the oracle solves within the env's budget, so the oracle solves every generated task
(the tests check it): at the default 6 guesses that is every word of the class; the "ood" env
(4 guesses) leaves out 23 words.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = base.SPLITS
WORD_LEN = 5
GREEN, YELLOW, GRAY = range(3)
MARKS = ("+", "?", "-")  # per color id
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
WORDS = tuple(
    """
    about above abuse actor acute admit adopt adult after agent agree ahead alarm album alert
    alien alike alive allow alone along alter among anger angle angry ankle apart apple apply
    apron arena argue arise armor array arrow aside asset audio audit avoid award aware awful
    bacon badge badly baker basic basin basis batch beach beard beast begin being belly below
    bench berry birth black blade blame blank blast blaze bleak blend bless blind blink block
    bloom blown blunt blush board boast bonus boost booth bored bound brain brake brand brass
    brave bread break breed brick bride brief bring brisk broad broke brook broom brown brush
    buddy budge build built bunch burst buyer cabin cable camel canal candy canoe cargo carry
    carve catch cause cease chain chair chalk charm chart chase cheap cheat check cheek cheer
    chess chest chick chief child chill chose chunk cider cigar civic civil claim clash class
    clean clear clerk cliff climb cling cloak clock cloth cloud clown coach coast cocoa colon
    comic coral couch cough could count court cover crack craft crane crash crate crawl crazy
    cream creek crest crime crisp cross crowd crown crude cruel crumb crush crust cubic curve
    cycle daily dairy daisy dance dealt death debut decay delay dense depth diary dirty ditch
    dizzy dodge doing donor doubt dough dozen draft drain drama drank drawn dread dream dress
    dried drift drill drink drive drove drown dusty dwarf eager eagle early earth easel eaten
    ebony eight elbow elder elect elite empty enemy enjoy enter entry equal equip erase error
    essay event every exact exile exist extra fable faint fairy faith false fancy fatal fault
    feast fence ferry fetch fever fiber field fifth fifty fight final flame flash fleet flesh
    float flock flood flour fluid flush flute focus foggy force forge forth forty forum found
    frame fresh frost froze fruit fully funny fuzzy gauge ghost giant given glare glass gleam
    glide globe gloom glory glove goose grace grade grain grand grant grape graph grasp grass
    grave gravy great greed green greet grief grill grind groan group grove growl grown guard
    guest guide guilt habit happy hardy harsh hasty hatch haunt haven heart heavy hedge hello
    hence hinge hobby honey honor horse hotel hound house hover human humid humor hurry ideal
    image imply index inner input irony issue ivory jelly jewel joint joker jolly judge juice
    juicy jumbo knife knock known label labor large laser later laugh layer learn lease least
    leave ledge legal lemon level lever light limit linen liver lobby local lodge logic loose
    lover lower loyal lucky lunar lunch lying magic major maker mango manor maple march marsh
    match mayor meant medal media melon mercy merit merry metal meter might mimic minor minus
    mixer model moist money month moral motor mound mount mouse mouth movie muddy mural music
    naive nasty naval nerve never nifty night noble noise north notch novel nurse nylon oasis
    occur ocean offer often olive onion opera orbit order organ other otter ought ounce outer
    owner oxide paint panel panic paper party pasta paste patch pause peace peach pearl pedal
    penny perch phase phone photo piano piece pilot pinch pitch pixel pizza place plain plane
    plank plant plate plaza pluck plumb plump point polar porch pouch power press price pride
    prime print prior prism prize probe proof proud prove prune pulse punch pupil puppy purse
    queen query quest quick quiet quilt quite quota quote radar radio rainy raise rally ranch
    range rapid ratio raven reach ready realm rebel refer relax relay renew reply rider ridge
    rifle rigid rinse risky rival river roast robin robot rocky rough round route royal rugby
    ruler rumor rural rusty saint salad salon sandy sauce scale scarf scene scent scoop scope
    score scout scrap screw scrub seize sense serve seven shade shaft shake shall shame shape
    share shark sharp shave sheep sheet shelf shell shift shine shiny shirt shock shore short
    shout shown shrug sight silly since siren sixth sixty skate skill skirt skull slate sleep
    slept slice slide slope small smart smell smile smoke snack snake sneak sniff solar solid
    solve sorry sound south space spare spark speak spear speed spell spend spent spice spicy
    spike spill spine spoke spoon sport spray squad stack staff stage stain stair stake stale
    stamp stand start state steak steam steel steep steer stern stick stiff still sting stock
    stone stool store storm story stove straw strip stuck study stuff style sugar suite sunny
    super surge swamp swear sweat sweep sweet swell swift swing sword table taken taste teach
    teeth tempo thank theft their theme there these thick thief thing think third thorn those
    three threw throw thumb tiger tight timer tired title toast today token tooth topic torch
    total touch tough towel tower toxic track trade trail train trait trash treat trend trial
    tribe trick truck truly trunk trust truth tulip tumor twice twist ultra uncle under union
    unity until upper upset urban usage usual vague valve vapor vault venue verse video vigor
    villa vinyl viral virus visit vital vivid vocal voice voter wagon waist waste watch water
    weary weave wedge weigh weird whale wheat wheel where which while whine whirl white whole
    whose widow width witch woman world worry worse worst worth would woven wrath wreck wrist
    write wrong wrote yacht yeast yield young youth zebra
""".split()
)


WordleParams = base.SplitParams


@flax.struct.dataclass
class WordleState:
    """One episode: the secret and the guesses so far (M = max_guesses)."""

    secret: jax.Array  # int32[] word id of the secret
    guesses: jax.Array  # int32[M] word id guessed at each turn; -1 invalid turn or not yet
    turn: jax.Array  # int32[] turns taken
    greens: jax.Array  # bool[5] positions found green so far (a function of guesses, secret)
    done: jax.Array  # bool[] solved or out of turns


def letters(words: tuple[str, ...]) -> np.ndarray:
    """int32[W, 5] letter ids (a = 0) of each word."""
    return np.array([[ALPHABET.index(ch) for ch in w] for w in words], np.int32)


def feedback(guess: jax.Array, secret: jax.Array) -> jax.Array:
    """Per-letter colors of a guess, with the standard duplicate-letter rule.

    Args:
      guess: int32[5] letter ids of the guess.
      secret: int32[5] letter ids of the secret.

    Returns:
      int32[5] GREEN, YELLOW or GRAY per guess position: greens first, then each other guess
      letter, left to right, is yellow while the secret has an unmatched copy of it left.
    """
    green = guess == secret
    same = guess[:, None] == guess[None, :]  # [i, j]
    earlier = jnp.tril(jnp.ones((WORD_LEN, WORD_LEN), bool), -1)  # j < i
    rank = (same & earlier & ~green[None, :]).sum(axis=1)  # earlier unmatched copies in guess
    available = ((secret[None, :] == guess[:, None]) & ~green[None, :]).sum(axis=1)
    yellow = ~green & (rank < available)
    return jnp.where(green, GREEN, jnp.where(yellow, YELLOW, GRAY)).astype(jnp.int32)


def feedback_np(guess: np.ndarray, secret: np.ndarray) -> np.ndarray:
    """NumPy `feedback` broadcast over leading axes: int[..., 5] x int[..., 5] -> int8[..., 5]."""
    guess, secret = np.broadcast_arrays(guess, secret)
    green = guess == secret
    same = guess[..., :, None] == guess[..., None, :]
    earlier = np.tril(np.ones((WORD_LEN, WORD_LEN), bool), -1)
    rank = (same & earlier & ~green[..., None, :]).sum(axis=-1)
    available = ((secret[..., None, :] == guess[..., :, None]) & ~green[..., None, :]).sum(axis=-1)
    yellow = ~green & (rank < available)
    return np.where(green, GREEN, np.where(yellow, YELLOW, GRAY)).astype(np.int8)


def pattern_code(colors: np.ndarray) -> np.ndarray:
    """int[...] base-3 code sum_i colors[..., i] * 3**i of int[..., 5] colors (242 = all gray)."""
    return (np.asarray(colors, np.int64) * 3 ** np.arange(WORD_LEN)).sum(axis=-1)


def _frozen(x: np.ndarray) -> np.ndarray:
    """x made read-only (the cached tables are shared by every env)."""
    x.setflags(write=False)
    return x


@functools.cache
def pattern_table(words: tuple[str, ...]) -> np.ndarray:
    """uint8[W, W] feedback code of guess g (row) against secret s (column); cached per list."""
    ids = letters(words)
    rows = [pattern_code(feedback_np(ids[g][None, :], ids)) for g in range(len(words))]
    return _frozen(np.stack(rows).astype(np.uint8))


@functools.cache
def heldout_mask(words: tuple[str, ...], threshold: int) -> np.ndarray:
    """bool[W] whether each word is a test-class secret (hash_u32(letters) % 1000 < threshold)."""
    hashes = jax.jit(jax.vmap(text.hash_u32))(jnp.asarray(letters(words)))
    return _frozen(np.asarray(hashes) % 1000 < threshold)


def choose_guess(table: np.ndarray, candidates: np.ndarray) -> int:
    """The oracle's guess among consistent candidates.

    Args:
      table: uint8[W, W] `pattern_table`.
      candidates: int[C] word ids consistent with the feedback so far (C >= 1, sorted).

    Returns:
      The candidate whose feedback splits the candidates into the most parts; ties: the
      smaller largest part, then the smaller word id.
    """
    if len(candidates) <= 2:
        return int(candidates[0])
    c = len(candidates)
    codes = np.sort(table[np.ix_(candidates, candidates)], axis=1).astype(np.int64)  # [C, C]
    change = codes[:, 1:] != codes[:, :-1]
    parts = 1 + change.sum(axis=1)
    run = np.concatenate([np.zeros((c, 1), np.int64), np.cumsum(change, axis=1)], axis=1)
    largest = np.bincount((run + c * np.arange(c)[:, None]).ravel(), minlength=c * c)
    largest = largest.reshape(c, c).max(axis=1)
    best = np.lexsort((candidates, largest, -parts))[0]
    return int(candidates[best])


@functools.cache
def _first_guess(words: tuple[str, ...]) -> int:
    return choose_guess(pattern_table(words), np.arange(len(words)))


def oracle_guess(words: tuple[str, ...], history: list[tuple[int, int]]) -> int:
    """The oracle's next guess from the observed (word id, feedback code) pairs."""
    if not history:
        return _first_guess(words)
    table = pattern_table(words)
    consistent = np.ones((len(words),), bool)
    for guess, code in history:
        consistent &= table[guess] == code
    return choose_guess(table, np.flatnonzero(consistent))


@functools.cache
def oracle_turns(words: tuple[str, ...]) -> np.ndarray:
    """int32[W] guesses the oracle needs to solve each secret (its whole decision tree)."""
    table = pattern_table(words)
    turns = np.zeros((len(words),), np.int32)

    def _solve(candidates, depth):
        guess = choose_guess(table, candidates) if depth else _first_guess(words)
        codes = table[guess, candidates]
        for code in np.unique(codes):
            group = candidates[codes == code]
            if code == 0:  # all green: the guess is the secret
                turns[guess] = depth + 1
            else:
                _solve(group, depth + 1)

    _solve(np.arange(len(words)), 0)
    return _frozen(turns)


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
        if self.max_guesses < 3:
            raise ValueError(f"max_guesses must be >= 3, got {self.max_guesses}")
        if self.ood_max_guesses < 3:
            raise ValueError(f"ood_max_guesses must be >= 3, got {self.ood_max_guesses}")
        base.check_test_fraction(self.test_fraction)
        base.check_nonnegative("goal_reward", self.goal_reward)
        base.check_nonnegative("turns_left_bonus", self.turns_left_bonus, " (0 = off)")
        base.check_nonnegative("progress_reward", self.progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", self.invalid_penalty, " (it is subtracted)")
        is_test = heldout_mask(WORDS, int(round(self.test_fraction * 1000)))
        if is_test.all() or not is_test.any():
            raise ValueError(
                "test_fraction must leave at least one word in each class (train and test), "
                f"got {self.test_fraction}"
            )


@registry.register("wordle")
class Wordle(base.TextEnv):
    """Wordle text environment (see the module docstring).

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
        return new_state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=done,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=solved,
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
