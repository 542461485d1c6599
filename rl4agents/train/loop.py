"""The host training loop: resume, progress bar, evaluation, logging, checkpoints, plots.

This is the one library module that does I/O. Everything numeric happens in the jitted train
step; the loop fetches one small dict of scalars per iteration.

Multi-process runs (`rl4agents.distributed`): every process runs this loop and every jitted
program (train step, evaluation) over the global mesh; checkpoints are saved and restored by
all processes together (Orbax coordinates them and writes from process 0); metrics, the
progress bar, prints, plots and summary.json come from process 0 only. Decisions to stop early
(SIGTERM, wall-time budget) are taken by all processes together.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import tqdm

from rl4agents import checkpoint as checkpoint_lib
from rl4agents import distributed, memory
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import sft as sft_lib
from rl4agents.train import writers

EVAL_KEYS = experiment_lib.EVAL_KEYS


def evaluate(exp: experiment_lib.Experiment, params, split: str, num_tasks: int) -> dict:
    """Greedy and sampled evaluation on `num_tasks` fixed tasks of `split`."""
    # A collective program on every process; `to_host` reads its global outputs.
    m = distributed.to_host(exp.eval_fn(split, num_tasks)(params, exp.config.train.eval_seed))
    modes = experiment_lib.EVAL_MODES
    return {f"{mode}_{k}": float(m[f"{mode}_{k}"]) for mode in modes for k in EVAL_KEYS}


class _StopRequest:
    """Turns SIGTERM into a flag so the loop can checkpoint and exit cleanly."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not in the main thread
            self._old = None
        return self

    def _handle(self, *_):
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_after: int | None = None,
    mesh=None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train `config` in `workdir`, resuming from its latest checkpoint.

    Args:
      config: a full config (see configs/base.py).
      workdir: run directory: checkpoints/, metrics.jsonl, tb/, curves.png, summary.json.
      stop_after: stop (with a checkpoint) after this many steps in this call; for tests of
        interruption and resume.
      mesh: optional mesh overriding config.mesh.
      quiet: no progress bar and no printed summary (always so on processes other than 0).

    Returns:
      The summary dict (also written to workdir/summary.json by process 0).

    Raises:
      ValueError: an invalid config, or one whose estimated memory per device exceeds the
        device memory (`memory.check_fits`), before anything is allocated.
    """
    exp = experiment_lib.build(config, mesh=mesh)
    c = exp.config
    memory.check_fits(
        c,
        exp.mesh.size,
        memory.device_memory(c),
        mesh_shape=dict(exp.mesh.shape),
        env=exp.env,
        model_cfg=exp.model_cfg,
    )
    main = distributed.is_main()
    quiet = quiet or not main
    ckpt_dir = os.path.join(workdir, "checkpoints")
    _check_writable(workdir, ckpt_dir)
    ckpt = checkpoint_lib.Checkpointer(
        ckpt_dir,
        max_to_keep=c.checkpoint.max_to_keep,
        config_json=exp.config_json,
        compat_keys=experiment_lib.COMPAT_KEYS,
        compat_defaults=experiment_lib.COMPAT_DEFAULTS,
    )
    start = ckpt.latest_step()
    # A rerun of a finished run, config unchanged.
    done = None if ckpt.config_diff() else _finished_summary(workdir, start, c.train.num_steps)
    # Nothing to train or evaluate: its files stay as they are (every process agrees first).
    if not distributed.any_process([done is None])[0]:
        ckpt.close()
        exp.close()
        if not quiet:
            print(f"Already finished at step {start}: {os.path.join(workdir, 'summary.json')}")
        return done
    try:
        init_wall = _init_wall(c) if start is None else 0.0
        if start is None:
            state, start = exp.init_state(jax.random.fold_in(exp.root_key(), 2**31 - 1)), 0
            if c.init.params:
                state = _warm_start(exp, state, c.init.params)
            elif c.model.get("checkpoint", ""):  # a pretrained model (real checkpoints)
                state = _start_from(state, exp.pretrained_params())
        else:
            state = ckpt.restore(start, exp.abstract_state())
    except BaseException:  # Orbax's threads otherwise outlive the error message
        ckpt.close()
        exp.close()
        raise
    metrics_path = os.path.join(workdir, writers.METRICS_NAME)
    previous = [r for r in writers.read_metrics(metrics_path) if r.get("step", 0) <= start]
    wall_offset = max([r.get("wall_time", 0.0) for r in previous], default=init_wall)
    # Rows after the checkpointed step are redone by this run; drop them first.
    writer = writers.MetricWriter(workdir, enabled=main, resume_step=start + 1)
    root = exp.root_key()
    t0 = time.perf_counter() - wall_offset
    milestones = _milestones(previous)
    num_steps = c.train.num_steps
    interrupted = False
    bar = tqdm.tqdm(
        total=num_steps,
        initial=start,
        disable=quiet or not c.log.progress,
        unit="step",
        dynamic_ncols=True,
    )
    step = start
    compile_s = None
    # A run killed after its last checkpoint but before its final evaluation resumes at
    # num_steps: it has nothing left to train and finishes here.
    finished = start >= num_steps
    with _StopRequest() as stop:
        try:
            # Interrupted in that step's evaluation: redo it (all processes agree first).
            if distributed.any_process([_eval_missing(previous, start, c)])[0]:
                ev = evaluate(exp, state.params, "test", c.train.eval_tasks)
                writer.write(start, ev, prefix="eval_test", wall_time=wall_offset)
                _update_milestones(milestones, ev["greedy_success"], start, wall_offset)
            while step < num_steps:
                t_step = time.perf_counter()
                state, metrics = exp.train_step(state, root)
                metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
                if compile_s is None:
                    compile_s = time.perf_counter() - t_step
                step += 1
                wall = time.perf_counter() - t0
                if step % c.log.every == 0 or step == num_steps:
                    writer.write(step, metrics, prefix="train", wall_time=wall)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward']:.3f}",
                    success=f"{metrics['success']:.2f}",
                    refresh=False,
                )
                if step % c.train.eval_every == 0 or step == num_steps:
                    ev = evaluate(exp, state.params, "test", c.train.eval_tasks)
                    writer.write(step, ev, prefix="eval_test", wall_time=wall)
                    _update_milestones(milestones, ev["greedy_success"], step, wall)
                    if not quiet:
                        bar.write(
                            f"step {step}: held-out greedy success {ev['greedy_success']:.3f}, "
                            f"sampled {ev['sampled_success']:.3f} ({wall:.0f}s)"
                        )
                if step % c.checkpoint.every == 0:
                    ckpt.save(step, state)
                out_of_time = bool(c.train.max_minutes and wall > 60 * c.train.max_minutes)
                # Every process leaves at the same step (a collective with several processes).
                out_of_time, stop_requested = distributed.any_process([out_of_time, stop.requested])
                # Reaching num_steps or the wall-time budget ends the run (final evaluation).
                finished = step >= num_steps or out_of_time
                if (
                    stop_requested
                    or out_of_time
                    or (stop_after is not None and step - start >= stop_after)
                ):
                    break
        except KeyboardInterrupt:
            interrupted = True
            if not quiet:
                print(f"\nInterrupted at step {step}; saving a checkpoint.")
        finally:
            bar.close()
            ckpt.save(step, state)
            ckpt.wait()
            writer.close()
    try:
        summary = _summarize(
            exp,
            state,
            workdir,
            step,
            time.perf_counter() - t0,
            milestones,
            compile_s,
            final=finished and not interrupted,
            quiet=quiet,
        )
    except KeyboardInterrupt:  # in the final evaluation; the checkpoint is saved
        if not quiet:
            print(f"\nInterrupted in the final evaluation at step {step}; rerun to finish.")
        interrupted = True
        summary = {"steps": int(step), "finished": False}
    finally:
        ckpt.close()
        exp.close()
    summary["interrupted"] = interrupted
    return summary


def _finished_summary(workdir: str, start: int | None, num_steps: int) -> dict | None:
    """The workdir's summary.json if it records this run finished at its last checkpoint
    `start` and `num_steps` asks for no more (a rerun of a finished run), else None."""
    summary = writers.read_summary(workdir)
    if not isinstance(summary, dict) or start is None or start < num_steps:
        return None
    if summary.get("finished") is not True or summary.get("steps") != start:
        return None
    return {**summary, "interrupted": False}


def _check_writable(workdir: str, ckpt_dir: str) -> None:
    """Raises `ValueError` unless `workdir` and its checkpoint folder can be created and
    written (a file written and removed in each), before any work: Orbax's failed
    asynchronous save would otherwise surface only at the first checkpoint, after the work."""
    for folder in (workdir, ckpt_dir):
        try:
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, f".write_probe.{os.getpid()}")
            with open(probe, "w") as f:
                f.write("ok\n")
            os.remove(probe)
        except OSError as e:
            raise ValueError(
                f"workdir {workdir!r}: {folder!r} is not a writable folder ({e.strerror}); "
                "allowed: a folder this process can create and write"
            ) from None


def _eval_missing(previous: list[dict], start: int, c) -> bool:
    """Whether the resumed step `start` is an evaluation step whose held-out evaluation row
    is missing from the metrics (the run was interrupted during that evaluation, after its
    train row and before its checkpoint)."""
    is_eval_step = start % c.train.eval_every == 0 or start == c.train.num_steps
    if start == 0 or not is_eval_step:
        return False
    return not any(r.get("step") == start and "eval_test/greedy_success" in r for r in previous)


def _warm_start(exp, state, directory: str):
    """`state` with the parameters saved in `directory` (scripts/sft.py) as its start.

    The KL reference, if any, is the warm-started policy (as in RLHF after SFT).
    """
    params = sft_lib.load_params(
        directory, exp.abstract_state().params, exp.config_json, experiment_lib.INIT_COMPAT_KEYS
    )
    return _start_from(state, params)


def _init_wall(c) -> float:
    """Seconds the warm start took (`init.count_wall`), from its summary.json; else 0."""
    if not (c.init.params and c.init.get("count_wall", False)):
        return 0.0
    path = os.path.join(c.init.params, "summary.json")
    try:
        with open(path) as f:
            return float(json.load(f)["wall_s"])
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(
            f"init.count_wall=True but {path!r} has no wall_s ({e}); allowed: a finished "
            "scripts/sft.py workdir as init.params, or init.count_wall=False"
        ) from e


def _start_from(state, params):
    """`state` starting from `params`; the KL reference, if any, is a copy of them."""
    ref = None if state.ref_params is None else jax.tree.map(jnp.copy, params)
    return state.replace(params=params, ref_params=ref)


def _milestones(rows) -> dict:
    out = {}
    for r in rows:
        if "eval_test/greedy_success" in r:
            _update_milestones(out, r["eval_test/greedy_success"], r["step"], r["wall_time"])
    return out


def _update_milestones(ms: dict, success: float, step: int, wall: float) -> None:
    for thr in (0.5, 0.8, 0.9):
        key = f"time_to_{thr}"
        if success >= thr and key not in ms:
            ms[key] = {"step": step, "wall_s": round(wall, 1)}


def _summarize(exp, state, workdir, step, wall, milestones, compile_s, final, quiet):
    c = exp.config
    summary: dict[str, Any] = {
        "steps": int(step),
        "wall_s": round(wall, 1),
        "first_step_s": None if compile_s is None else round(compile_s, 2),
        "milestones": milestones,
        "finished": bool(final),
    }
    rows = []
    if final:
        for split in exp.splits:
            ev = evaluate(exp, state.params, split, c.train.eval_tasks)
            summary[f"eval_{split}"] = ev
            rows.append(
                {
                    "split": split,
                    **{
                        k: ev[k]
                        for k in (
                            "greedy_success",
                            "sampled_success",
                            "greedy_reward",
                            "greedy_turns",
                            "greedy_invalid_rate",
                        )
                    },
                }
            )
    if not distributed.is_main():  # evaluated above with everyone; files come from process 0
        summary["checkpoints"] = os.path.join(workdir, "checkpoints")
        return summary
    metrics_path = os.path.join(workdir, writers.METRICS_NAME)
    png = os.path.join(workdir, "curves.png")
    keys = [k for k in c.log.plot_keys]
    try:
        writers.plot_curves(metrics_path, png, keys, title=f"{c.env.name} / {c.credit.name}")
        summary["curves"] = png
    except ValueError:
        pass
    summary["checkpoints"] = os.path.join(workdir, "checkpoints")
    tmp = os.path.join(workdir, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(workdir, "summary.json"))
    if not quiet:
        print()
        if rows:
            print(f"Final evaluation ({c.train.eval_tasks} tasks per split):")
            print(writers.format_table(rows))
        print(f"\nsteps {step}, wall {wall:.0f}s, milestones {milestones}")
        print(f"curves: {summary.get('curves')}\ncheckpoints: {summary['checkpoints']}")
    return summary
