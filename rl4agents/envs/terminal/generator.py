"""Terminal task generation in JAX: random trees from random bits, the first usable one of the
split's class (`base.first_qualifying`), and a fixed fallback tree."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.terminal.world import (
    DIR_NAMES,
    FIELDS,
    FILE_NAMES,
    SECRET_FIELDS,
    SEPARATORS,
    VALUES,
    TerminalState,
    task_hash,
)

if TYPE_CHECKING:
    from rl4agents.envs.terminal.env import Terminal

_MAX_ROUNDS = 16


def bits_per_candidate(env: Terminal) -> int:
    t, nl = env._tree, env.config.lines_per_file
    per_dir = env.config.width + len(DIR_NAMES) + env.config.files_per_dir + len(FILE_NAMES)
    return t.num_dirs * per_dir + t.num_files * (2 + 3 * nl) + 2


def candidate(env: Terminal, bits: jax.Array) -> tuple[TerminalState, jax.Array]:
    """One random tree (see the `terminal` package docstring) and bool[] whether it is usable.

    Args:
      bits: uint32[bits_per_candidate(env)] random bits (one threefry call serves every
        candidate: each random sampler costs compilation time).
    """
    tree = env._tree
    nd, nf = tree.num_dirs, tree.num_files
    w, fpd, nl = env.config.width, env.config.files_per_dir, env.config.lines_per_file
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

    num_sub, sub_names = _sorted_names(sub_coin, sub_score, env.config.dir_prob)
    parent, rank = jnp.asarray(tree.parent), jnp.asarray(tree.child_rank)
    present = jnp.zeros((nd,), bool).at[0].set(True)
    for d in range(1, env.config.depth + 1):  # static levels: a parent is decided first
        slots = np.flatnonzero(tree.dir_depth == d)
        ok = present[parent[slots]] & (rank[slots] < num_sub[parent[slots]])
        present = present.at[slots].set(ok)
    dir_name = jnp.where(present, sub_names[parent, rank], -1).at[0].set(-1)

    num_files, names = _sorted_names(file_coin, file_score, env.config.file_prob)
    file_present = ((jnp.arange(fpd) < num_files[:, None]) & present[:, None]).ravel()
    file_name = jnp.where(file_present, names.ravel(), -1)

    num_lines = 1 + (line_bits % nl).astype(jnp.int32)
    target_field = (field_bit % len(SECRET_FIELDS)).astype(jnp.int32)
    other = (field_bits % (len(FIELDS) - 1)).astype(jnp.int32)
    field = other + (other >= target_field)  # every line but the key line: another field
    sep = (sep_bits % len(SEPARATORS)).astype(jnp.int32)
    value = (value_bits % len(VALUES)).astype(jnp.int32)
    file_depth = jnp.asarray(tree.dir_depth[tree.file_dir])
    eligible = file_present & (file_depth >= env.config.min_key_depth)
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
        **start_progress(env),
    )
    return state, eligible.any()


def start_progress(env: Terminal) -> dict[str, jax.Array]:
    """The episode-start fields: in "/", nothing listed, printed or found."""
    nd, nf = env._tree.num_dirs, env._tree.num_files
    return dict(
        cwd=jnp.zeros((), jnp.int32),
        visited=jnp.zeros((nd,), bool).at[0].set(True),
        listed=jnp.zeros((nd,), bool),
        catted=jnp.zeros((nf,), bool),
        found=jnp.zeros((), bool),
        done=jnp.zeros((), bool),
    )


def generate(env: Terminal, key: jax.Array, split: jax.Array) -> TerminalState:
    """First usable candidate of the split's class over while_loop rounds."""

    def _candidates(bits):
        states, usable = jax.vmap(functools.partial(candidate, env))(bits)
        in_class = jax.vmap(lambda s: env.in_split(task_hash(s), split))(states)
        return states, usable & in_class

    return base.first_qualifying(
        key,
        _candidates,
        jax.tree.map(jnp.asarray, fallback_state(env)),
        num_candidates=env.config.num_candidates,
        bits_per_candidate=bits_per_candidate(env),
        max_rounds=_MAX_ROUNDS,
    )


def fallback_state(env: Terminal) -> TerminalState:
    """A fixed tree for the (astronomically rare) case that no candidate qualified."""
    tree: dict = {"notes.md": ["key = 4817"]}
    for name in DIR_NAMES[: max(1, env.config.min_key_depth)]:
        tree = {name: tree}
    return env.state_from_tree(tree, "key")
