"""Train an agent from a config file.

  python scripts/train.py --config=configs/frozen_lake.py --workdir=runs/fl
  python scripts/train.py --config=configs/sokoban.py:ppo_gae --workdir=runs/sok \
      --config.optim.lr=3e-4

Resumes automatically from the workdir's latest checkpoint.

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

from rl4agents import config_utils, distributed  # noqa: E402
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
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if summary.get("interrupted"):
        sys.exit(130)  # as a shell reports SIGINT; the checkpoint is saved


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_flags)
