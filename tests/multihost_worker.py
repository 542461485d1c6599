"""One process of the 2-process CPU run of tests/test_multihost.py.

  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 \
      python -m tests.multihost_worker --coordinator=localhost:PORT --num_processes=2 \
      --process_id=I --workdir=DIR

Every process joins `jax.distributed`, then runs `loop.run` on `CONFIG` over the global mesh
of all processes' devices for two steps (stop_after=2): a checkpoint at step 2 and one
evaluation, written once, by process 0.
"""

from __future__ import annotations

import argparse

from tests.train.test_train import tiny_config

# 4 scheduled steps, stopped after 2: evaluation and a checkpoint at step 2, no final one.
OVERRIDES = {
    "train.minibatches": 2,
    "train.num_steps": 4,
    "train.eval_every": 2,
    "checkpoint.every": 2,
}
STOP_AFTER = 2


def config():
    """The run's config (tests/train/test_train.py's tiny config, two minibatches)."""
    return tiny_config(**OVERRIDES)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--process_id", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    from rl4agents import distributed

    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    import jax

    from rl4agents.train import loop

    print(
        f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} local devices, {jax.device_count()} in all",
        flush=True,
    )
    summary = loop.run(config(), args.workdir, stop_after=STOP_AFTER)
    print(f"process {jax.process_index()} done at step {summary['steps']}", flush=True)


if __name__ == "__main__":
    main()
