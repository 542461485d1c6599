"""Behaviour cloning on oracle demonstrations: the warm start before RL.

  python scripts/sft.py --config=configs/maze.py --workdir=runs/maze_sft
  python scripts/train.py --config=configs/maze.py --workdir=runs/maze_rl \
      --config.init.params=runs/maze_sft

Uses the same config as the RL run (so the environment, vocabulary and model agree) and its
`sft` section: `num_demos` oracle episodes on training tasks, `keep` ("success" or "all"),
`steps`, `batch_size`, `lr`. Writes `<workdir>/params/` (the parameters RL starts from),
`metrics.jsonl`, TensorBoard events (`tb/`), `curves.png`, `provenance.json` (config, git
commit, versions, devices, command line: rl4agents.provenance) and `summary.json`, and prints
the held-out success of the cloned policy before and after.

The workdir is a new directory, or one holding no run's output: SFT does not resume or
overwrite. At start-up, before any demonstration is collected, a --workdir that is empty, a
file, under a file or not writable, or one that already holds any of `OUTPUTS` (an SFT run's
files, an RL run's `checkpoints/`, a checkpoint's `config.json` or step folders) is refused
in one line, exit status 2, with nothing in it changed. That includes rerunning a finished SFT
run, with its config or another: its parameters are there to use (`--config.init.params`);
clone again into a new workdir. Other files there (notes) are left alone.

The run writes into `<workdir>/.sft_incomplete/` and moves the files into the workdir once all
are written, `summary.json` last: an interrupted run leaves only that folder, which the next
run in the workdir discards, so rerunning an interrupted warm start (scripts/quickstart.sh)
starts it afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
from absl import app, flags, logging  # noqa: E402

from rl4agents import config_utils  # noqa: E402

_CONFIG = config_utils.define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])

# Everything a run writes into its workdir (kept equal to what `run` publishes).
OUTPUTS = ("metrics.jsonl", "tb", "params", "curves.png", "provenance.json", "summary.json")
RL_OUTPUTS = ("checkpoints", "summary.json.tmp")  # scripts/train.py's own, beside OUTPUTS
CHECKPOINT_CONFIG = "config.json"  # rl4agents.checkpoint.CONFIG_NAME, beside step folders
STAGING = ".sft_incomplete"  # where a run writes until its output is complete
_ALLOWED = "allowed: a new directory, or one holding no run's output"
_SHOWN = 8  # entries named in a refusal


def _run_output(workdir: str) -> list[str]:
    """The entries of an existing directory `workdir` that are some run's output."""
    found = []
    for name in sorted(os.listdir(workdir)):
        if (
            name in OUTPUTS
            or name in RL_OUTPUTS
            or name == CHECKPOINT_CONFIG
            or name.isdigit()  # a checkpoint's step folder
            or name.startswith("metrics.jsonl.tmp")  # a metrics rewrite in flight
        ):
            found.append(name + "/" if os.path.isdir(os.path.join(workdir, name)) else name)
    return found


def workdir_problem(workdir: str) -> str | None:
    """Why an existing-or-new `workdir` (`config_utils.check_workdir` passed) cannot take this
    run's output (the one-line refusal), or None. Reads only: a refusal changes nothing."""
    flag = f"--workdir={workdir!r}"
    if not os.path.isdir(workdir):
        return None  # a new directory
    found = _run_output(workdir)
    if not found:
        return None
    shown = ", ".join(found[:_SHOWN]) + (f", ... ({len(found)} in all)" if found[_SHOWN:] else "")
    if "checkpoints/" in found:
        what = f"a scripts/train.py run ({shown}), which SFT would overwrite"
    elif {"params/", "summary.json"} <= set(found):
        what = (
            f"a finished SFT run ({shown}), kept as it is: RL starts from it with "
            f"--config.init.params={workdir}, or clone again into a new --workdir"
        )
    else:
        what = f"run output ({shown}), which SFT would overwrite"
    return f"{flag} already holds {what}; {_ALLOWED}"


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _publish(staging: str, workdir: str) -> None:
    """Moves the complete output from `staging` into `workdir`, `summary.json` last (the mark
    of a finished run); refuses to replace anything that appeared there meanwhile."""
    names = sorted(os.listdir(staging), key=lambda name: (name == "summary.json", name))
    clash = [name for name in names if os.path.lexists(os.path.join(workdir, name))]
    if clash:
        raise ValueError(
            f"--workdir={workdir!r} gained {', '.join(clash)} while SFT ran (another run?); "
            f"this run's output is left in {staging}; {_ALLOWED}"
        )
    for name in names:
        os.rename(os.path.join(staging, name), os.path.join(workdir, name))
    os.rmdir(staging)


def run(config, workdir: str, quiet: bool = False) -> dict:
    """Collect demonstrations, clone them, evaluate, save; returns the summary dict.

    `workdir` passed `workdir_problem` (main checks it before this starts): the output is
    written into `workdir/STAGING` and moved into `workdir` once complete."""
    import jax
    import numpy as np
    import tqdm

    from rl4agents import provenance
    from rl4agents.rollout import rollout as rollout_lib
    from rl4agents.train import experiment, loop, sft, writers

    c = config.sft
    config_utils.check_choice("sft.keep", c.keep, ("success", "all"))
    for field in ("num_demos", "steps", "batch_size"):
        if c[field] < 1:
            raise ValueError(f"sft.{field}={c[field]}; allowed: >= 1")
    if not c.lr > 0:
        raise ValueError(f"sft.lr={c.lr}; allowed: > 0")
    exp = experiment.build(config)
    root = jax.random.fold_in(exp.root_key(), 7)  # SFT's own stream, apart from RL's
    t0 = time.perf_counter()
    lay = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout)
    env_params = exp.env.default_params("train")
    task_keys = jax.random.split(jax.random.fold_in(root, 0), c.num_demos)
    demos = sft.collect_demos(exp.env, env_params, task_keys, lay, jax.random.fold_in(root, 1))
    oracle_success = float(np.mean(demos.success))
    if c.keep == "success":
        demos = demos.select(np.asarray(demos.success))
    n = demos.tokens.shape[0]
    if n < c.batch_size:
        raise ValueError(
            f"only {n} demonstrations kept (oracle success {oracle_success:.3f} over "
            f"{c.num_demos} tasks, sft.keep={c.keep!r}); allowed: sft.batch_size <= {n}, "
            "or raise sft.num_demos"
        )
    collect_s = time.perf_counter() - t0
    state = exp.init_state(jax.random.fold_in(exp.root_key(), 2**31 - 1))
    before = loop.evaluate(exp, state.params, "test", config.train.eval_tasks)
    scfg = sft.SFTConfig(steps=c.steps, batch_size=c.batch_size, lr=c.lr)
    opt = sft.make_optimizer(scfg)
    step_fn = sft.make_step(exp.step_cfg.graphdef, opt, exp.mesh)
    params, opt_state = state.params, sft.init_opt_state(opt, state.params, exp.mesh)
    staging = os.path.join(workdir, STAGING)
    _remove(staging)  # an interrupted run's incomplete output
    writer = writers.MetricWriter(staging)
    provenance.write(staging, config)
    first = last = None
    bar_off = quiet or not config.log.progress
    stream = sft.minibatches(demos, c.batch_size, jax.random.fold_in(root, 2))
    for i, batch in zip(tqdm.trange(c.steps, disable=bar_off, unit="step", desc="sft"), stream):
        params, opt_state, m = step_fn(params, opt_state, batch)
        if i % 10 == 0 or i == c.steps - 1:
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            first = first or m
            last = m
            writer.write(i + 1, m, prefix="sft", wall_time=time.perf_counter() - t0)
    after = {s: loop.evaluate(exp, params, s, config.train.eval_tasks) for s in ("test", "ood")}
    writer.write(c.steps, after["test"], prefix="eval_test", wall_time=time.perf_counter() - t0)
    writer.close()
    sft.save_params(staging, params, c.steps, exp.config_json, experiment.INIT_COMPAT_KEYS)
    writers.plot_curves(
        os.path.join(staging, writers.METRICS_NAME),
        os.path.join(staging, "curves.png"),
        ["sft/nll"],
        title=f"SFT {config.env.name}",
    )
    summary = {
        "env": config.env.name,
        "demos": c.num_demos,
        "oracle_success": oracle_success,
        "kept": int(n),
        "mean_turns": float(np.mean(demos.num_turns)),
        "nll_first": first["nll"],
        "nll_last": last["nll"],
        "collect_s": round(collect_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "before_test_greedy_success": before["greedy_success"],
        "test": after["test"],
        "ood": after["ood"],
        "params": os.path.join(workdir, sft.PARAMS_DIR),
    }
    with open(os.path.join(staging, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    _publish(staging, workdir)
    if not quiet:
        rows = [
            {"split": s, **{k: after[s][k] for k in ("greedy_success", "sampled_success")}}
            for s in ("test", "ood")
        ]
        print(
            f"\noracle: {oracle_success:.3f} success on {c.num_demos} training tasks; "
            f"cloned {n} episodes ({summary['mean_turns']:.1f} turns) for {c.steps} steps; "
            f"action-token NLL {first['nll']:.3f} -> {last['nll']:.3f}"
        )
        print(f"held-out greedy success before SFT: {before['greedy_success']:.3f}; after:")
        print(writers.format_table(rows))
        print(f"parameters: {summary['params']}  (RL: --config.init.params={workdir})")
    return summary


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    config_utils.check_workdir("--workdir", _WORKDIR.value)
    problem = workdir_problem(_WORKDIR.value)
    if problem:
        config_utils.fail(problem)
    try:
        run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, KeyError, FileNotFoundError) as e:
        config_utils.fail(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_flags)
