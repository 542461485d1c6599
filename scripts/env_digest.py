"""Digest of every registered environment's generated tasks, to compare code versions.

  python scripts/env_digest.py > digests.txt     # at two commits, then diff the files

For each environment and split, resets `--tasks` fixed keys (jitted and vmapped) and prints a
SHA-256 of every leaf of the states and timesteps: equal digests mean the task generators
produce bit-identical tasks (used to check refactors of the generators).
"""

from __future__ import annotations

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from rl4agents import config_utils  # noqa: E402
from rl4agents.envs import registry  # noqa: E402

_TASKS = flags.DEFINE_integer("tasks", 64, "Reset keys per environment and split.")
_SEED = flags.DEFINE_integer("seed", 123, "Seed of the reset keys.")


def main(argv):
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    if _TASKS.value < 1:
        config_utils.fail(f"--tasks={_TASKS.value}; allowed: >= 1")
    for name in registry.names():
        for split in ("train", "test", "ood"):
            env, params = registry.make(name).make_split(split)
            keys = jax.random.split(jax.random.key(_SEED.value), _TASKS.value)
            out = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, params)
            h = hashlib.sha256()
            for leaf in jax.tree.leaves(out):
                h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
            print(f"{name:12s} {split:5s} {h.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_plain_flags)
