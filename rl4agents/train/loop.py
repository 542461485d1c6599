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
import math
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import tqdm

from rl4agents import checkpoint as checkpoint_lib
from rl4agents import distributed, provenance
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import writers

EVAL_KEYS = experiment_lib.EVAL_KEYS


def evaluate(
    exp: experiment_lib.Experiment, params, split: str, num_tasks: int, swap_roles: bool = False
) -> dict:
    """Greedy and sampled evaluation on `num_tasks` fixed tasks of `split`; `swap_roles`: the
    swapped-roles control of `model.role_params` >= 2 (role r plays with set (r + 1) mod R,
    `step.evaluate`)."""
    fn = (
        exp.eval_fn(split, num_tasks, swap_roles=True)
        if swap_roles
        else exp.eval_fn(split, num_tasks)
    )
    # A collective program on every process; `to_host` reads its global outputs.
    m = distributed.to_host(fn(params, exp.config.train.eval_seed))
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

    A run ends in one of four ways. Finished: `train.num_steps` reached or the
    `train.max_minutes` budget spent (a final evaluation on every split). Interrupted: Ctrl-C,
    or SIGTERM ("terminated"); the current step is checkpointed. Stopped: a train step whose
    rewards, loss, gradient norm or updated state are not finite (`step.nonfinite_metrics`) is
    rejected; nothing more is saved, the earlier checkpoints stay, and "stopped" holds the
    one-line reason. Failed: an exception (a checkpoint that cannot be saved raises
    `checkpoint.CheckpointError` without a second attempt).

    Args:
      config: a full config (see configs/base.py).
      workdir: run directory: checkpoints/, metrics.jsonl, tb/, curves.png, summary.json,
        provenance.json, usage.json (the CPU time and peak memory of every process so far).
      stop_after: stop (with a checkpoint) after this many steps in this call; for tests of
        interruption and resume.
      mesh: optional mesh overriding config.mesh.
      quiet: no progress bar and no printed summary (always so on processes other than 0).

    Returns:
      The summary dict (also written to workdir/summary.json by process 0), with "steps",
      "finished", "interrupted", "terminated" (SIGTERM) and "stopped" (a reason, or None).

    Raises:
      ValueError: an invalid config, or one whose estimated memory per device exceeds the
        device memory (`memory.check_fits`), before anything is allocated.
    """
    cpu0 = time.process_time()
    exp = experiment_lib.build(config, mesh=mesh)  # checks the memory estimate too
    c = exp.config
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
    done = None if ckpt.config_diff() else _finished_summary(workdir, start)
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
        if main:  # this segment's code, versions, devices and command line
            provenance.write(workdir, c, extra={"start_step": int(start)})
    except BaseException:  # Orbax's threads otherwise outlive the error message
        _close(ckpt, exp)
        raise
    # What the run's earlier processes used: the count goes on from there.
    usage = writers.Usage(workdir, cpu0, resumed=bool(start), main=main)
    metrics_path = os.path.join(workdir, writers.METRICS_NAME)
    previous = [r for r in writers.read_metrics(metrics_path) if r.get("step", 0) <= start]
    wall_offset = max([r.get("wall_time", 0.0) for r in previous], default=init_wall)
    # Rows after the checkpointed step are redone by this run; drop them first.
    writer = writers.MetricWriter(workdir, enabled=main, resume_step=start + 1)
    root = exp.root_key()
    t0 = time.perf_counter() - wall_offset
    milestones = _milestones(previous)
    num_steps = c.train.num_steps
    budget_s = 60.0 * c.train.max_minutes
    splits = eval_splits(exp)
    interrupted = terminated = False
    stopped = None  # why a non-finite step stopped the run (one line)
    bar = tqdm.tqdm(
        total=num_steps,
        initial=start,
        disable=quiet or not c.log.progress,
        unit="step",
        dynamic_ncols=True,
    )
    step = start
    compile_s = None
    pace = None  # (step, wall) after this call's first step, which compiles: the budget's pace
    known: dict[str, dict] = {}  # the evaluations of `state` done at `step`, by split
    # A run killed after its last checkpoint but before its final evaluation resumes at
    # num_steps, or past its wall-time budget: it has nothing left to train and finishes here.
    finished = distributed.any_process([start >= num_steps or _out_of_time(wall_offset, c)])[0]

    def evaluate_at(step: int, wall: float, which: tuple[str, ...]) -> None:
        """Evaluates `state` on the splits `which` at `step`: rows, milestones, a line."""
        shown = []
        known.clear()
        for split in which:
            ev = known[split] = evaluate(exp, state.params, split, c.train.eval_tasks)
            writer.write(step, ev, prefix=f"eval_{split}", wall_time=wall)
            if split == "test":
                _update_milestones(milestones, ev["greedy_success"], step, wall)
                shown.append(
                    f"held-out greedy success {ev['greedy_success']:.3f}, "
                    f"sampled {ev['sampled_success']:.3f}"
                )
            else:
                shown.append(f"{split} greedy {ev['greedy_success']:.3f}")
        if not quiet:
            bar.write(f"step {step}: {'; '.join(shown)} ({wall:.0f}s)")

    with _StopRequest() as stop:
        try:
            # Interrupted in that step's evaluation: redo it (all processes agree first).
            missing = _eval_missing(previous, start, c, splits)
            if distributed.any_process([bool(missing)])[0]:
                evaluate_at(start, wall_offset, missing or splits)
            while not finished:
                t_step = time.perf_counter()
                state, metrics = exp.train_step(state, root)
                metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
                if compile_s is None:
                    compile_s = time.perf_counter() - t_step
                wall = time.perf_counter() - t0
                if metrics.get("nonfinite", 0.0) > 0:  # rejected: `state` is still `step`'s
                    writer.write(step + 1, metrics, prefix="train", wall_time=wall)
                    ckpt.wait()
                    stopped = _nonfinite_reason(exp.env_label, step, metrics, ckpt.latest_step())
                    break
                step += 1
                known.clear()
                usage.write()
                if step % c.log.every == 0 or step == num_steps:
                    writer.write(step, metrics, prefix="train", wall_time=wall)
                bar.update(1)
                postfix = f"reward={metrics['reward']:.3f}, success={metrics['success']:.2f}"
                if budget_s:
                    pace = pace or (step, wall)
                    end = budget_end(step, wall, pace, budget_s, num_steps)
                    postfix += f", budget {_clock(budget_s)}"
                    if end is not None:
                        postfix += f", ends ~step {end}"
                        bar.total = end
                bar.set_postfix_str(postfix, refresh=False)
                if step % c.train.eval_every == 0 or step == num_steps:
                    evaluate_at(step, wall, splits)
                if step % c.checkpoint.every == 0:
                    ckpt.save(step, state)
                # Every process leaves at the same step (a collective with several processes).
                out_of_time, terminated = distributed.any_process(
                    [_out_of_time(wall, c), stop.requested]
                )
                # Reaching num_steps or the wall-time budget ends the run (final evaluation).
                finished = step >= num_steps or out_of_time
                if terminated or (stop_after is not None and step - start >= stop_after):
                    break
        except KeyboardInterrupt:
            interrupted = True
            if not quiet:
                print(f"\nInterrupted at step {step}; saving a checkpoint.")
        except BaseException as e:
            bar.close()
            writer.close()
            if not _is_save_error(e):  # keep what was trained, then report the error
                _save_quietly(ckpt, step, state)
            _close(ckpt, exp)
            raise
        bar.close()
        writer.close()
        try:
            if stopped is None:  # a rejected step leaves the saved steps as they are
                ckpt.save(step, state)
            ckpt.wait()
        except BaseException:
            _close(ckpt, exp)
            raise
    interrupted = interrupted or terminated
    if terminated and not quiet:
        print(f"\nTerminated at step {step}; checkpoint saved, rerun to resume.")
    status = {"interrupted": interrupted, "terminated": terminated, "stopped": stopped}
    try:
        summary = _summarize(
            exp,
            state,
            workdir,
            step,
            time.perf_counter() - t0,
            milestones,
            compile_s,
            final=finished and not interrupted and stopped is None,
            quiet=quiet,
            status=status,
            known=known,
            usage=usage,
        )
    except KeyboardInterrupt:  # in the final evaluation; the checkpoint is saved
        if not quiet:
            print(f"\nInterrupted in the final evaluation at step {step}; rerun to finish.")
        return {"steps": int(step), "finished": False, "interrupted": True}
    finally:
        _close(ckpt, exp)
    return summary


def final_eval_tasks(c) -> int:
    """Tasks per split of a run's final evaluation: `train.final_eval_tasks`, or
    `train.eval_tasks` when that is 0 (or absent from an older run's config)."""
    return int(c.train.get("final_eval_tasks", 0) or c.train.eval_tasks)


def eval_splits(exp: experiment_lib.Experiment) -> tuple[str, ...]:
    """The splits evaluated at every `train.eval_every` step: "test", and "ood" when the
    environment has one and `train.eval_ood` is on (metrics rows `eval_<split>/...`)."""
    ood = exp.config.train.get("eval_ood", True) and "ood" in exp.splits
    return ("test", "ood") if ood else ("test",)


def budget_end(
    step: int, wall: float, pace: tuple[int, float], budget_s: float, num_steps: int
) -> int | None:
    """The step at which the wall-time budget is estimated to end the run.

    Args:
      step: the current step; `wall`: the run's seconds so far (the budget's clock).
      pace: (step, wall) at an earlier point of this process, after its compiling first
        step: the average pace since then (evaluations included) is extrapolated.
      budget_s: the budget in seconds (`train.max_minutes` * 60).
      num_steps: `train.num_steps`, the end if the budget lasts.

    Returns:
      The step (between `step` and `num_steps`), or None before the pace can be measured.
    """
    steps, seconds = step - pace[0], wall - pace[1]
    if steps <= 0 or seconds <= 0:
        return None
    left = max(budget_s - wall, 0.0) * steps / seconds
    # The step that crosses the budget is the last one.
    return int(min(num_steps, step + math.floor(left) + 1 if left > 0 else step))


def _clock(seconds: float) -> str:
    """ "15:00" for 900 s; "1:05:00" past an hour."""
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _out_of_time(wall: float, c) -> bool:
    """Whether `wall` seconds of the run's clock spend its `train.max_minutes` budget."""
    return bool(c.train.max_minutes and wall > 60 * c.train.max_minutes)


def _nonfinite_reason(env_label: str, step: int, metrics: dict, last_saved: int | None) -> str:
    """One line: the quantity that was not finite at step `step + 1` (rejected; the
    parameters are those of `step`) and the last saved checkpoint; `env_label` names the
    environment (`Experiment.env_label`)."""
    bad = step + 1
    rows = int(metrics.get("nonfinite_rewards", 0.0))
    values = ", ".join(f"{k}={metrics[k]:.4g}" for k in ("loss", "grad_norm") if k in metrics)
    if rows:
        what = (
            f"non-finite reward from environment {env_label!r} at step {bad} "
            f"({rows} episodes; {values})"
        )
    else:
        name = next(
            (k for k in ("loss", "grad_norm") if not math.isfinite(metrics.get(k, 0.0))),
            "updated parameters or optimizer state",
        )
        what = f"non-finite {name} at step {bad} ({values})"
    saved = "none" if last_saved is None else f"step {last_saved}"
    return f"{what}; parameters kept from step {step}; last good checkpoint: {saved}"


def _is_save_error(e: BaseException) -> bool:
    """Whether `e` is a failed checkpoint save: saving again would fail again."""
    return isinstance(e, checkpoint_lib.CheckpointError)


def _save_quietly(ckpt, step: int, state) -> None:
    """Saves `state` while another error leaves the run. A failure here (the state donated
    to a step that raised, say) is dropped: the first error is the one to report."""
    try:
        ckpt.save(step, state)
        ckpt.wait()
    except Exception:
        pass


def _close(ckpt, exp) -> None:
    """Closes the checkpointer and the experiment. A failure to close the checkpointer (a
    save that failed in the background) is dropped: it is reported by whoever raised it
    first, or by the save that follows an error."""
    try:
        ckpt.close()
    except Exception:
        pass
    finally:
        exp.close()


def _finished_summary(workdir: str, start: int | None) -> dict | None:
    """The workdir's summary.json if it records this run finished at its last checkpoint
    `start` (a rerun of a finished run: its config unchanged, so neither `train.num_steps`
    nor the `train.max_minutes` budget that ended it asks for more), else None."""
    summary = writers.read_summary(workdir)
    if not isinstance(summary, dict) or start is None:
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


def _eval_missing(previous: list[dict], start: int, c, splits: tuple[str, ...]) -> tuple:
    """The splits of `splits` whose evaluation row at the resumed step `start` is missing
    from the metrics, when `start` is an evaluation step (the run was interrupted during that
    evaluation, after its train row and before its checkpoint). Step 0 is one only under
    `train.eval_at_start` (the start policy, so curves begin where training did): a fresh run
    evaluates every split there."""
    is_eval_step = start % c.train.eval_every == 0 or start == c.train.num_steps
    if not is_eval_step or (start == 0 and not c.train.get("eval_at_start", False)):
        return ()
    have = {k for r in previous if r.get("step") == start for k in r}
    return tuple(s for s in splits if f"eval_{s}/greedy_success" not in have)


def _warm_start(exp, state, directory: str):
    """`state` with the parameters saved in `directory` (scripts/sft.py) as its start.

    The KL reference, if any, is the warm-started policy (as in RLHF after SFT). A value head
    the saved policy lacks starts from `state`'s initialisation or, for a separate critic with
    `init.critic="policy"`, as a copy of the saved policy (`Experiment.saved_params`).
    """
    return _start_from(state, exp.saved_params(directory, fresh=state.params))


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
    """`state` starting from `params`; the KL reference and the sampler's stale copies
    (`train.staleness`), if any, are copies of them."""
    ref = None if state.ref_params is None else jax.tree.map(jnp.copy, params)
    stale = state.stale_params
    if stale is not None:
        stale = tuple(jax.tree.map(jnp.copy, params) for _ in stale)
    return state.replace(params=params, ref_params=ref, stale_params=stale)


def _sft_metrics(c) -> str | None:
    """The metrics.jsonl of the scripts/sft.py workdir this run started from (`init.params`),
    drawn as the phase before RL in curves.png; None without one."""
    path = os.path.join(c.init.params, writers.METRICS_NAME) if c.init.params else ""
    return path if path and os.path.isfile(path) else None


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


def _summarize(
    exp, state, workdir, step, wall, milestones, compile_s, final, quiet, status, known, usage
):
    """Writes summary.json (and curves.png) from process 0 and returns the summary; `final`:
    evaluates every split first (`known`: evaluations of `state` already done, by split)."""
    c = exp.config
    summary: dict[str, Any] = {
        "steps": int(step),
        "wall_s": round(wall, 1),
        "process_cpu_s": None,  # set below, after the final evaluation (`writers.Usage`)
        "peak_rss_gb": None,
        "first_step_s": None if compile_s is None else round(compile_s, 2),
        "milestones": milestones,
        "finished": bool(final),
        **status,
    }
    rows = []
    n_final = final_eval_tasks(c)
    if final:
        summary["final_eval_tasks"] = n_final
        for split in exp.splits:
            done = known.get(split) if n_final == c.train.eval_tasks else None
            ev = done or evaluate(exp, state.params, split, n_final)
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
    summary["process_cpu_s"], summary["peak_rss_gb"] = usage.write()
    if not distributed.is_main():  # evaluated above with everyone; files come from process 0
        summary["checkpoints"] = os.path.join(workdir, "checkpoints")
        return summary
    metrics_path = os.path.join(workdir, writers.METRICS_NAME)
    png = os.path.join(workdir, "curves.png")
    keys = [k for k in c.log.plot_keys]
    try:
        writers.plot_curves(
            metrics_path,
            png,
            keys,
            title=f"{c.env.name} / {c.credit.name}",
            eval_tasks=c.train.eval_tasks,
            sft_metrics=_sft_metrics(c),
            sft_wall_counted=bool(c.init.get("count_wall", False)),
        )
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
            print(f"Final evaluation ({n_final} tasks per split):")
            print(writers.format_table(rows))
        print(f"\nsteps {step}, wall {wall:.0f}s, milestones {milestones}")
        print(f"curves: {summary.get('curves')}\ncheckpoints: {summary['checkpoints']}")
    return summary
