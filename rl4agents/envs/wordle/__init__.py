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

Modules: `world` (the word list, constants, state, the feedback rule, the split classes),
`oracle` (the host-side consistent-guess strategy and its precomputed tables) and `env` (the
registered `Wordle`: settings, secret pools, tables, `reset_env` / `step_env`).
"""

from rl4agents.envs.wordle.env import Wordle, WordleConfig
from rl4agents.envs.wordle.oracle import (
    choose_guess,
    feedback_np,
    oracle_guess,
    oracle_turns,
    pattern_code,
    pattern_table,
)
from rl4agents.envs.wordle.world import (
    ALPHABET,
    GRAY,
    GREEN,
    MARKS,
    SPLITS,
    WORD_LEN,
    WORDS,
    YELLOW,
    WordleParams,
    WordleState,
    feedback,
    heldout_mask,
    letters,
)

__all__ = [
    "Wordle",
    "WordleConfig",
    "choose_guess",
    "feedback_np",
    "oracle_guess",
    "oracle_turns",
    "pattern_code",
    "pattern_table",
    "ALPHABET",
    "GRAY",
    "GREEN",
    "MARKS",
    "SPLITS",
    "WORD_LEN",
    "WORDS",
    "YELLOW",
    "WordleParams",
    "WordleState",
    "feedback",
    "heldout_mask",
    "letters",
]
