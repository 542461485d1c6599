"""Evaluate a run's latest checkpoint and print a table.

  python scripts/eval.py --workdir=runs/fl --split=test
  python scripts/eval.py --workdir=runs/fl --split=train,test,ood --num_tasks=512
  # a run with model.role_params=R >= 2: both the trained and the swapped-roles assignment
  python scripts/eval.py --workdir=runs/two_agent_roles --swap_roles

The run's own config (workdir/checkpoints/config.json, over the defaults of configs/base.py for
fields added since it was saved) rebuilds the experiment. Each evaluation leaves
`<workdir>/eval_provenance.json` (rl4agents.provenance: the config, git commit, versions,
devices and command line, plus the step, splits and table it printed), replacing the last.
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
from rl4agents import config_utils, provenance  # noqa: E402
from rl4agents.train import experiment, loop, writers  # noqa: E402

SPLITS = ("train", "test", "ood")
PROVENANCE_NAME = "eval_provenance.json"
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by scripts/train.py.")
_SPLIT = flags.DEFINE_list("split", ["test"], f"Comma-separated splits among {SPLITS}.")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", 0, "Tasks per split (0 = the run's eval_tasks).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step (-1 = latest).")
_SEED = flags.DEFINE_integer("seed", -1, "Evaluation seed (-1 = the run's train.eval_seed).")
_SWAP = flags.DEFINE_bool(
    "swap_roles",
    False,
    "Runs with model.role_params=R >= 2: add a row per split where role r plays with parameter "
    "set (r + 1) mod R (the swapped-roles control); a drop from the trained row is what the "
    "role-specific sets learned.",
)
flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments {argv[1:]}; allowed: flags only")
    logging.set_verbosity(logging.ERROR)  # Orbax logs every restore at INFO, damage at WARNING
    if not _SPLIT.value:
        config_utils.fail(f"--split='': no split; allowed: a comma-separated list of {SPLITS}")
    for split in _SPLIT.value:
        if split not in SPLITS:
            config_utils.fail(f"--split={split!r} is not allowed; allowed: {list(SPLITS)}")
    if _NUM_TASKS.value < 0:
        config_utils.fail(
            f"--num_tasks={_NUM_TASKS.value}; allowed: >= 1, or 0 (= the run's eval_tasks)"
        )
    if _STEP.value < -1:
        config_utils.fail(f"--step={_STEP.value}; allowed: a saved step, or -1 (= the latest)")
    if _SEED.value < -1:
        config_utils.fail(f"--seed={_SEED.value}; allowed: >= 0, or -1 (= the run's eval_seed)")
    ckpt_dir = os.path.join(_WORKDIR.value, "checkpoints")
    config_path = os.path.join(ckpt_dir, "config.json")
    if not os.path.exists(config_path):
        config_utils.fail(f"--workdir={_WORKDIR.value!r} holds no run (no checkpoints/config.json)")
    if not checkpoint_lib.saved_steps(ckpt_dir):
        config_utils.fail(f"--workdir={_WORKDIR.value!r} has no checkpoint yet")
    # The stored config over today's defaults: a run saved before a field existed gets the
    # field's default, which keeps the behaviour it was trained with (new options default off).
    config = base.get_config()
    config.unlock()
    try:
        with open(config_path) as f:
            config.update(json.load(f))
    except (ValueError, TypeError, AttributeError) as e:  # not JSON, or fields of a wrong type
        config_utils.fail(f"{config_path} is not this project's run config: {e}")
    if _SEED.value >= 0:
        config.train.eval_seed = _SEED.value
    try:
        exp = experiment.build(config)
    except (ValueError, KeyError) as e:  # the stored config does not build today
        config_utils.fail(f"{config_path}: {e}")
    ckpt = None
    try:
        ckpt = checkpoint_lib.Checkpointer(
            ckpt_dir,
            config_json=exp.config_json,
            compat_keys=experiment.COMPAT_KEYS,
            compat_defaults=experiment.COMPAT_DEFAULTS,
        )
        step = ckpt.latest_step() if _STEP.value < 0 else _STEP.value  # steps exist: checked
        if step not in ckpt.all_steps():
            config_utils.fail(f"--step={step} is not saved; saved steps: {ckpt.all_steps()}")
        state = ckpt.restore(step, exp.abstract_state())
    except (ValueError, KeyError) as e:  # a damaged checkpoint, or one of other shapes
        if ckpt is not None:
            ckpt.close()
        exp.close()
        config_utils.fail(str(e))
    if _SWAP.value and config.model.role_params < 2:
        ckpt.close()
        exp.close()
        config_utils.fail(
            f"--swap_roles: this run has model.role_params={config.model.role_params}, one "
            "parameter set for every role; allowed: a run with model.role_params >= 2"
        )
    num_tasks = _NUM_TASKS.value or config.train.eval_tasks
    try:
        experiment.check_batch(num_tasks, 1, exp.mesh, field=f"--num_tasks={num_tasks}")
    except ValueError as e:
        config_utils.fail(str(e))
    for split in _SPLIT.value:
        if split not in exp.splits:
            config_utils.fail(
                f"--split={split!r}: this run has no such split; allowed: {list(exp.splits)}"
            )
    rows = []
    try:
        for split in _SPLIT.value:
            ev = loop.evaluate(exp, state.params, split, num_tasks)
            roles = {"roles": "trained"} if _SWAP.value else {}
            rows.append({"split": split, **roles, "tasks": num_tasks, **ev})
            if _SWAP.value:
                ev = loop.evaluate(exp, state.params, split, num_tasks, swap_roles=True)
                rows.append({"split": split, "roles": "swapped", "tasks": num_tasks, **ev})
    finally:
        exp.close()
    cols = [
        "split",
        *(["roles"] if _SWAP.value else []),
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
    evaluated = {"step": step, "splits": _SPLIT.value, "num_tasks": num_tasks, "rows": rows}
    try:
        provenance.write(_WORKDIR.value, config, extra={"eval": evaluated}, name=PROVENANCE_NAME)
    except OSError as e:  # a run folder this user may read but not write: the table stands
        print(f"warning: {PROVENANCE_NAME} not written: {e}", file=sys.stderr)
    ckpt.close()
    jax.effects_barrier()


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_plain_flags)
