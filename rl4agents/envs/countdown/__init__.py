"""Countdown with a calculator tool as a multi-turn text environment.

The agent gets `num_numbers` small numbers and a target. Each turn it answers either

  "calc a op b"  with op one of "+", "-", "*" and a, b numbers it currently holds: the result
                 replaces the two operands; the reply is "a op b = r" and the numbers left;
  "answer n"     which ends the episode.

An answer scores `goal_reward` (success) only when n equals the target, n is one of the numbers
currently held, and at least one calc was made. Generated targets are never among the starting
numbers, so the target must be built with the tool: guessing it without calcs cannot score.
Every number is an integer in 0..`max_value` (at most 99, two digits): a calc whose result is
negative or above `max_value` is an invalid turn, as is one naming a number not held (a number
held once cannot be used twice). Invalid turns cost `invalid_penalty` and change nothing.

The action table enumerates every string "calc a op b" and "answer n" over 0..`max_value`
(3 (M+1)^2 + (M+1) actions, 2914 for the default M = 30) and the parser matches the whole
action against it (`text.match_action`), so any tokenizer works. Numbers held are kept sorted
ascending; the observation lists them as "left: 3 , 5 , 7" (commas keep multi-digit numbers
apart when a tokenizer spells digits one by one).

Generation (pure JAX, from the reset key): `num_candidates` candidates per round, each drawing
`num_numbers` starting numbers uniformly from 1..`max_start` and combining them all by
`num_numbers - 1` random operations on random pairs ("-" takes the larger minus the smaller),
so every task is solvable. A candidate qualifies when every intermediate result is in range,
the target is in [`min_target`, `max_value`], the target is not a starting number, and the
task's class matches the split: a task (sorted starting numbers, target) belongs to the test
class when `hash_u32(task) % 1000 < test_fraction * 1000`, so training never generates a test
task. Rounds repeat (at most `generator._MAX_ROUNDS`, inside a `while_loop`); if none
qualifies (which has negligible probability for the defaults) a fixed solvable task found at
construction is used.
The "ood" split has more numbers and larger targets: `num_numbers=ood_num_numbers`,
`max_value=ood_max_value` and targets from `ood_min_target` (default: one above the training
`max_value`), either class.

Process signal (`progress_reward` c > 0): potential-based shaping `c * (d(s) - d(s'))`, where
d is the fewest calcs that still make the target appear among the numbers held (0 once it is
held; `num_numbers` when it can no longer be made). A calc on a shortest route to the target
earns +c, a detour 0 or less, a dead end -c times the lost distance; the optimal policy is
unchanged (Ng et al., 1999).

Modules: `world` (constants, state, task hash, the calc distance of the process reward),
`generator` (task generation and the fallback task), `solver` (the host-side shortest calc
sequence) and `env` (the registered `Countdown`: settings, tables, `reset_env` / `step_env`).
"""

from rl4agents.envs.countdown.env import Countdown, CountdownConfig
from rl4agents.envs.countdown.generator import candidate, find_fallback, generate
from rl4agents.envs.countdown.solver import reachable, solve
from rl4agents.envs.countdown.world import (
    EMPTY,
    OPS,
    SPLITS,
    CountdownParams,
    CountdownState,
    calc_distance,
    canonical,
    task_hash,
)

__all__ = [
    "Countdown",
    "CountdownConfig",
    "candidate",
    "find_fallback",
    "generate",
    "reachable",
    "solve",
    "EMPTY",
    "OPS",
    "SPLITS",
    "CountdownParams",
    "CountdownState",
    "calc_distance",
    "canonical",
    "task_hash",
]
