"""Shell output as rows of fragment ids: ls, cat, pwd, grep, error messages and the clipping of
long outputs. Pure functions of one episode; `env` supplies the tree geometry and fragment
ids."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rl4agents.envs.terminal.world import (
    CAT,
    CD,
    DIR_NAMES,
    FIELDS,
    SUBMIT,
    TerminalState,
)

if TYPE_CHECKING:
    from rl4agents.envs.terminal.env import Terminal


def target_value(state: TerminalState) -> jax.Array:
    """int32[] index into VALUES of the key line's value."""
    return state.line_value[state.target_file, state.target_line]


def pad_row(env: Terminal, parts: list[jax.Array]) -> jax.Array:
    """int32[row_width] fragment ids `parts` followed by -1."""
    row = jnp.stack([jnp.asarray(p, jnp.int32) for p in parts])
    return jnp.pad(row, (0, env._row_width - row.shape[0]), constant_values=-1)


def line_cells(env: Terminal, field, sep, value) -> list[jax.Array]:
    """Fragment ids of one file line (field, separator, value, newline); -1 if no line."""
    present = field >= 0
    return [
        jnp.where(present, env._field0 + field, -1),
        jnp.where(present, env._sep0 + sep, -1),
        jnp.where(present, env._value0 + value, -1),
        jnp.where(present, env._fid["newline"], -1),
    ]


def line_rows(env: Terminal, state: TerminalState, file_slot: jax.Array) -> jax.Array:
    """int32[M, row_width] the file's lines (cat output)."""
    cells = line_cells(
        env, state.line_field[file_slot], state.line_sep[file_slot], state.line_value[file_slot]
    )
    rows = jnp.stack(cells, axis=1)  # [L, 4]
    rows = jnp.pad(rows, ((0, 0), (0, env._row_width - 4)), constant_values=-1)
    return clip(env, rows, state.line_field[file_slot] >= 0)


def ls_rows(env: Terminal, child_names: jax.Array, file_names: jax.Array) -> jax.Array:
    """int32[M, row_width]: "name/" per subdirectory, then "name" per file."""
    f = env._fid
    dirs = jnp.stack(
        [
            env._dir0 + child_names,
            jnp.full_like(child_names, f["slash"]),
            jnp.full_like(child_names, f["newline"]),
        ],
        axis=1,
    )
    files = jnp.stack(
        [
            env._file0 + file_names,
            jnp.full_like(file_names, f["newline"]),
            jnp.full_like(file_names, -1),
        ],
        axis=1,
    )
    rows = jnp.concatenate([dirs, files])
    rows = jnp.pad(rows, ((0, 0), (0, env._row_width - 3)), constant_values=-1)
    return clip(env, rows, jnp.concatenate([child_names, file_names]) >= 0)


def pwd_row(env: Terminal, state: TerminalState) -> jax.Array:
    """int32[row_width] "/a/b" + newline for the working directory."""
    tree, f = env._tree, env._fid
    depth = jnp.asarray(tree.dir_depth)[state.cwd]
    parts = [jnp.asarray(f["slash"])]
    for d in range(1, env.config.depth + 1):
        slot = jnp.maximum(jnp.asarray(tree.ancestor)[state.cwd, d], 0)
        name = jnp.where(d <= depth, env._dir0 + state.dir_name[slot], -1)
        parts += [name, jnp.where(d < depth, f["slash"], -1)]
    return pad_row(env, parts + [jnp.asarray(f["newline"])])


def message_row(env: Terminal, command, arg, dir_hit, file_hit, correct) -> jax.Array:
    """int32[row_width] a one-line message: an error of cd or cat, or submit's verdict."""
    f = env._fid
    is_dir_name = arg < len(DIR_NAMES)
    name = jnp.where(is_dir_name, env._dir0 + arg, env._file0 + arg - len(DIR_NAMES))
    cd_error = jnp.where(file_hit, f["not_dir"], f["no_dir"])
    cat_error = jnp.where(dir_hit, f["is_dir"], f["no_file"])
    is_cd_error = (command == CD) & ~dir_hit
    is_cat_error = (command == CAT) & ~file_hit
    error = is_cd_error | is_cat_error
    head = jnp.where(is_cd_error, f["cd"], f["cat"])
    tail = jnp.where(is_cd_error, cd_error, cat_error)
    verdict = jnp.where(correct, f["correct"], f["wrong"])
    submit = command == SUBMIT
    return pad_row(
        env,
        [
            jnp.where(error, head, jnp.where(submit, verdict, -1)),
            jnp.where(error, name, -1),
            jnp.where(error, tail, -1),
        ],
    )


def grep(env: Terminal, state: TerminalState, word: jax.Array):
    """Matching lines under the working directory, in output order.

    Returns:
      rows int32[F * L, row_width] "path: line" rows, shown bool[F * L] which match, and
      bool[] whether the key line is among the rows `clip` keeps.
    """
    tree = env._tree
    num_lines = env.config.lines_per_file
    cwd_depth = jnp.asarray(tree.dir_depth)[state.cwd]
    file_dir = jnp.asarray(tree.file_dir)
    file_depth = jnp.asarray(tree.dir_depth)[file_dir]
    under = jnp.asarray(tree.ancestor)[file_dir, cwd_depth] == state.cwd  # [F]
    under = under & (file_depth >= cwd_depth) & state.file_present
    # Path cells per file: (name, "/") for each directory below the working directory.
    cells = []
    for d in range(1, env.config.depth + 1):
        slot = jnp.maximum(jnp.asarray(tree.ancestor)[file_dir, d], 0)
        keep = (d > cwd_depth) & (d <= file_depth)
        cells.append(jnp.where(keep, env._dir0 + state.dir_name[slot], -1))
        cells.append(jnp.where(keep, env._fid["slash"], -1))
    cells.append(env._file0 + state.file_name)
    cells.append(jnp.full_like(state.file_name, env._fid["colon"]))
    path = jnp.stack(cells, axis=1)  # [F, 2 * depth + 2]
    line = jnp.stack(
        line_cells(env, state.line_field, state.line_sep, state.line_value), axis=2
    )  # [F, L, 4]
    rows = jnp.concatenate(
        [jnp.broadcast_to(path[:, None], (path.shape[0], num_lines, path.shape[1])), line],
        axis=2,
    ).reshape(-1, env._row_width)
    is_field = (word < len(FIELDS)) & (state.line_field == word)
    is_value = (word >= len(FIELDS)) & (state.line_value == word - len(FIELDS))
    match = (is_field | is_value) & (state.line_field >= 0) & under[:, None]
    order = jnp.asarray(tree.line_order)
    rows, shown = rows[order], match.ravel()[order]
    key_flat = state.target_file * num_lines + state.target_line
    key_pos = jnp.argmax(order == key_flat)
    key_rank = jnp.cumsum(shown)[key_pos] - 1
    target_shown = shown[key_pos] & (key_rank < env.config.max_output_lines)
    return rows, shown, target_shown


def clip(env: Terminal, rows: jax.Array, shown: jax.Array) -> jax.Array:
    """int32[M, row_width], M = max_output_lines + 1: the first max_output_lines shown rows
    in order, then a "..." row when more were shown (else -1 rows)."""
    m = env.config.max_output_lines
    rank = jnp.cumsum(shown) - 1
    slot = jnp.where(shown & (rank < m), rank, m + 1)
    out = jnp.full((m + 1, env._row_width), -1, jnp.int32)
    out = out.at[slot].set(rows.astype(jnp.int32), mode="drop")
    more = shown.sum() > m
    return out.at[m, 0].set(jnp.where(more, env._fid["more"], -1))
