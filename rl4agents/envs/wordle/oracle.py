"""Host-side Wordle oracle: the consistent-guess strategy over precomputed feedback patterns."""

from __future__ import annotations

import functools

import numpy as np

from rl4agents.envs.wordle.world import GRAY, GREEN, WORD_LEN, YELLOW, _frozen, letters


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


@functools.cache
def pattern_table(words: tuple[str, ...]) -> np.ndarray:
    """uint8[W, W] feedback code of guess g (row) against secret s (column); cached per list."""
    ids = letters(words)
    rows = [pattern_code(feedback_np(ids[g][None, :], ids)) for g in range(len(words))]
    return _frozen(np.stack(rows).astype(np.uint8))


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
