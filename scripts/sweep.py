"""Run a study's sweep: one train.py subprocess per run, N at a time, resumable.

  python scripts/sweep.py experiments/example_sweep.py --workers=2
  python scripts/sweep.py experiments/example_sweep.py --dry_run
  python scripts/sweep.py experiments/example_sweep.py --only=ppo_gae --out=runs/sweeps/x

Each run gets `<out>/<run dir>/` (default out: runs/sweeps/<study>) holding config.json (the
resolved config), command.txt (the exact command), log.txt (its stdout and stderr, appended
per attempt) and what train.py writes. A run whose summary.json says `"finished": true` is
skipped; any other run is (re)started and train.py resumes it from its latest checkpoint.
Ctrl-C (or SIGTERM) asks every worker to checkpoint and stop; rerunning the command continues.
`<out>/sweep.json` lists every run of the study for scripts/make_table.py, and
`<out>/provenance.json` records the runner's last start (rl4agents.provenance: git commit,
versions, command line; each run's own, with its config and devices, is in its directory).

Before any run starts (with --dry_run too), every run's config is checked as train.py checks
it at start-up, values included (`sweep.check_config`): a run train.py would refuse, or a
study file that does not load, stops the sweep with one `error:` line and exit status 2.

With N workers each run gets `--xla_force_host_platform_device_count=max(1, cores // N)` in
its XLA_FLAGS (replacing any given value), so the workers share the host's cores; `--devices`
sets that count instead (say one device per run for runs comparable with an earlier batch
that ran two at a time, while the sweep is confined to fewer cores with `taskset`).

Exit status: 0 every selected run is complete, 1 some run failed, 2 a bad study or arguments,
130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ml_collections  # noqa: E402
import tqdm  # noqa: E402

from configs import base as base_config  # noqa: E402
from rl4agents import config_utils, provenance, results  # noqa: E402
from rl4agents import sweep as sweep_lib  # noqa: E402

TRAIN_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
WORKER_OVERRIDES = {"log.progress": False}  # workers write to log.txt, not a terminal
DEVICE_FLAG = "--xla_force_host_platform_device_count"
# glibc's malloc asks for transparent huge pages: XLA's large CPU buffers then fault in 2 MiB at
# a time instead of 4 KiB (scripts/bench_malloc.py measured a quarter off a sokoban step, with
# the same numbers). Read once at process start, so it is set in each run's environment; a
# GLIBC_TUNABLES of the user's own is left as it is.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"


@dataclasses.dataclass
class Job:
    """A run with its resolved config, directory and command."""

    run: sweep_lib.Run
    workdir: str
    config: ml_collections.ConfigDict
    argv: list[str]

    @property
    def env(self) -> str:
        return self.config.env.name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = config_utils.ArgumentParser(
        description="Run a study's sweep with local worker subprocesses.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("study", help="the study file, experiments/<study>.py")
    p.add_argument("--out", default=None, help="sweep directory (default runs/sweeps/<study>)")
    p.add_argument("--workers", type=int, default=1, help="runs at a time")
    p.add_argument("--dry_run", action="store_true", help="print the plan and commands only")
    p.add_argument("--only", default=None, help="run only runs whose name contains this")
    p.add_argument("--train_script", default=TRAIN_SCRIPT, help="the training script")
    p.add_argument(
        "--grace_s", type=float, default=60.0, help="on Ctrl-C, wait this long for checkpoints"
    )
    p.add_argument(
        "--devices",
        type=int,
        default=0,
        help="XLA CPU devices per run (0: the host's cores divided among the workers)",
    )
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers={args.workers}; allowed: >= 1")
    if args.grace_s < 0:
        p.error(f"--grace_s={args.grace_s}; allowed: >= 0")
    if args.devices < 0:
        p.error(f"--devices={args.devices}; allowed: >= 0 (0 = cores // workers)")
    if not os.path.isfile(args.train_script):
        p.error(f"--train_script={args.train_script!r} does not exist; allowed: a file")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out={args.out!r} is a file; allowed: a directory (new or a sweep's)")
    return args


def _display_path(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def plan(study: sweep_lib.Study, out: str, train_script: str) -> list[Job]:
    """Resolves every run of the study and checks it before anything runs.

    Each run's overrides are checked (key and type, `sweep.resolve`) and so are the values of
    its config, as train.py checks them at start-up (`sweep.check_config`; the checks that
    need the devices are left to the run).

    Raises:
      ValueError: "run NAME: problem" for the first run that train.py would refuse.
    """
    jobs = []
    for run in study.runs:
        overrides = {**run.overrides, **WORKER_OVERRIDES}
        try:
            config = sweep_lib.resolve(run.config, overrides)
            sweep_lib.check_config(config)
        except (ValueError, KeyError) as e:  # what train.py refuses with exit status 2
            raise ValueError(f"run {run.name}: {e}") from None
        workdir = os.path.join(out, run.dirname)
        argv = [
            sys.executable,
            _display_path(train_script),
            f"--config={run.config}",
            f"--workdir={workdir}",
            *sweep_lib.override_args(overrides),
        ]
        jobs.append(Job(run, workdir, config, argv))
    return jobs


def changed_configs(jobs: list[Job]) -> list[str]:
    """Runs whose stored config.json differs from the study's config now.

    A key the stored config lacks is no difference when the study gives it the base config's
    default (`configs/base.py`): a key added to the project after the run started defaults to
    the behaviour the run had.
    """
    defaults = sweep_lib.flatten(base_config.get_config().to_dict())
    errors = []
    for job in jobs:
        path = os.path.join(job.workdir, results.CONFIG_NAME)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            stored = json.load(f)
        now = json.loads(sweep_lib.config_json(job.config))
        kept = sweep_lib.flatten(stored)
        added = [
            k
            for k, v in sweep_lib.flatten(now).items()
            if k not in kept and k in defaults and sweep_lib.same_value(v, defaults[k])
        ]
        diff = sweep_lib.config_diff(stored, now, ignore=added)
        if diff:
            errors.append(f"{job.run.name}: {'; '.join(diff[:5])}")
    return errors


def worker_env(environ: dict[str, str], devices: int) -> dict[str, str]:
    """`environ` with XLA_FLAGS giving `devices` host devices, unbuffered Python output, and
    MALLOC_TUNABLES as GLIBC_TUNABLES unless `environ` sets that."""
    flags = re.sub(rf"{DEVICE_FLAG}=\S*", "", environ.get("XLA_FLAGS", "")).split()
    env = dict(environ)
    env["XLA_FLAGS"] = " ".join(flags + [f"{DEVICE_FLAG}={devices}"])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return env


def write_plan(out: str, study: sweep_lib.Study, jobs: list[Job]) -> None:
    """Writes `<out>/sweep.json`: every run's directory, variant, environment and seed.

    A study run in batches (`--only`, or an environment subset chosen by the study) keeps one
    plan: the runs of an earlier plan of the same study whose directories exist and that this
    batch does not name come first, then this batch's runs. A plan of another study is
    replaced.
    """
    entries = [
        {
            "name": j.run.name,
            "dir": j.run.dirname,
            "config": j.run.config,
            "overrides": dict(j.run.overrides),
            "variant": list(j.run.variant),
            "env": j.env,
            "seed": j.run.seed,
        }
        for j in jobs
    ]
    path = os.path.join(out, results.PLAN_NAME)
    earlier = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("study") == study.name:
            named = {e["dir"] for e in entries}
            earlier = [
                e
                for e in old.get("runs", [])
                if e["dir"] not in named and os.path.isdir(os.path.join(out, e["dir"]))
            ]
    os.makedirs(out, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"study": study.name, "path": study.path, "runs": earlier + entries}, f, indent=2)
    os.replace(tmp, path)


def _command_text(job: Job, env: dict[str, str]) -> str:
    return (
        f"# cwd: {os.getcwd()}\nXLA_FLAGS={shlex.quote(env['XLA_FLAGS'])} {shlex.join(job.argv)}\n"
    )


def launch(job: Job, env: dict[str, str]) -> tuple[subprocess.Popen, object]:
    """Writes config.json and command.txt, then starts the run with output to log.txt."""
    os.makedirs(job.workdir, exist_ok=True)
    with open(os.path.join(job.workdir, results.CONFIG_NAME), "w") as f:
        f.write(sweep_lib.config_json(job.config) + "\n")
    with open(os.path.join(job.workdir, results.COMMAND_NAME), "w") as f:
        f.write(_command_text(job, env))
    log = open(os.path.join(job.workdir, results.LOG_NAME), "a")
    log.write(f"=== {_now()} start: {shlex.join(job.argv)}\n")
    log.flush()
    # Own session: a terminal's Ctrl-C reaches only this runner, which stops workers itself.
    proc = subprocess.Popen(
        job.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    return proc, log


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def outcome(job: Job, returncode: int) -> str | None:
    """None if the run is now complete, else why not."""
    if returncode == 0 and results.is_complete(job.workdir):
        return None
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    if returncode > 0:
        return f"exit code {returncode}"
    return "exited 0 but summary.json does not say finished"


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    except OSError:
        return ""
    lines = [line for line in lines if not line.startswith("===")]
    return lines[-1] if lines else ""


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(active: dict, grace_s: float) -> None:
    """SIGTERM to every worker (train.py checkpoints and exits), SIGKILL after `grace_s`."""
    for proc in active:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        while any(p.poll() is None for p in active) and time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("Second interrupt: killing the workers.", file=sys.stderr)
    for proc in active:
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
        proc.wait()
    for _, log in active.values():
        log.write(f"=== {_now()} stopped by the sweep runner\n")
        log.close()


def execute(
    jobs: list[Job], workers: int, env: dict[str, str], grace_s: float, skipped: int
) -> tuple[list[Job], list[tuple[Job, str]], list[Job]]:
    """Runs `jobs`, `workers` at a time.

    Returns:
      (completed, failed with reasons, interrupted); interrupted is non-empty after Ctrl-C.
    """
    pending, active = list(jobs), {}
    completed, failed = [], []
    bar = tqdm.tqdm(total=len(jobs) + skipped, initial=skipped, unit="run", dynamic_ncols=True)
    try:
        while pending or active:
            while pending and len(active) < workers:
                job = pending.pop(0)
                proc, log = launch(job, env)
                active[proc] = (job, log)
                bar.set_postfix(running=len(active), failed=len(failed))
            time.sleep(0.2)
            for proc in [p for p in active if p.poll() is not None]:
                job, log = active.pop(proc)
                reason = outcome(job, proc.returncode)
                log.write(f"=== {_now()} exit code {proc.returncode}\n")
                log.close()
                if reason is None:
                    completed.append(job)
                else:
                    failed.append((job, reason))
                    bar.write(f"FAILED {job.run.name}: {reason}")
                bar.update(1)
    except KeyboardInterrupt:
        bar.write(f"Interrupted: stopping {len(active)} worker(s) (up to {grace_s:.0f}s).")
        stop(active, grace_s)
        return completed, failed, [job for job, _ in active.values()] + pending
    finally:
        bar.close()
    return completed, failed, []


_MARKS = {"complete": "done (skip)", "incomplete": "resume", "missing": "new"}


def print_plan(jobs: list[Job], selected: list[Job], status: dict, dry_run: bool) -> None:
    width = max(len(j.run.name) for j in jobs)
    for job in jobs:
        mark = _MARKS[status[job.run.name]] if job in selected else "not selected"
        print(f"  {mark:<12} {job.run.name:<{width}}  [{job.env}]")
        if dry_run and job in selected:
            print(f"      {shlex.join(job.argv)}")


def _raise_interrupt(*_):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        study = sweep_lib.load_study(args.study)
        out = args.out or os.path.join("runs", "sweeps", study.name)
        jobs = plan(study, out, args.train_script)
    except ValueError as e:  # a bad study file or run (`load_study`, `plan`)
        print(f"error: {config_utils.one_line(str(e))}", file=sys.stderr)
        return 2
    selected = [j for j in jobs if args.only is None or args.only in j.run.name]
    if not selected:
        names = ", ".join(j.run.name for j in jobs[:5])
        print(f"error: --only={args.only!r} matches no run; runs: {names}, ...", file=sys.stderr)
        return 2
    changed = changed_configs(jobs)
    if changed:
        print(
            f"error: --out={out!r}: these runs were started with a different config (delete "
            "their directories or pick another --out): " + " | ".join(changed),
            file=sys.stderr,
        )
        return 2
    cores = os.cpu_count() or 1
    devices = args.devices or max(1, cores // args.workers)
    status = {j.run.name: results.run_status(j.workdir)[0] for j in jobs}
    print(f"Study {study.name} ({study.path}): {len(jobs)} runs -> {out}")
    print_plan(jobs, selected, status, args.dry_run)
    todo = [j for j in selected if status[j.run.name] != "complete"]
    skipped = len(selected) - len(todo)
    print(
        f"{len(todo)} to run ({sum(status[j.run.name] == 'incomplete' for j in todo)} resumed), "
        f"{skipped} complete; {args.workers} worker(s), {devices} XLA CPU device(s) each "
        f"({cores} cores)"
    )
    if args.dry_run:
        return 0
    write_plan(out, study, jobs)
    # The runner starts no JAX backend here (devices=False): the workers own the devices.
    provenance.write(
        out,
        argv=None if argv is None else ["scripts/sweep.py", *argv],
        devices=False,
        extra={"sweep": {"study": study.name, "path": study.path, "runs": len(jobs)}},
    )
    env = worker_env(dict(os.environ), devices)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        completed, failed, interrupted = execute(todo, args.workers, env, args.grace_s, skipped)
    finally:
        signal.signal(signal.SIGTERM, old)
    print(
        f"\nSweep {study.name}: {len(completed)} done, {skipped} skipped (already complete), "
        f"{len(failed)} failed, {len(interrupted)} interrupted or not started."
    )
    for job, reason in failed:
        log = os.path.join(job.workdir, results.LOG_NAME)
        print(f"  FAILED {job.run.name}: {reason}; log: {log}")
        last = _last_line(log)
        if last:
            print(f"      {last}")
    if interrupted:
        print("Interrupted; rerun the same command to continue.")
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    # The runner plans and launches; the little JAX work of planning (an environment's tables)
    # stays on the host CPU, so that the runner holds no accelerator memory the workers need.
    import jax

    jax.config.update("jax_platforms", "cpu")
    sys.exit(main())
