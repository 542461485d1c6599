"""Evaluate a run's latest checkpoint and print a table.

  python scripts/eval.py --workdir=runs/fl --split=test
  python scripts/eval.py --workdir=runs/fl --split=train,test,ood --num_tasks=512

The run's own config (workdir/checkpoints/config.json, over the defaults of configs/base.py for
fields added since it was saved) rebuilds the experiment.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from configs import base  # noqa: E402
from rl4agents import checkpoint as checkpoint_lib  # noqa: E402
from rl4agents import config_utils  # noqa: E402
from rl4agents.train import experiment, loop, writers  # noqa: E402

SPLITS = ("train", "test", "ood")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by scripts/train.py.")
_SPLIT = flags.DEFINE_list("split", ["test"], f"Comma-separated splits among {SPLITS}.")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", 0, "Tasks per split (0 = the run's eval_tasks).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step (-1 = latest).")
_SEED = flags.DEFINE_integer("seed", -1, "Evaluation seed (-1 = the run's train.eval_seed).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
    for split in _SPLIT.value:
        if split not in SPLITS:
            config_utils.fail(f"--split={split!r} is not allowed; allowed: {list(SPLITS)}")
    ckpt_dir = os.path.join(_WORKDIR.value, "checkpoints")
    config_path = os.path.join(ckpt_dir, "config.json")
    if not os.path.exists(config_path):
        config_utils.fail(f"--workdir={_WORKDIR.value!r} holds no run (no checkpoints/config.json)")
    with open(config_path) as f:
        stored = json.load(f)
    # The stored config over today's defaults: a run saved before a field existed gets the
    # field's default, which keeps the behaviour it was trained with (new options default off).
    config = base.get_config()
    config.unlock()
    config.update(stored)
    if _NUM_TASKS.value < 0:
        config_utils.fail(
            f"--num_tasks={_NUM_TASKS.value}; allowed: >= 1, or 0 (= the run's eval_tasks)"
        )
    if _SEED.value >= 0:
        config.train.eval_seed = _SEED.value
    try:
        exp = experiment.build(config)
        ckpt = checkpoint_lib.Checkpointer(
            ckpt_dir,
            config_json=exp.config_json,
            compat_keys=experiment.COMPAT_KEYS,
            compat_defaults=experiment.COMPAT_DEFAULTS,
        )
        step = ckpt.latest_step() if _STEP.value < 0 else _STEP.value
        if step is None:
            config_utils.fail(f"--workdir={_WORKDIR.value!r} has no checkpoint yet")
        if step not in ckpt.all_steps():
            config_utils.fail(f"--step={step} is not saved; saved steps: {ckpt.all_steps()}")
        state = ckpt.restore(step, exp.abstract_state())
    except (ValueError, KeyError) as e:  # the stored config or checkpoint does not build
        config_utils.fail(f"{config_path}: {e}")
    num_tasks = _NUM_TASKS.value or config.train.eval_tasks
    rows = []
    try:
        for split in _SPLIT.value:
            if split not in exp.splits:
                config_utils.fail(
                    f"--split={split!r}: this run has no such split; allowed: {list(exp.splits)}"
                )
            ev = loop.evaluate(exp, state.params, split, num_tasks)
            rows.append({"split": split, "tasks": num_tasks, **ev})
    finally:
        exp.close()
    cols = [
        "split",
        "tasks",
        "greedy_success",
        "sampled_success",
        "greedy_reward",
        "greedy_turns",
        "greedy_invalid_rate",
        "greedy_truncated",
    ]
    print(f"{config.env.name} / {config.credit.name}, checkpoint step {step}")
    print(writers.format_table(rows, cols))
    ckpt.close()
    jax.effects_barrier()


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_plain_flags)
