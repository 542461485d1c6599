"""Run scripts/train.py as 2 local processes x 4 CPU devices and save their output.

  python scripts/multihost_demo.py --out=experiments/results/scale/multihost_log.txt

Each process is started as it would be on two hosts (docs/multihost.md), with the coordinator
on localhost and `JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4`; JAX's
CPU backend runs the cross-process collectives with gloo. The log holds both commands, their
output (process 1 prints nothing of its own: logging, evaluation lines and the summary come
from process 0), and what the shared workdir holds afterwards. Paths inside the workdir are
written relative to it (`<workdir>/curves.png`), so the log does not depend on where it ran.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from rl4agents import config_utils  # noqa: E402  (the one-line refusal of bad arguments)

OVERRIDES = (
    "--config.model.preset=tiny",
    "--config.rollout.num_tasks=8",
    "--config.rollout.group_size=2",
    "--config.train.num_steps=4",
    "--config.train.eval_every=2",
    "--config.train.eval_tasks=16",
    "--config.checkpoint.every=2",
    "--config.log.progress=False",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(workdir: str, num_processes: int, local_devices: int, config: str):
    """Starts `num_processes` copies of scripts/train.py; returns (processes, command lines)."""
    flags = f"--xla_force_host_platform_device_count={local_devices}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    port = _free_port()
    procs, commands = [], []
    for i in range(num_processes):
        cmd = [
            sys.executable,
            "scripts/train.py",
            f"--config={config}",
            f"--workdir={workdir}",
            f"--config.distributed.coordinator=localhost:{port}",
            f"--config.distributed.num_processes={num_processes}",
            f"--config.distributed.process_id={i}",
            *OVERRIDES,
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
        commands.append(f"JAX_PLATFORMS=cpu XLA_FLAGS={flags} python " + " ".join(cmd[1:]))
    return procs, commands


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="experiments/results/scale/multihost_log.txt")
    parser.add_argument("--workdir", default="", help="run directory (default: a temp dir)")
    parser.add_argument("--config", default="configs/frozen_lake.py")
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--local_devices", type=int, default=4)
    args = parser.parse_args()
    for name in ("num_processes", "local_devices"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)}; allowed: >= 1")
    if not os.path.isfile(os.path.join(REPO, args.config.partition(":")[0])):
        parser.error(f"--config={args.config!r}: no such file; allowed: a config file[:arg]")
    if args.workdir and os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
        parser.error(f"--workdir={args.workdir!r} is a file; allowed: a directory")
    config_utils.check_output_file("--out", args.out)
    # Absolute, so that the log can name every path in it relative to the workdir.
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="multihost_demo_"))
    t0 = time.perf_counter()
    procs, commands = launch(workdir, args.num_processes, args.local_devices, args.config)
    outputs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0

    def shown(text: str) -> str:
        return text.replace(workdir, "<workdir>")

    parts = [
        f"# {args.num_processes} processes x {args.local_devices} CPU devices running "
        "scripts/train.py",
        "# command: python scripts/multihost_demo.py " + shown(" ".join(sys.argv[1:])),
        f"# wall time: {wall:.0f} s",
    ]
    for i, (cmd, out, p) in enumerate(zip(commands, outputs, procs, strict=True)):
        lines = out.splitlines()
        kept = [line for line in lines if "[Gloo]" not in line]
        parts += ["", f"## process {i}: exit code {p.returncode}", f"$ {shown(cmd)}"]
        parts += [shown(line) for line in kept]
        parts.append(f"({len(lines) - len(kept)} '[Gloo] ... connected to N peer ranks' lines)")
    parts += ["", "## <workdir> afterwards"]
    for name in sorted(os.listdir(workdir)):
        path = os.path.join(workdir, name)
        if name == "metrics.jsonl":
            with open(path) as f:
                rows = f.read().splitlines()
            parts.append(f"{name}: {len(rows)} rows (one per logged step and prefix)")
            parts += [f"  {row}" for row in rows]
        elif name == "checkpoints":
            parts.append(f"{name}/: {sorted(os.listdir(path))}")
        else:
            parts.append(name)
    text = "\n".join(parts) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    sys.exit(max(p.returncode for p in procs))


if __name__ == "__main__":
    main()
