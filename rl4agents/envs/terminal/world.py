"""The terminal's vocabulary and state: name, field and value pools, the shell's messages, the
episode state, the task hash that decides a task's split class, and the static slot geometry of
the directory tree."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
DIR_NAMES = ("bin", "docs", "etc", "home", "lib", "logs", "opt", "src", "tmp", "var")
FILE_NAMES = (
    "app.cfg",
    "data.csv",
    "env.txt",
    "log.txt",
    "main.py",
    "notes.md",
    "readme",
    "run.sh",
    "todo.txt",
)
SECRET_FIELDS = ("code", "key", "pass", "pin", "token")  # what a task may ask for
FIELDS = SECRET_FIELDS + ("host", "level", "mode", "port", "user")
_NAMED_VALUES = (
    "1024",
    "2093",
    "3141",
    "4817",
    "5520",
    "6174",
    "7305",
    "8642",
    "amber",
    "cedar",
    "coral",
    "fern",
    "ivory",
    "maple",
    "olive",
    "slate",
)


def _value_pool(size: int = 256) -> tuple[str, ...]:
    """The named values, then distinct 4-digit codes from a fixed generator, `size` in all.

    A large pool keeps guessing honest: submitting one fixed value every episode succeeds on
    about 1/`size` of tasks (values are drawn uniformly from the pool).
    """
    codes = np.random.default_rng(6174).permutation(np.arange(1000, 10000)).tolist()
    extra = [str(c) for c in codes if str(c) not in _NAMED_VALUES]
    return _NAMED_VALUES + tuple(extra[: size - len(_NAMED_VALUES)])


VALUES = _value_pool()
SEPARATORS = (" = ", ": ")
ORACLE_STRATEGIES = ("grep", "grep_submit", "dfs")
# Command ids of the action table.
LS, PWD, CD_UP, CD, CAT, GREP, SUBMIT = range(7)
HELP = "commands: ls, cd <dir>, cd .., cat <file>, grep <word>, pwd, submit <value>\n"
# Fixed fragments, in table order after the pools (names -> text).
MESSAGES = {
    "slash": "/",
    "newline": "\n",
    "colon": ": ",
    "more": "...\n",
    "end": "$\n",  # the shell prompt ends every observation until the episode is over
    "cd": "cd: ",
    "cat": "cat: ",
    "no_dir": ": no such directory\n",
    "not_dir": ": not a directory\n",
    "no_file": ": no such file\n",
    "is_dir": ": is a directory\n",
    "correct": "correct\n",
    "wrong": "wrong\n",
    "invalid": "invalid command; use ls, cd, cat, grep, pwd or submit\n",
    "task": "find the value of ",
    "task_end": " and submit it\n",
    "help": HELP,
}


# Per-run parameters: `split` 0 train class, 1 test class, 2 either class (ood).
TerminalParams = base.SplitParams


@flax.struct.dataclass
class TerminalState:
    """One episode: the tree (D directory slots, F = D * files_per_dir file slots, L lines per
    file), the task, the working directory and what the agent has been shown so far.

    Names and line entries of absent slots are -1, so equal trees have equal states.
    """

    dir_present: jax.Array  # bool[D] slot 0 is "/"; children of slot i are width * i + 1 + j
    dir_name: jax.Array  # int32[D] index into DIR_NAMES, -1 absent (and for "/")
    file_present: jax.Array  # bool[F] file slot f lies in directory f // files_per_dir
    file_name: jax.Array  # int32[F] index into FILE_NAMES, -1 absent
    line_field: jax.Array  # int32[F, L] index into FIELDS, -1 no line
    line_sep: jax.Array  # int32[F, L] index into SEPARATORS, -1 no line
    line_value: jax.Array  # int32[F, L] index into VALUES, -1 no line
    target_field: jax.Array  # int32[] index into FIELDS (one of SECRET_FIELDS)
    target_file: jax.Array  # int32[] file slot holding the only line with target_field
    target_line: jax.Array  # int32[] that line's index in the file
    cwd: jax.Array  # int32[] directory slot of the working directory
    visited: jax.Array  # bool[D] directories entered so far ("/" at reset)
    listed: jax.Array  # bool[D] directories listed with ls so far
    catted: jax.Array  # bool[F] files printed with cat so far
    found: jax.Array  # bool[] the key line has been shown (by cat or grep)
    done: jax.Array  # bool[] a value was submitted


def task_hash(state: TerminalState) -> jax.Array:
    """uint32[] hash of the task content (tree, lines, target), which decides its split class."""
    return text.hash_u32(jnp.concatenate(task_words(state)))


def task_words(state: TerminalState) -> list[jax.Array]:
    return [
        jnp.ravel(x).astype(jnp.int32)
        for x in (
            state.dir_present,
            state.dir_name,
            state.file_present,
            state.file_name,
            state.line_field,
            state.line_sep,
            state.line_value,
            state.target_field,
            state.target_file,
            state.target_line,
        )
    ]


class Tree:
    """Static slot geometry of a complete `width`-ary tree of `depth` levels (host numpy)."""

    def __init__(self, depth: int, width: int, files_per_dir: int, lines_per_file: int):
        self.depth, self.width, self.files_per_dir = depth, width, files_per_dir
        self.num_dirs = sum(width**d for d in range(depth + 1))
        self.num_files = self.num_dirs * files_per_dir
        slots = np.arange(self.num_dirs)
        self.parent = np.maximum((slots - 1) // width, 0).astype(np.int32)  # "/" -> "/"
        self.dir_depth = np.zeros(self.num_dirs, np.int32)
        for i in range(1, self.num_dirs):
            self.dir_depth[i] = self.dir_depth[self.parent[i]] + 1
        # ancestor[i, d]: the slot at depth d on the path from "/" to i (i itself at its depth).
        self.ancestor = np.full((self.num_dirs, depth + 1), -1, np.int32)
        for i in range(self.num_dirs):
            node = i
            for d in range(self.dir_depth[i], -1, -1):
                self.ancestor[i, d] = node
                node = self.parent[node]
        children = width * slots[:, None] + 1 + np.arange(width)[None, :]
        self.children = np.where(children < self.num_dirs, children, -1).astype(np.int32)
        self.child_rank = np.zeros(self.num_dirs, np.int32)
        self.child_rank[1:] = (slots[1:] - 1) % width
        self.file_dir = (np.arange(self.num_files) // files_per_dir).astype(np.int32)
        # Pre-order walk (a directory's files, then its subdirectories): grep's output order.
        order, stack = [], [0]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(c for c in self.children[node][::-1] if c >= 0)
        self.preorder = np.array(order, np.int32)
        files = (self.preorder[:, None] * files_per_dir + np.arange(files_per_dir)).ravel()
        self.line_order = (files[:, None] * lines_per_file + np.arange(lines_per_file)).ravel()
