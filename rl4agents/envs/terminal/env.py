"""The registered `Terminal` environment: its static tables, `reset` and `step`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base, registry
from rl4agents.envs.terminal import generator, host, shell
from rl4agents.envs.terminal.world import (
    CAT,
    CD,
    CD_UP,
    DIR_NAMES,
    FIELDS,
    FILE_NAMES,
    GREP,
    LS,
    MESSAGES,
    PWD,
    SEPARATORS,
    SUBMIT,
    VALUES,
    TerminalParams,
    TerminalState,
    Tree,
    task_words,
)
from rl4agents.types import TimeStep


@dataclasses.dataclass(frozen=True)
class TerminalConfig:
    """Static settings (the constructor's arguments; see `Terminal`), checked when built."""

    depth: int = 2
    width: int = 2
    files_per_dir: int = 2
    lines_per_file: int = 2
    dir_prob: float = 0.75
    file_prob: float = 0.6
    min_key_depth: int = 1
    max_output_lines: int = 5
    progress_reward: float = 0.0
    invalid_penalty: float = 0.05
    goal_reward: float = 1.0
    test_fraction: float = 0.2
    ood_depth: int = 3
    ood_width: int = 3
    num_candidates: int = 16

    def __post_init__(self):
        c = self
        for name, value, low, high in (
            ("depth", c.depth, 1, 5),
            ("ood_depth", c.ood_depth, 1, 5),
            ("width", c.width, 1, len(DIR_NAMES)),
            ("ood_width", c.ood_width, 1, len(DIR_NAMES)),
            ("files_per_dir", c.files_per_dir, 1, len(FILE_NAMES)),
            ("lines_per_file", c.lines_per_file, 1, 8),
            ("min_key_depth", c.min_key_depth, 0, c.depth),
            ("num_candidates", c.num_candidates, 1, 4096),
        ):
            base.check_range(name, value, low, high)
        for name, value in (("dir_prob", c.dir_prob), ("file_prob", c.file_prob)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if c.min_key_depth > c.ood_depth:
            raise ValueError(
                f"min_key_depth must be <= ood_depth={c.ood_depth} (the ood trees), "
                f"got {c.min_key_depth}"
            )
        base.check_shared_settings(c)
        need = max(c.width + c.files_per_dir, c.ood_width + c.files_per_dir, c.lines_per_file)
        if c.max_output_lines < need:
            raise ValueError(
                f"max_output_lines must be >= {need} (so ls and cat are never clipped: "
                f"max(width, ood_width) + files_per_dir and lines_per_file), "
                f"got {c.max_output_lines}"
            )


@registry.register("terminal")
class Terminal(base.TextEnv):
    """Terminal text environment (see the `terminal` package docstring).

    Attributes:
      config: `TerminalConfig`, the settings below.
      tokenizer: tokenizer the fragments were encoded with.
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
        super().__init__(base.settings(TerminalConfig, locals()), tokenizer)
        self._tree = Tree(depth, width, files_per_dir, lines_per_file)

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
        frags.update(MESSAGES)
        self._frags = text.FragmentTable.build(self.tokenizer, frags)
        self._fid = {name: self._frags.id(name) for name in MESSAGES}

        # Every valid command string: (command id, argument). Name arguments index DIR_NAMES
        # then FILE_NAMES; grep words index FIELDS then VALUES; submit indexes VALUES.
        names = DIR_NAMES + FILE_NAMES
        commands = [("ls", LS, 0), ("pwd", PWD, 0), ("cd ..", CD_UP, 0)]
        commands += [(f"cd {n}", CD, i) for i, n in enumerate(names)]
        commands += [(f"cat {n}", CAT, i) for i, n in enumerate(names)]
        commands += [(f"grep {w}", GREP, i) for i, w in enumerate(FIELDS + VALUES)]
        commands += [(f"submit {v}", SUBMIT, i) for i, v in enumerate(VALUES)]
        self.commands = tuple(c[0] for c in commands)
        self.action_table = text.FragmentTable.build(self.tokenizer, {c: c for c in self.commands})
        self._command = np.array([c[1] for c in commands], np.int32)
        self._argument = np.array([c[2] for c in commands], np.int32)
        self.num_actions = len(commands)
        self.max_action_len = int(self.action_table.lengths.max())

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
            max_output_lines * grep_row + length("more"),
            ls_out,
            lines_per_file * line_len,
            single,
        )
        self.max_obs_len = output + length("end")
        self.max_prompt_len = (
            length("task") + field_len + length("task_end") + length("help") + length("end")
        )
        self._row_width = 2 * depth + 6  # grep rows are the widest

    def ood_config(self) -> TerminalConfig:
        """The "ood" trees: `ood_depth` levels of at most `ood_width` subdirectories."""
        c = self.config
        return dataclasses.replace(c, depth=c.ood_depth, width=c.ood_width)

    def fragment_tables(self) -> tuple[text.FragmentTable, ...]:
        return (self._frags, self.action_table)

    def reset_env(
        self, key: jax.Array, params: TerminalParams
    ) -> tuple[TerminalState, jax.Array, jax.Array]:
        """Generates a tree of the params' class; the agent starts in "/".

        Returns:
          The state, the task prompt obs_tokens int32[P] and obs_len int32[].
        """
        state = generator.generate(self, key, params.split)
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
        return state, obs, obs_len

    def step_env(
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
          state: current `TerminalState`, not done.
          action_tokens: int32[A] action tokens, end-of-action excluded.
          action_len: int32[] number of valid action tokens.
          params: `TerminalParams` (unused by the dynamics).

        Returns:
          The next state and a TimeStep with obs_tokens int32[O].
        """
        del key, params
        c, tree, f = self.config, self._tree, self._fid
        action = text.match_action(self.action_table, action_tokens, action_len)
        valid = action >= 0
        command = jnp.where(valid, jnp.asarray(self._command)[jnp.maximum(action, 0)], -1)
        arg = jnp.asarray(self._argument)[jnp.maximum(action, 0)]
        num_dir_names = len(DIR_NAMES)

        # The working directory's entries.
        children = jnp.asarray(tree.children)[state.cwd]  # [W] slots, -1 beyond the leaves
        child_ok = (children >= 0) & state.dir_present[jnp.maximum(children, 0)]
        child_names = jnp.where(child_ok, state.dir_name[jnp.maximum(children, 0)], -1)
        files = state.cwd * c.files_per_dir + jnp.arange(c.files_per_dir)
        file_names = jnp.where(state.file_present[files], state.file_name[files], -1)
        dir_hit = child_names == arg  # arg < num_dir_names for directory names
        file_hit = (file_names >= 0) & (file_names + num_dir_names == arg)
        is_cd, is_cat = command == CD, command == CAT
        cd_ok = is_cd & dir_hit.any()
        cat_ok = is_cat & file_hit.any()
        cat_file = files[jnp.argmax(file_hit)]

        cwd = jnp.where(cd_ok, children[jnp.argmax(dir_hit)], state.cwd)
        cwd = jnp.where(command == CD_UP, jnp.asarray(tree.parent)[state.cwd], cwd)
        grep_rows, grep_shown, target_shown = shell.grep(self, state, arg)
        submitted = command == SUBMIT
        correct = submitted & (arg == shell.target_value(state))
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
        ls_rows = shell.ls_rows(self, child_names, file_names)
        cat_rows = shell.line_rows(self, state, cat_file)
        message = shell.message_row(self, command, arg, dir_hit.any(), file_hit.any(), correct)
        pwd = shell.pwd_row(self, state)
        single = jnp.where(command == PWD, pwd, message)
        single = jnp.full_like(ls_rows, -1).at[0].set(single)
        rows = jnp.where(command == LS, ls_rows, single)
        rows = jnp.where(cat_ok, cat_rows, rows)
        rows = jnp.where(command == GREP, shell.clip(self, grep_rows, grep_shown), rows)
        rows = jnp.where(valid, rows, -1)
        prefix = jnp.where(valid, -1, f["invalid"])
        end = jnp.where(submitted, -1, f["end"])
        ids = jnp.concatenate([prefix[None], rows.ravel(), end[None]]).astype(jnp.int32)
        obs, obs_len = text.concat_fragments(
            self._frags, ids, self.tokenizer.pad_id, self.max_obs_len
        )

        reward = jnp.where(correct, c.goal_reward, 0.0)
        if c.progress_reward:
            entered = on_key_path & ~state.visited[cwd]
            first_cat = cat_ok & (cat_file == state.target_file) & ~state.catted[cat_file]
            reward = reward + c.progress_reward * (entered.astype(jnp.float32) + first_cat)
        reward = jnp.where(valid, reward, -c.invalid_penalty)
        return self.end_turn(
            new_state, obs, obs_len, reward, done=submitted, valid=valid, success=correct
        )

    def anchor(self, state: TerminalState) -> jax.Array:
        """uint32[] hash of the whole state (task, working directory, what was shown, done)."""
        progress = [
            jnp.ravel(x).astype(jnp.int32)
            for x in (state.cwd, state.visited, state.listed, state.catted, state.found, state.done)
        ]
        return text.hash_u32(jnp.concatenate(task_words(state) + progress))

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
        """A state from a nested dict (host side; see `host.state_from_tree`)."""
        return host.state_from_tree(self, tree, field, cwd)

    def render(self, state: TerminalState) -> str:
        """The task, the working directory and the whole tree with its files' lines (host side)."""
        return host.render(self, state)

    def oracle_actions(self, state: TerminalState, strategy: str = "grep") -> list[int] | None:
        """A plan of action ids that submits the right value (see `host.oracle_actions`)."""
        return host.oracle_actions(self, state, strategy)
