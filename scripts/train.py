"""Train an agent from a config file.

  python scripts/train.py --config=configs/frozen_lake.py --workdir=runs/fl
  python scripts/train.py --config=configs/sokoban.py:ppo_gae --workdir=runs/sok \
      --config.optim.lr=3e-4

Resumes automatically from the workdir's latest checkpoint.

Exit status: 0 finished (or stopped by --config.train.max_minutes's budget: also finished);
1 stopped by a non-finite reward, loss, gradient or parameter (its step rejected, the earlier
checkpoints kept) or by a checkpoint that could not be saved; 2 a bad command line or config;
130 Ctrl-C and 143 SIGTERM (a checkpoint saved: rerun the command to resume).

Multi-process (multi-host) runs start one copy per process; `jax.distributed` starts from the
cluster environment (SLURM, Open MPI, Cloud TPU) or from --config.distributed.* (docs/multihost.md):

  python scripts/train.py --config=configs/frozen_lake.py --workdir=runs/fl \
      --config.distributed.coordinator=host0:12345 --config.distributed.num_processes=2 \
      --config.distributed.process_id=0    # and process_id=1 on the second host
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
from absl import app, flags, logging  # noqa: E402

from rl4agents import checkpoint, config_utils, distributed  # noqa: E402
from rl4agents.train import loop  # noqa: E402

_CONFIG = config_utils.define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, curves).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    logging.set_verbosity(logging.ERROR)  # Orbax logs every save at INFO, damage at WARNING
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments {argv[1:]}; allowed: flags only")
    config_utils.check_workdir("--workdir", _WORKDIR.value)
    config = _CONFIG.value
    try:
        # Before any JAX backend use: the processes must meet before devices are listed.
        distributed.initialize(
            config.distributed.coordinator,
            config.distributed.num_processes,
            config.distributed.process_id,
        )
        summary = loop.run(config, _WORKDIR.value)
    except checkpoint.CheckpointError as e:  # mid-run; the earlier checkpoints stay
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if summary.get("stopped"):  # a non-finite step: the run cannot go on as configured
        print(f"error: {summary['stopped']}", file=sys.stderr)
    sys.exit(exit_code(summary))


def exit_code(summary: dict) -> int:
    """The exit status of a run that returned `summary` (`loop.run`)."""
    if summary.get("stopped"):
        return 1
    if summary.get("terminated"):
        return 143  # as a shell reports SIGTERM; the checkpoint is saved
    if summary.get("interrupted"):
        return 130  # as a shell reports SIGINT; the checkpoint is saved
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_flags)
