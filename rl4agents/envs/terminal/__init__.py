"""A terminal: find a hidden value in a generated file tree with shell commands.

Each episode is a directory tree whose directory and file names come from fixed pools
(`DIR_NAMES`, `FILE_NAMES`); every file holds 1 to `lines_per_file` lines "field = value" or
"field: value" (fields from `FIELDS`, values drawn uniformly from the 256 of `VALUES`, so a
fixed guess is right on about 0.4% of tasks). Exactly one line in the whole tree
has the task's field (one of `SECRET_FIELDS`); the prompt asks for its value:

  find the value of key and submit it
  commands: ls, cd <dir>, cd .., cat <file>, grep <word>, pwd, submit <value>
  $

The agent starts in "/" and answers one command per turn; the environment replies with the
command's output, as a shell would, then the prompt "$":

  ls             the current directory's entries, one per line: directories (with a trailing
                 "/") then files, each group sorted by name
  cd <dir>       enter a subdirectory; `cd ..` goes up ("/" stays "/"); no output
  cat <file>     the file's lines
  grep <word>    recursive from the current directory: "path: line" for every line whose field
                 or value is <word>, path relative to the current directory, files before
                 subdirectories, each sorted by name
  pwd            the absolute path of the current directory
  submit <value> ends the episode: "correct" (reward `goal_reward`, success) or "wrong" (0)

Arguments are single names (no paths such as "docs/notes.md"). Errors are ordinary turns with
error output: "cd: notes.md: not a directory", "cd: tmp: no such directory", "cat: docs: is a
directory", "cat: todo.txt: no such file". A string that is none of the commands above over the
pools (e.g. "ls -l", "cat", "submit 12") is an invalid action: `invalid_penalty` is subtracted
and the observation says so and lists the commands. Outputs longer than `max_output_lines`
lines (only grep's can be) keep their first lines and end with a "..." line, so observations
fit the static `max_obs_len`.

Process signal (`progress_reward` c > 0): +c the first time the agent enters a directory on the
path to the key file, and +c the first time it prints the key file with cat.

Generation (pure JAX, from the reset key): a complete `width`-ary tree of `depth` levels below
"/" gives fixed slots; each directory keeps Binomial(`width`, `dir_prob`) subdirectories and
Binomial(`files_per_dir`, `file_prob`) files, with distinct names stored sorted in the first
slots, so a tree has exactly one state (tasks that look the same are equal). The key file is a
random file at depth >= `min_key_depth`. `num_candidates` trees per round; the first usable one
whose content hash is in the split's class is kept (rounds repeat up to `generator._MAX_ROUNDS`).

Splits: a task is in the test class when `hash_u32(task content) % 1000 < test_fraction * 1000`;
"train" only generates train-class tasks, "test" only test-class ones, so training never sees a
test task. "ood" is deeper and wider trees (`ood_depth`, `ood_width`), either class.

Modules: `world` (pools, messages, state, task hash, tree geometry), `generator` (tree
generation), `shell` (command output as fragment-id rows), `host` (states from nested dicts,
rendering, the oracle's plans) and `env` (the registered `Terminal`: settings, tables,
`reset_env` / `step_env`).
"""

from rl4agents.envs.terminal.env import Terminal, TerminalConfig
from rl4agents.envs.terminal.world import (
    DIR_NAMES,
    FIELDS,
    FILE_NAMES,
    HELP,
    MESSAGES,
    ORACLE_STRATEGIES,
    SECRET_FIELDS,
    SEPARATORS,
    SPLITS,
    VALUES,
    TerminalParams,
    TerminalState,
    task_hash,
    task_words,
)

__all__ = [
    "Terminal",
    "TerminalConfig",
    "DIR_NAMES",
    "FIELDS",
    "FILE_NAMES",
    "HELP",
    "MESSAGES",
    "ORACLE_STRATEGIES",
    "SECRET_FIELDS",
    "SEPARATORS",
    "SPLITS",
    "VALUES",
    "TerminalParams",
    "TerminalState",
    "task_hash",
    "task_words",
]
