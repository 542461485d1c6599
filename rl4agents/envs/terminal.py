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
whose content hash is in the split's class is kept (rounds repeat up to `_MAX_ROUNDS`).

Splits: a task is in the test class when `hash_u32(task content) % 1000 < test_fraction * 1000`;
"train" only generates train-class tasks, "test" only test-class ones, so training never sees a
test task. "ood" is deeper and wider trees (`ood_depth`, `ood_width`), either class.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.types import TimeStep

SPLITS = ("train", "test", "ood")
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
_MAX_ROUNDS = 16
_HELP = "commands: ls, cd <dir>, cd .., cat <file>, grep <word>, pwd, submit <value>\n"
# Fixed fragments, in table order after the pools (names -> text).
_MESSAGES = {
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
    "help": _HELP,
}


@flax.struct.dataclass
class TerminalParams:
    """Per-run parameters: which task class `reset` draws."""

    split: jax.Array  # int32[] 0 train class, 1 test class, 2 either class (ood)


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


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed splits: {list(SPLITS)}")
    return SPLITS.index(split)


def task_hash(state: TerminalState) -> jax.Array:
    """uint32[] hash of the task content (tree, lines, target), which decides its split class."""
    return text.hash_u32(jnp.concatenate(_task_words(state)))


def _task_words(state: TerminalState) -> list[jax.Array]:
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


class _Tree:
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


@registry.register("terminal")
class Terminal:
    """Terminal text environment (see the module docstring).

    Attributes:
      tokenizer: tokenizer the fragments were encoded with.
      depth, width, files_per_dir, lines_per_file: tree geometry.
      max_prompt_len: P, length of the task prompt returned by `reset`.
      max_obs_len: O, length of the observation returned by `step` (clipped command output).
      max_action_len: longest command in tokens.
      num_actions: number of valid command strings (every command over the name pools).

    Args (a value out of its range raises ValueError at construction):
      depth: directory levels below "/", in [1, 5].
      width: most subdirectories per directory, in [1, len(DIR_NAMES)].
      files_per_dir: most files per directory, in [1, len(FILE_NAMES)].
      lines_per_file: most lines per file, in [1, 8].
      dir_prob: probability of keeping each subdirectory slot, in (0, 1].
      file_prob: probability of keeping each file slot, in (0, 1].
      min_key_depth: least depth of the key file, in [0, depth] (and <= ood_depth).
      max_output_lines: output lines kept per turn, >= max(width, ood_width) + files_per_dir
        and >= lines_per_file (so ls and cat are never clipped).
      progress_reward: per first entry of a directory on the key's path and first cat of the
        key file, >= 0 (0 = off).
      invalid_penalty: subtracted on a turn whose command does not parse, >= 0.
      goal_reward: reward for submitting the right value, >= 0.
      test_fraction: share of tasks in the held-out test class, in (0, 1) with
        round(1000 * test_fraction) in [1, 999] (tasks hash into 1000 classes).
      ood_depth: `depth` of the "ood" trees, in [1, 5].
      ood_width: `width` of the "ood" trees, in [1, len(DIR_NAMES)].
      num_candidates: trees per generation round, in [1, 4096].
      tokenizer: encodes the text fragments (default: the built-in tokenizer).
    """

    def __init__(
        self,
        depth: int = 2,
        width: int = 2,
        files_per_dir: int = 2,
        lines_per_file: int = 2,
        dir_prob: float = 0.75,
        file_prob: float = 0.6,
        min_key_depth: int = 1,
        max_output_lines: int = 5,
        progress_reward: float = 0.0,
        invalid_penalty: float = 0.05,
        goal_reward: float = 1.0,
        test_fraction: float = 0.2,
        ood_depth: int = 3,
        ood_width: int = 3,
        num_candidates: int = 16,
        tokenizer: text.Tokenizer | None = None,
    ):
        for name, value, low, high in (
            ("depth", depth, 1, 5),
            ("ood_depth", ood_depth, 1, 5),
            ("width", width, 1, len(DIR_NAMES)),
            ("ood_width", ood_width, 1, len(DIR_NAMES)),
            ("files_per_dir", files_per_dir, 1, len(FILE_NAMES)),
            ("lines_per_file", lines_per_file, 1, 8),
            ("min_key_depth", min_key_depth, 0, depth),
            ("num_candidates", num_candidates, 1, 4096),
        ):
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
        for name, value in (("dir_prob", dir_prob), ("file_prob", file_prob)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if min_key_depth > ood_depth:
            raise ValueError(
                f"min_key_depth must be <= ood_depth={ood_depth} (the ood trees), "
                f"got {min_key_depth}"
            )
        base.check_test_fraction(test_fraction)
        base.check_nonnegative("progress_reward", progress_reward, " (0 = off)")
        base.check_nonnegative("invalid_penalty", invalid_penalty, " (it is subtracted)")
        base.check_nonnegative("goal_reward", goal_reward)
        need = max(width + files_per_dir, ood_width + files_per_dir, lines_per_file)
        if max_output_lines < need:
            raise ValueError(
                f"max_output_lines must be >= {need} (so ls and cat are never clipped: "
                f"max(width, ood_width) + files_per_dir and lines_per_file), "
                f"got {max_output_lines}"
            )
        self._kwargs = dict(
            depth=depth,
            width=width,
            files_per_dir=files_per_dir,
            lines_per_file=lines_per_file,
            dir_prob=dir_prob,
            file_prob=file_prob,
            min_key_depth=min_key_depth,
            max_output_lines=max_output_lines,
            progress_reward=progress_reward,
            invalid_penalty=invalid_penalty,
            goal_reward=goal_reward,
            test_fraction=test_fraction,
            ood_depth=ood_depth,
            ood_width=ood_width,
            num_candidates=num_candidates,
            tokenizer=tokenizer,
        )
        self.tokenizer = text.BuiltinTokenizer() if tokenizer is None else tokenizer
        self.depth, self.width = depth, width
        self.files_per_dir, self.lines_per_file = files_per_dir, lines_per_file
        self.dir_prob, self.file_prob = dir_prob, file_prob
        self.min_key_depth = min_key_depth
        self.max_output_lines = max_output_lines
        self.progress_reward = progress_reward
        self.invalid_penalty = invalid_penalty
        self.goal_reward = goal_reward
        self.test_threshold = int(round(test_fraction * 1000))
        self.ood_depth, self.ood_width = ood_depth, ood_width
        self.num_candidates = num_candidates
        self._tree = _Tree(depth, width, files_per_dir, lines_per_file)

        # One fragment table: the pools (dirs, files, fields, separators, values), then messages.
        # `_<pool>0` is a pool's first fragment id.
        pools = {
            "dir": DIR_NAMES,
            "file": FILE_NAMES,
            "field": FIELDS,
            "sep": SEPARATORS,
            "value": VALUES,
        }
        frags = {f"{name}:{i}": s for name, pool in pools.items() for i, s in enumerate(pool)}
        first = np.cumsum([0] + [len(pool) for pool in pools.values()]).tolist()
        self._dir0, self._file0, self._field0, self._sep0, self._value0 = first[:5]
        frags.update(_MESSAGES)
        self._frags = text.FragmentTable.build(self.tokenizer, frags)
        self._fid = {name: self._frags.id(name) for name in _MESSAGES}

        # Every valid command string: (command id, argument). Name arguments index DIR_NAMES
        # then FILE_NAMES; grep words index FIELDS then VALUES; submit indexes VALUES.
        names = DIR_NAMES + FILE_NAMES
        commands = [("ls", LS, 0), ("pwd", PWD, 0), ("cd ..", CD_UP, 0)]
        commands += [(f"cd {n}", CD, i) for i, n in enumerate(names)]
        commands += [(f"cat {n}", CAT, i) for i, n in enumerate(names)]
        commands += [(f"grep {w}", GREP, i) for i, w in enumerate(FIELDS + VALUES)]
        commands += [(f"submit {v}", SUBMIT, i) for i, v in enumerate(VALUES)]
        self.commands = tuple(c[0] for c in commands)
        self._actions = text.FragmentTable.build(self.tokenizer, {c: c for c in self.commands})
        self._command = np.array([c[1] for c in commands], np.int32)
        self._argument = np.array([c[2] for c in commands], np.int32)
        self.num_actions = len(commands)
        self.max_action_len = int(self._actions.lengths.max())

        # Static sizes from the fragment lengths (upper bounds over every row kind).
        length = lambda name: int(self._frags.lengths[self._frags.id(name)])  # noqa: E731
        pool_max = lambda prefix, pool: max(  # noqa: E731
            length(f"{prefix}:{i}") for i in range(len(pool))
        )
        dir_len, file_len = pool_max("dir", DIR_NAMES), pool_max("file", FILE_NAMES)
        field_len, value_len = pool_max("field", FIELDS), pool_max("value", VALUES)
        nl, slash = length("newline"), length("slash")
        line_len = field_len + pool_max("sep", SEPARATORS) + value_len + nl
        grep_row = depth * (dir_len + slash) + file_len + length("colon") + line_len
        ls_out = width * (dir_len + slash + nl) + files_per_dir * (file_len + nl)
        pwd_row = slash + depth * (dir_len + slash) + nl
        message = max(length("cd"), length("cat")) + max(dir_len, file_len)
        message += max(length(m) for m in ("no_dir", "not_dir", "no_file", "is_dir"))
        single = max(pwd_row, message, length("correct"), length("wrong"), length("invalid"))
        output = max(
            self.max_output_lines * grep_row + length("more"),
            ls_out,
            lines_per_file * line_len,
            single,
        )
        self.max_obs_len = output + length("end")
        self.max_prompt_len = (
            length("task") + field_len + length("task_end") + length("help") + length("end")
        )
        self._row_width = 2 * depth + 6  # grep rows are the widest

    # ----------------------------------------------------------------------------------------
    def default_params(self, split: str = "train") -> TerminalParams:
        """Params selecting the task class `split` ("ood": either class)."""
        return TerminalParams(split=jnp.asarray(_split_id(split), jnp.int32))

    def make_split(self, split: str) -> tuple[Terminal, TerminalParams]:
        """(env, params) for "train", "test" or "ood" (a new env: ood_depth, ood_width)."""
        _split_id(split)
        env = self
        if split == "ood":
            ood = {"depth": self.ood_depth, "width": self.ood_width, "tokenizer": self.tokenizer}
            env = Terminal(**{**self._kwargs, **ood})
        return env, env.default_params(split)

    def reset(self, key: jax.Array, params: TerminalParams) -> tuple[TerminalState, TimeStep]:
        """Generates a tree of the params' class; the agent starts in "/".

        Args:
          key: typed PRNG key.
          params: `TerminalParams`.

        Returns:
          The state and a TimeStep whose obs_tokens int32[P] hold the task prompt.
        """
        state = self._generate(key, params.split)
        f = self._fid
        ids = jnp.stack(
            [
                jnp.asarray(f["task"]),
                self._field0 + state.target_field,
                jnp.asarray(f["task_end"]),
                jnp.asarray(f["help"]),
                jnp.asarray(f["end"]),
            ]
        ).astype(jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_prompt_len
        )
        return state, TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=jnp.zeros((), jnp.float32),
            done=jnp.zeros((), bool),
            anchor=self.anchor(state),
            valid_action=jnp.ones((), bool),
            success=jnp.zeros((), bool),
        )

    def step(
        self,
        key: jax.Array,
        state: TerminalState,
        action_tokens: jax.Array,
        action_len: jax.Array,
        params: TerminalParams,
    ) -> tuple[TerminalState, TimeStep]:
        """One turn: parse the command, run it, observe its output and the prompt.

        Args:
          key: typed PRNG key (unused: the dynamics are deterministic).
          state: current `TerminalState`.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `TerminalParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O]; absorbing once done.
        """
        del key, params
        state = jax.tree.map(jnp.asarray, state)  # host (numpy) states work eagerly too
        tree, f = self._tree, self._fid
        action = text.match_action(self._actions, action_tokens, action_len)
        valid = action >= 0
        command = jnp.where(valid, jnp.asarray(self._command)[jnp.maximum(action, 0)], -1)
        arg = jnp.asarray(self._argument)[jnp.maximum(action, 0)]
        num_dir_names = len(DIR_NAMES)

        # The working directory's entries.
        children = jnp.asarray(tree.children)[state.cwd]  # [W] slots, -1 beyond the leaves
        child_ok = (children >= 0) & state.dir_present[jnp.maximum(children, 0)]
        child_names = jnp.where(child_ok, state.dir_name[jnp.maximum(children, 0)], -1)
        files = state.cwd * self.files_per_dir + jnp.arange(self.files_per_dir)
        file_names = jnp.where(state.file_present[files], state.file_name[files], -1)
        dir_hit = child_names == arg  # arg < num_dir_names for directory names
        file_hit = (file_names >= 0) & (file_names + num_dir_names == arg)
        is_cd, is_cat = command == CD, command == CAT
        cd_ok = is_cd & dir_hit.any()
        cat_ok = is_cat & file_hit.any()
        cat_file = files[jnp.argmax(file_hit)]

        cwd = jnp.where(cd_ok, children[jnp.argmax(dir_hit)], state.cwd)
        cwd = jnp.where(command == CD_UP, jnp.asarray(tree.parent)[state.cwd], cwd)
        grep_rows, grep_shown, target_shown = self._grep(state, arg)
        submitted = command == SUBMIT
        correct = submitted & (arg == self._target_value(state))
        key_dir = jnp.asarray(tree.file_dir)[state.target_file]
        on_key_path = jnp.asarray(tree.ancestor)[key_dir, jnp.asarray(tree.dir_depth)[cwd]] == cwd
        new_state = state.replace(
            cwd=cwd,
            visited=state.visited.at[cwd].set(True),
            listed=state.listed.at[state.cwd].set(state.listed[state.cwd] | (command == LS)),
            catted=state.catted.at[cat_file].set(state.catted[cat_file] | cat_ok),
            found=state.found
            | (cat_ok & (cat_file == state.target_file))
            | ((command == GREP) & target_shown),
            done=submitted,
        )

        # Output rows [M, row_width] of fragment ids (-1 = nothing), chosen by what happened.
        ls_rows = self._ls_rows(child_names, file_names)
        cat_rows = self._line_rows(state, cat_file)
        message = self._message_row(command, arg, dir_hit.any(), file_hit.any(), correct)
        pwd = self._pwd_row(state)
        single = jnp.where(command == PWD, pwd, message)
        single = jnp.full_like(ls_rows, -1).at[0].set(single)
        rows = jnp.where(command == LS, ls_rows, single)
        rows = jnp.where(cat_ok, cat_rows, rows)
        rows = jnp.where(command == GREP, self._clip(grep_rows, grep_shown), rows)
        rows = jnp.where(valid, rows, -1)
        prefix = jnp.where(valid, -1, f["invalid"])
        end = jnp.where(submitted, -1, f["end"])
        ids = jnp.concatenate([prefix[None], rows.ravel(), end[None]]).astype(jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )

        reward = jnp.where(correct, self.goal_reward, 0.0)
        if self.progress_reward:
            entered = on_key_path & ~state.visited[cwd]
            first_cat = cat_ok & (cat_file == state.target_file) & ~state.catted[cat_file]
            reward = reward + self.progress_reward * (entered.astype(jnp.float32) + first_cat)
        reward = jnp.where(valid, reward, -self.invalid_penalty)
        timestep = TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=reward.astype(jnp.float32),
            done=submitted,
            anchor=self.anchor(new_state),
            valid_action=valid,
            success=correct,
        )
        frozen = base.empty_timestep(self.max_obs_len, self.anchor(state), self.tokenizer.pad_id)
        return base.absorbing(state.done, (state, frozen), (new_state, timestep))

    def anchor(self, state: TerminalState) -> jax.Array:
        """uint32[] hash of the whole state (task, working directory, what was shown, done)."""
        progress = [
            jnp.ravel(x).astype(jnp.int32)
            for x in (state.cwd, state.visited, state.listed, state.catted, state.found, state.done)
        ]
        return text.hash_u32(jnp.concatenate(_task_words(state) + progress))

    # ----------------------------------------------------------------------------------------
    def _target_value(self, state: TerminalState) -> jax.Array:
        """int32[] index into VALUES of the key line's value."""
        return state.line_value[state.target_file, state.target_line]

    def _pad_row(self, parts: list[jax.Array]) -> jax.Array:
        """int32[row_width] fragment ids `parts` followed by -1."""
        row = jnp.stack([jnp.asarray(p, jnp.int32) for p in parts])
        return jnp.pad(row, (0, self._row_width - row.shape[0]), constant_values=-1)

    def _line_cells(self, field, sep, value) -> list[jax.Array]:
        """Fragment ids of one file line (field, separator, value, newline); -1 if no line."""
        present = field >= 0
        return [
            jnp.where(present, self._field0 + field, -1),
            jnp.where(present, self._sep0 + sep, -1),
            jnp.where(present, self._value0 + value, -1),
            jnp.where(present, self._fid["newline"], -1),
        ]

    def _line_rows(self, state: TerminalState, file_slot: jax.Array) -> jax.Array:
        """int32[M, row_width] the file's lines (cat output)."""
        cells = self._line_cells(
            state.line_field[file_slot], state.line_sep[file_slot], state.line_value[file_slot]
        )
        rows = jnp.stack(cells, axis=1)  # [L, 4]
        rows = jnp.pad(rows, ((0, 0), (0, self._row_width - 4)), constant_values=-1)
        return self._clip(rows, state.line_field[file_slot] >= 0)

    def _ls_rows(self, child_names: jax.Array, file_names: jax.Array) -> jax.Array:
        """int32[M, row_width]: "name/" per subdirectory, then "name" per file."""
        f = self._fid
        dirs = jnp.stack(
            [
                self._dir0 + child_names,
                jnp.full_like(child_names, f["slash"]),
                jnp.full_like(child_names, f["newline"]),
            ],
            axis=1,
        )
        files = jnp.stack(
            [
                self._file0 + file_names,
                jnp.full_like(file_names, f["newline"]),
                jnp.full_like(file_names, -1),
            ],
            axis=1,
        )
        rows = jnp.concatenate([dirs, files])
        rows = jnp.pad(rows, ((0, 0), (0, self._row_width - 3)), constant_values=-1)
        return self._clip(rows, jnp.concatenate([child_names, file_names]) >= 0)

    def _pwd_row(self, state: TerminalState) -> jax.Array:
        """int32[row_width] "/a/b" + newline for the working directory."""
        tree, f = self._tree, self._fid
        depth = jnp.asarray(tree.dir_depth)[state.cwd]
        parts = [jnp.asarray(f["slash"])]
        for d in range(1, self.depth + 1):
            slot = jnp.maximum(jnp.asarray(tree.ancestor)[state.cwd, d], 0)
            name = jnp.where(d <= depth, self._dir0 + state.dir_name[slot], -1)
            parts += [name, jnp.where(d < depth, f["slash"], -1)]
        return self._pad_row(parts + [jnp.asarray(f["newline"])])

    def _message_row(self, command, arg, dir_hit, file_hit, correct) -> jax.Array:
        """int32[row_width] a one-line message: an error of cd or cat, or submit's verdict."""
        f = self._fid
        is_dir_name = arg < len(DIR_NAMES)
        name = jnp.where(is_dir_name, self._dir0 + arg, self._file0 + arg - len(DIR_NAMES))
        cd_error = jnp.where(file_hit, f["not_dir"], f["no_dir"])
        cat_error = jnp.where(dir_hit, f["is_dir"], f["no_file"])
        is_cd_error = (command == CD) & ~dir_hit
        is_cat_error = (command == CAT) & ~file_hit
        error = is_cd_error | is_cat_error
        head = jnp.where(is_cd_error, f["cd"], f["cat"])
        tail = jnp.where(is_cd_error, cd_error, cat_error)
        verdict = jnp.where(correct, f["correct"], f["wrong"])
        submit = command == SUBMIT
        return self._pad_row(
            [
                jnp.where(error, head, jnp.where(submit, verdict, -1)),
                jnp.where(error, name, -1),
                jnp.where(error, tail, -1),
            ]
        )

    def _grep(self, state: TerminalState, word: jax.Array):
        """Matching lines under the working directory, in output order.

        Returns:
          rows int32[F * L, row_width] "path: line" rows, shown bool[F * L] which match, and
          bool[] whether the key line is among the rows `_clip` keeps.
        """
        tree = self._tree
        num_lines = self.lines_per_file
        cwd_depth = jnp.asarray(tree.dir_depth)[state.cwd]
        file_dir = jnp.asarray(tree.file_dir)
        file_depth = jnp.asarray(tree.dir_depth)[file_dir]
        under = jnp.asarray(tree.ancestor)[file_dir, cwd_depth] == state.cwd  # [F]
        under = under & (file_depth >= cwd_depth) & state.file_present
        # Path cells per file: (name, "/") for each directory below the working directory.
        cells = []
        for d in range(1, self.depth + 1):
            slot = jnp.maximum(jnp.asarray(tree.ancestor)[file_dir, d], 0)
            keep = (d > cwd_depth) & (d <= file_depth)
            cells.append(jnp.where(keep, self._dir0 + state.dir_name[slot], -1))
            cells.append(jnp.where(keep, self._fid["slash"], -1))
        cells.append(self._file0 + state.file_name)
        cells.append(jnp.full_like(state.file_name, self._fid["colon"]))
        path = jnp.stack(cells, axis=1)  # [F, 2 * depth + 2]
        line = jnp.stack(
            self._line_cells(state.line_field, state.line_sep, state.line_value), axis=2
        )  # [F, L, 4]
        rows = jnp.concatenate(
            [jnp.broadcast_to(path[:, None], (path.shape[0], num_lines, path.shape[1])), line],
            axis=2,
        ).reshape(-1, self._row_width)
        is_field = (word < len(FIELDS)) & (state.line_field == word)
        is_value = (word >= len(FIELDS)) & (state.line_value == word - len(FIELDS))
        match = (is_field | is_value) & (state.line_field >= 0) & under[:, None]
        order = jnp.asarray(tree.line_order)
        rows, shown = rows[order], match.ravel()[order]
        key_flat = state.target_file * num_lines + state.target_line
        key_pos = jnp.argmax(order == key_flat)
        key_rank = jnp.cumsum(shown)[key_pos] - 1
        target_shown = shown[key_pos] & (key_rank < self.max_output_lines)
        return rows, shown, target_shown

    def _clip(self, rows: jax.Array, shown: jax.Array) -> jax.Array:
        """int32[M, row_width], M = max_output_lines + 1: the first max_output_lines shown rows
        in order, then a "..." row when more were shown (else -1 rows)."""
        m = self.max_output_lines
        rank = jnp.cumsum(shown) - 1
        slot = jnp.where(shown & (rank < m), rank, m + 1)
        out = jnp.full((m + 1, self._row_width), -1, jnp.int32)
        out = out.at[slot].set(rows.astype(jnp.int32), mode="drop")
        more = shown.sum() > m
        return out.at[m, 0].set(jnp.where(more, self._fid["more"], -1))

    # ----------------------------------------------------------------------------------------
    @property
    def _bits_per_candidate(self) -> int:
        t, nl = self._tree, self.lines_per_file
        per_dir = self.width + len(DIR_NAMES) + self.files_per_dir + len(FILE_NAMES)
        return t.num_dirs * per_dir + t.num_files * (2 + 3 * nl) + 2

    def _candidate(self, bits: jax.Array) -> tuple[TerminalState, jax.Array]:
        """One random tree (see the module docstring) and bool[] whether it is usable.

        Args:
          bits: uint32[_bits_per_candidate] random bits (one threefry call serves every
            candidate: each random sampler costs compilation time).
        """
        tree = self._tree
        nd, nf = tree.num_dirs, tree.num_files
        w, fpd, nl = self.width, self.files_per_dir, self.lines_per_file
        sizes = [
            (nd, w),
            (nd, len(DIR_NAMES)),
            (nd, fpd),
            (nd, len(FILE_NAMES)),
            (nf,),
            (nf,),
            (nf, nl),
            (nf, nl),
            (nf, nl),
            (),
            (),
        ]
        offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in sizes])
        parts = [bits[offsets[i] : offsets[i + 1]].reshape(shape) for i, shape in enumerate(sizes)]
        sub_coin, sub_score, file_coin, file_score, line_bits, key_score = parts[:6]
        field_bits, sep_bits, value_bits, field_bit, line_bit = parts[6:]

        def _sorted_names(coins, scores, prob):
            """int32[nd] counts and int32[nd, slots] distinct pool indices, ascending (-1 after).

            The chosen names are the `count` top-scoring pool entries; ranks by comparison and
            a scatter avoid sorts (cheaper to compile).
            """
            slots, pool = coins.shape[1], scores.shape[1]
            count = (coins < jnp.uint32(prob * 2**32)).sum(axis=1)
            above = (scores[:, None, :] > scores[:, :, None]).sum(axis=2)  # rank of each entry
            chosen = above < count[:, None]
            position = jnp.where(chosen, jnp.cumsum(chosen, axis=1) - 1, slots)
            names = jnp.full((nd, slots + 1), -1, jnp.int32)
            rows = jnp.broadcast_to(jnp.arange(nd)[:, None], position.shape)
            names = names.at[rows, position].set(jnp.broadcast_to(jnp.arange(pool), rows.shape))
            return count, names[:, :slots]

        num_sub, sub_names = _sorted_names(sub_coin, sub_score, self.dir_prob)
        parent, rank = jnp.asarray(tree.parent), jnp.asarray(tree.child_rank)
        present = jnp.zeros((nd,), bool).at[0].set(True)
        for d in range(1, self.depth + 1):  # static levels: a parent is decided first
            slots = np.flatnonzero(tree.dir_depth == d)
            ok = present[parent[slots]] & (rank[slots] < num_sub[parent[slots]])
            present = present.at[slots].set(ok)
        dir_name = jnp.where(present, sub_names[parent, rank], -1).at[0].set(-1)

        num_files, names = _sorted_names(file_coin, file_score, self.file_prob)
        file_present = ((jnp.arange(fpd) < num_files[:, None]) & present[:, None]).ravel()
        file_name = jnp.where(file_present, names.ravel(), -1)

        num_lines = 1 + (line_bits % nl).astype(jnp.int32)
        target_field = (field_bit % len(SECRET_FIELDS)).astype(jnp.int32)
        other = (field_bits % (len(FIELDS) - 1)).astype(jnp.int32)
        field = other + (other >= target_field)  # every line but the key line: another field
        sep = (sep_bits % len(SEPARATORS)).astype(jnp.int32)
        value = (value_bits % len(VALUES)).astype(jnp.int32)
        file_depth = jnp.asarray(tree.dir_depth[tree.file_dir])
        eligible = file_present & (file_depth >= self.min_key_depth)
        # Key file: the eligible file of highest score (>> 1 keeps ineligible ones below).
        target_file = jnp.argmax(jnp.where(eligible, key_score >> 1, 0) + eligible)
        target_file = target_file.astype(jnp.int32)
        target_line = (line_bit % num_lines[target_file]).astype(jnp.int32)
        field = field.at[target_file, target_line].set(target_field)
        has_line = (jnp.arange(nl) < num_lines[:, None]) & file_present[:, None]
        state = TerminalState(
            dir_present=present,
            dir_name=dir_name.astype(jnp.int32),
            file_present=file_present,
            file_name=file_name.astype(jnp.int32),
            line_field=jnp.where(has_line, field, -1).astype(jnp.int32),
            line_sep=jnp.where(has_line, sep, -1),
            line_value=jnp.where(has_line, value, -1),
            target_field=target_field,
            target_file=target_file,
            target_line=target_line,
            **self._start_progress(),
        )
        return state, eligible.any()

    def _start_progress(self) -> dict[str, jax.Array]:
        """The episode-start fields: in "/", nothing listed, printed or found."""
        nd, nf = self._tree.num_dirs, self._tree.num_files
        return dict(
            cwd=jnp.zeros((), jnp.int32),
            visited=jnp.zeros((nd,), bool).at[0].set(True),
            listed=jnp.zeros((nd,), bool),
            catted=jnp.zeros((nf,), bool),
            found=jnp.zeros((), bool),
            done=jnp.zeros((), bool),
        )

    def _generate(self, key: jax.Array, split: jax.Array) -> TerminalState:
        """First usable candidate of the split's class over while_loop rounds."""

        def _candidates(bits):
            states, usable = jax.vmap(self._candidate)(bits)
            in_class = jax.vmap(
                lambda s: base.in_split_class(task_hash(s), self.test_threshold, split)
            )(states)
            return states, usable & in_class

        return base.first_qualifying(
            key,
            _candidates,
            jax.tree.map(jnp.asarray, self._fallback_state()),
            num_candidates=self.num_candidates,
            bits_per_candidate=self._bits_per_candidate,
            max_rounds=_MAX_ROUNDS,
        )

    def _fallback_state(self) -> TerminalState:
        """A fixed tree for the (astronomically rare) case that no candidate qualified."""
        tree: dict = {"notes.md": ["key = 4817"]}
        for name in DIR_NAMES[: max(1, self.min_key_depth)]:
            tree = {name: tree}
        return self.state_from_tree(tree, "key")

    # ----------------------------------------------------------------------------------------
    def action_tokens(self, action: int) -> np.ndarray:
        """int32[len] tokens of action id `action` (the command string `commands[action]`)."""
        return self._actions.tokens[action, : self._actions.lengths[action]].copy()

    def action_id(self, command: str) -> int:
        """The action id of a command string such as "cd docs" (ValueError if not valid)."""
        try:
            return self.commands.index(command)
        except ValueError:
            raise ValueError(
                f"{command!r} is not a valid command; allowed: ls, pwd, cd .., cd/cat <name> "
                f"with a name from DIR_NAMES or FILE_NAMES, grep <field or value>, "
                f"submit <value>"
            ) from None

    def state_from_tree(self, tree: dict, field: str, cwd: str = "/") -> TerminalState:
        """Builds a state from a nested dict (host side), e.g. for tests.

        Args:
          tree: {directory name: dict, file name: [lines]}; lines "field = value" or
            "field: value" with names, fields and values from the pools.
          field: the task's field (in SECRET_FIELDS); exactly one line must have it.
          cwd: the working directory, an absolute path such as "/docs/logs".

        Returns:
          The state (nothing listed, printed or found; "/" and cwd's ancestors visited).
        """
        t = self._tree
        if field not in SECRET_FIELDS:
            raise ValueError(f"field {field!r} is not allowed; allowed: {list(SECRET_FIELDS)}")
        nl = self.lines_per_file
        dir_present = np.zeros(t.num_dirs, bool)
        dir_name = np.full(t.num_dirs, -1, np.int32)
        file_present = np.zeros(t.num_files, bool)
        file_name = np.full(t.num_files, -1, np.int32)
        lines = np.full((3, t.num_files, nl), -1, np.int32)
        key_lines, paths = [], {"/": 0}

        def _place(node: dict, slot: int, path: str):
            dir_present[slot] = True
            dirs = sorted(n for n, v in node.items() if isinstance(v, dict))
            files = sorted(n for n, v in node.items() if not isinstance(v, dict))
            if len(dirs) > self.width or len(files) > self.files_per_dir:
                raise ValueError(f"{path}: at most {self.width} dirs, {self.files_per_dir} files")
            for rank, name in enumerate(dirs):
                child = int(t.children[slot][rank])
                if child < 0 or name not in DIR_NAMES:
                    raise ValueError(f"{path}{name}: too deep or not in DIR_NAMES")
                dir_name[child] = DIR_NAMES.index(name)
                paths[path + name] = child
                _place(node[name], child, path + name + "/")
            for rank, name in enumerate(files):
                slot_f = slot * self.files_per_dir + rank
                if name not in FILE_NAMES or not 1 <= len(node[name]) <= nl:
                    raise ValueError(f"{path}{name}: not in FILE_NAMES or not 1..{nl} lines")
                file_present[slot_f], file_name[slot_f] = True, FILE_NAMES.index(name)
                for i, line in enumerate(node[name]):
                    sep = 0 if " = " in line else 1
                    key, value = line.split(SEPARATORS[sep])
                    lines[:, slot_f, i] = FIELDS.index(key), sep, VALUES.index(value)
                    if key == field:
                        key_lines.append((slot_f, i))

        _place(tree, 0, "/")
        if len(key_lines) != 1:
            raise ValueError(f"field {field!r} must appear in exactly one line, got {key_lines}")
        if cwd.rstrip("/") not in paths and cwd != "/":
            raise ValueError(f"cwd {cwd!r} is not a directory of the tree; allowed: {list(paths)}")
        cwd_slot = paths[cwd.rstrip("/") or "/"]
        visited = np.zeros(t.num_dirs, bool)
        visited[t.ancestor[cwd_slot][: t.dir_depth[cwd_slot] + 1]] = True
        return TerminalState(
            dir_present=dir_present,
            dir_name=dir_name,
            file_present=file_present,
            file_name=file_name,
            line_field=lines[0],
            line_sep=lines[1],
            line_value=lines[2],
            target_field=np.asarray(FIELDS.index(field), np.int32),
            target_file=np.asarray(key_lines[0][0], np.int32),
            target_line=np.asarray(key_lines[0][1], np.int32),
            cwd=np.asarray(cwd_slot, np.int32),
            visited=visited,
            listed=np.zeros(t.num_dirs, bool),
            catted=np.zeros(t.num_files, bool),
            found=np.asarray(False),
            done=np.asarray(False),
        )

    def _path(self, state, slot: int) -> str:
        """Absolute path of directory `slot` (host side)."""
        t = self._tree
        names = [
            DIR_NAMES[state.dir_name[t.ancestor[slot, d]]] for d in range(1, t.dir_depth[slot] + 1)
        ]
        return "/" + "/".join(names)

    def render(self, state: TerminalState) -> str:
        """The task, the working directory and the whole tree with its files' lines (host side)."""
        s = jax.tree.map(np.asarray, jax.device_get(state))
        t = self._tree
        key_dir = int(t.file_dir[s.target_file])
        key_path = self._path(s, key_dir).rstrip("/") + "/" + FILE_NAMES[s.file_name[s.target_file]]
        value = VALUES[s.line_value[s.target_file, s.target_line]]
        out = [
            f"task: find the value of {FIELDS[s.target_field]} ({value} in {key_path})",
            f"cwd: {self._path(s, int(s.cwd))}  found: {bool(s.found)}  done: {bool(s.done)}",
        ]

        def _walk(slot: int, indent: str):
            for f in range(slot * self.files_per_dir, (slot + 1) * self.files_per_dir):
                if s.file_present[f]:
                    out.append(indent + FILE_NAMES[s.file_name[f]])
                    for i in np.flatnonzero(s.line_field[f] >= 0):
                        field, sep = FIELDS[s.line_field[f, i]], SEPARATORS[s.line_sep[f, i]]
                        out.append(indent + "  | " + field + sep + VALUES[s.line_value[f, i]])
            for child in t.children[slot]:
                if child >= 0 and s.dir_present[child]:
                    out.append(indent + DIR_NAMES[s.dir_name[child]] + "/")
                    _walk(int(child), indent + "  ")

        out.append("/")
        _walk(0, "  ")
        return "\n".join(out) + "\n"

    def oracle_actions(self, state: TerminalState, strategy: str = "grep") -> list[int] | None:
        """A plan of action ids that submits the right value; its first action is the next one.

        Every strategy only uses what the agent has been shown (its own working directory, the
        state's record of what was listed, printed and found, and the key line's path and value
        once `found`), so closed-loop demonstrations are imitable:
          "grep": from "/" (cd .. until there) grep the task's field, cd along the printed
            path, cat the key file, submit the value;
          "grep_submit": grep the field from "/", submit the printed value (2 turns from "/");
          "dfs": depth-first ls / cat / cd without grep (files before subdirectories, in
            listing order), submit as soon as the key line was printed.

        Args:
          state: a single (unbatched) state; host or device arrays.
          strategy: one of ORACLE_STRATEGIES.

        Returns:
          Action ids; [] once done; None if the plan cannot be made (never for generated
          trees).
        """
        if strategy not in ORACLE_STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; allowed: {list(ORACLE_STRATEGIES)}")
        s = jax.tree.map(np.asarray, jax.device_get(state))
        if s.done:
            return []
        t = self._tree
        value = VALUES[s.line_value[s.target_file, s.target_line]]
        submit = self.action_id(f"submit {value}")
        cwd = int(s.cwd)
        if strategy == "dfs":
            return self._dfs_plan(s, submit)
        key_dir = int(t.file_dir[s.target_file])
        up = [self.action_id("cd ..")]
        if not s.found:
            grep = [self.action_id(f"grep {FIELDS[s.target_field]}")]
            head = up * int(t.dir_depth[cwd]) + grep
            if strategy == "grep_submit":
                return head + [submit]
            # After the grep at "/", the walk below starts from "/".
            return head + self._walk_to_key(s, 0, key_dir) + [submit]
        if strategy == "grep_submit" or s.catted[s.target_file]:
            return [submit]
        return self._walk_to_key(s, cwd, key_dir) + [submit]

    def _walk_to_key(self, s, cwd: int, key_dir: int) -> list[int]:
        """cd .. until an ancestor of the key's directory, cd down to it, cat the key file."""
        t = self._tree
        plan = []
        while t.ancestor[key_dir, t.dir_depth[cwd]] != cwd:
            plan.append(self.action_id("cd .."))
            cwd = int(t.parent[cwd])
        for d in range(t.dir_depth[cwd] + 1, t.dir_depth[key_dir] + 1):
            plan.append(self.action_id(f"cd {DIR_NAMES[s.dir_name[t.ancestor[key_dir, d]]]}"))
        return plan + [self.action_id(f"cat {FILE_NAMES[s.file_name[s.target_file]]}")]

    def _dfs_plan(self, s, submit: int) -> list[int] | None:
        """Depth-first exploration from the state's knowledge, simulated until the key is seen."""
        t, fpd = self._tree, self.files_per_dir
        cwd, listed, catted = int(s.cwd), s.listed.copy(), s.catted.copy()
        found, plan = bool(s.found), []

        def _files(slot):
            return [f for f in range(slot * fpd, (slot + 1) * fpd) if s.file_present[f]]

        def _children(slot):
            return [int(c) for c in t.children[slot] if c >= 0 and s.dir_present[c]]

        def _explored(slot):
            return (
                listed[slot]
                and all(catted[f] for f in _files(slot))
                and all(_explored(c) for c in _children(slot))
            )

        while not found:
            if len(plan) > 4 * (t.num_dirs + t.num_files) + 8:
                return None
            todo_files = [f for f in _files(cwd) if not catted[f]]
            todo_dirs = [c for c in _children(cwd) if not _explored(c)]
            if not listed[cwd]:
                plan.append(self.action_id("ls"))
                listed[cwd] = True
            elif todo_files:
                plan.append(self.action_id(f"cat {FILE_NAMES[s.file_name[todo_files[0]]]}"))
                catted[todo_files[0]] = True
                found = todo_files[0] == s.target_file
            elif todo_dirs:
                plan.append(self.action_id(f"cd {DIR_NAMES[s.dir_name[todo_dirs[0]]]}"))
                cwd = todo_dirs[0]
            elif cwd != 0:
                plan.append(self.action_id("cd .."))
                cwd = int(t.parent[cwd])
            else:
                return None
        return plan + [submit]
