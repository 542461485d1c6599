"""Host-side (NumPy) views of a terminal: a state from a nested dict, a readable rendering,
and the oracle's plans (grep, grep_submit, dfs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import numpy as np

from rl4agents.envs.terminal.world import (
    DIR_NAMES,
    FIELDS,
    FILE_NAMES,
    ORACLE_STRATEGIES,
    SECRET_FIELDS,
    SEPARATORS,
    VALUES,
    TerminalState,
)

if TYPE_CHECKING:
    from rl4agents.envs.terminal.env import Terminal


def state_from_tree(env: Terminal, tree: dict, field: str, cwd: str = "/") -> TerminalState:
    """Builds a state from a nested dict (host side), e.g. for tests.

    Args:
      tree: {directory name: dict, file name: [lines]}; lines "field = value" or
        "field: value" with names, fields and values from the pools.
      field: the task's field (in SECRET_FIELDS); exactly one line must have it.
      cwd: the working directory, an absolute path such as "/docs/logs".

    Returns:
      The state (nothing listed, printed or found; "/" and cwd's ancestors visited).
    """
    t = env._tree
    if field not in SECRET_FIELDS:
        raise ValueError(f"field {field!r} is not allowed; allowed: {list(SECRET_FIELDS)}")
    nl = env.config.lines_per_file
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
        if len(dirs) > env.config.width or len(files) > env.config.files_per_dir:
            raise ValueError(
                f"{path}: at most {env.config.width} dirs, {env.config.files_per_dir} files"
            )
        for rank, name in enumerate(dirs):
            child = int(t.children[slot][rank])
            if child < 0 or name not in DIR_NAMES:
                raise ValueError(f"{path}{name}: too deep or not in DIR_NAMES")
            dir_name[child] = DIR_NAMES.index(name)
            paths[path + name] = child
            _place(node[name], child, path + name + "/")
        for rank, name in enumerate(files):
            slot_f = slot * env.config.files_per_dir + rank
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


def dir_path(env: Terminal, state, slot: int) -> str:
    """Absolute path of directory `slot` (host side)."""
    t = env._tree
    names = [
        DIR_NAMES[state.dir_name[t.ancestor[slot, d]]] for d in range(1, t.dir_depth[slot] + 1)
    ]
    return "/" + "/".join(names)


def render(env: Terminal, state: TerminalState) -> str:
    """The task, the working directory and the whole tree with its files' lines (host side)."""
    s = jax.tree.map(np.asarray, jax.device_get(state))
    t = env._tree
    key_dir = int(t.file_dir[s.target_file])
    key_path = dir_path(env, s, key_dir).rstrip("/") + "/" + FILE_NAMES[s.file_name[s.target_file]]
    value = VALUES[s.line_value[s.target_file, s.target_line]]
    out = [
        f"task: find the value of {FIELDS[s.target_field]} ({value} in {key_path})",
        f"cwd: {dir_path(env, s, int(s.cwd))}  found: {bool(s.found)}  done: {bool(s.done)}",
    ]

    def _walk(slot: int, indent: str):
        for f in range(slot * env.config.files_per_dir, (slot + 1) * env.config.files_per_dir):
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


def oracle_actions(env: Terminal, state: TerminalState, strategy: str = "grep") -> list[int] | None:
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
    t = env._tree
    value = VALUES[s.line_value[s.target_file, s.target_line]]
    submit = env.action_id(f"submit {value}")
    cwd = int(s.cwd)
    if strategy == "dfs":
        return dfs_plan(env, s, submit)
    key_dir = int(t.file_dir[s.target_file])
    up = [env.action_id("cd ..")]
    if not s.found:
        grep = [env.action_id(f"grep {FIELDS[s.target_field]}")]
        head = up * int(t.dir_depth[cwd]) + grep
        if strategy == "grep_submit":
            return head + [submit]
        # After the grep at "/", the walk below starts from "/".
        return head + walk_to_key(env, s, 0, key_dir) + [submit]
    if strategy == "grep_submit" or s.catted[s.target_file]:
        return [submit]
    return walk_to_key(env, s, cwd, key_dir) + [submit]


def walk_to_key(env: Terminal, s, cwd: int, key_dir: int) -> list[int]:
    """cd .. until an ancestor of the key's directory, cd down to it, cat the key file."""
    t = env._tree
    plan = []
    while t.ancestor[key_dir, t.dir_depth[cwd]] != cwd:
        plan.append(env.action_id("cd .."))
        cwd = int(t.parent[cwd])
    for d in range(t.dir_depth[cwd] + 1, t.dir_depth[key_dir] + 1):
        plan.append(env.action_id(f"cd {DIR_NAMES[s.dir_name[t.ancestor[key_dir, d]]]}"))
    return plan + [env.action_id(f"cat {FILE_NAMES[s.file_name[s.target_file]]}")]


def dfs_plan(env: Terminal, s, submit: int) -> list[int] | None:
    """Depth-first exploration from the state's knowledge, simulated until the key is seen."""
    t, fpd = env._tree, env.config.files_per_dir
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
            plan.append(env.action_id("ls"))
            listed[cwd] = True
        elif todo_files:
            plan.append(env.action_id(f"cat {FILE_NAMES[s.file_name[todo_files[0]]]}"))
            catted[todo_files[0]] = True
            found = todo_files[0] == s.target_file
        elif todo_dirs:
            plan.append(env.action_id(f"cd {DIR_NAMES[s.dir_name[todo_dirs[0]]]}"))
            cwd = todo_dirs[0]
        elif cwd != 0:
            plan.append(env.action_id("cd .."))
            cwd = int(t.parent[cwd])
        else:
            return None
    return plan + [submit]
