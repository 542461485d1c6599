"""Zero-shot evaluation of a pretrained Hugging Face model on the environments.

  python scripts/zero_shot.py --model=DIR --out=experiments/results/real_model --num_tasks=128
  python scripts/zero_shot.py --model=DIR --out=OUT --num_tasks=2 --envs=frozen_lake,countdown

`--model` is a local checkpoint folder (docs/real_model.md: `scripts/get_model.py` writes one).
Each environment runs with the settings of its own config, `configs/<env>.py` (environment
fields, turns, action budget), and with `model.checkpoint=--model`: the checkpoint's tokenizer
and chat template frame the episodes, its weights are the policy (`Experiment.pretrained_params`)
and nothing is trained. `loop.evaluate`, the evaluation of training runs, plays the same
`--num_tasks` tasks of the test split (`train.eval_seed`) once with greedy and once with sampled
decoding (temperature `rollout.temperature`).

A real model writes longer replies than an environment's shortest action words, so the action
budget is `--max_action_len` tokens (at least the environment's longest action and its config's
budget); `--max_turns_cap` caps the turns of the long environments (maze, two_agent, household).
The training batch, which nothing here uses, is made as small as the start-up checks allow.
Each episode opens with a system message (`model.system_prompt`): by default
(`--system_prompt=auto`) the environment's instruction, `rl4agents.envs.instructions`, which
names the task, the observation's symbols and the exact actions; an explicit text replaces it
and `--system_prompt=''` leaves none.

Writes to --out:
  zero_shot.csv  env,greedy_success,sampled_success,greedy_invalid_rate,sampled_invalid_rate,
                 greedy_avg_turns,sampled_avg_turns,num_tasks,seconds: success rates, the share
                 of turns whose action was invalid, the mean turns per episode, and the wall
                 seconds of the environment (build, load, compile, both evaluations);
  zero_shot.md   the same as Markdown;
  command.txt    each invocation's command line, appended.
An environment already in zero_shot.csv is skipped, so an interrupted evaluation resumes.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import ml_collections  # noqa: E402

from configs import base_policy  # noqa: E402
from rl4agents import config_utils  # noqa: E402
from rl4agents.train import experiment, loop, resolve, writers  # noqa: E402

# The base policy's ten environments, then guess_number: the short-context task for RL of a
# pretrained model (configs/guess_number.py).
ENVS = (*base_policy.ENVS, "guess_number")
SPLIT = "test"
AUTO = resolve.AUTO_PROMPT  # --system_prompt: the environment's instruction
CSV_NAME, MD_NAME = "zero_shot.csv", "zero_shot.md"
COLUMNS = (
    "env",
    "greedy_success",
    "sampled_success",
    "greedy_invalid_rate",
    "sampled_invalid_rate",
    "greedy_avg_turns",
    "sampled_avg_turns",
    "num_tasks",
    "seconds",
)
# CSV column -> key of `loop.evaluate` ("turns": mean turns per episode, `step.rollout_metrics`).
METRICS = {
    "greedy_success": "greedy_success",
    "sampled_success": "sampled_success",
    "greedy_invalid_rate": "greedy_invalid_rate",
    "sampled_invalid_rate": "sampled_invalid_rate",
    "greedy_avg_turns": "greedy_turns",
    "sampled_avg_turns": "sampled_turns",
}


def data_size(num_tasks: int, num_devices: int) -> int:
    """Devices on the mesh's data axis: the most that split `num_tasks` evenly (their gcd)."""
    return math.gcd(num_tasks, num_devices)


def env_config(
    env: str,
    model: str,
    num_tasks: int,
    *,
    max_action_len: int = 16,
    max_turns_cap: int = 0,
    system_prompt: str = AUTO,
    dtype: str = "float32",
    num_devices: int | None = None,
) -> ml_collections.ConfigDict:
    """The config of `configs/<env>.py` evaluated with the checkpoint folder `model`.

    Args:
      env: one of `ENVS`.
      model: a local Hugging Face checkpoint folder with its tokenizer.
      num_tasks: evaluation tasks; the mesh's data axis takes `data_size(num_tasks, devices)`.
      max_action_len: action tokens per turn; raised to the environment's longest action under
        the checkpoint's tokenizer and to the config's own budget when either is larger.
      max_turns_cap: at most this many turns (0 = the config's `rollout.max_turns`).
      system_prompt: `model.system_prompt`: "auto" the environment's instruction
        (`instructions.get` with the config's environment settings), "" none, else the text.
      dtype: `model.dtype`, "float32" or "bfloat16".
      num_devices: devices to use (None = all of `jax.devices()`).

    Raises:
      ValueError: an unknown environment, or a value the run's checks refuse (naming it).
    """
    config_utils.check_choice("--envs", env, ENVS)
    if max_action_len < 1:
        raise ValueError(f"--max_action_len={max_action_len}; allowed: >= 1")
    if max_turns_cap < 0:
        raise ValueError(f"--max_turns_cap={max_turns_cap}; allowed: >= 1, or 0 (no cap)")
    c = importlib.import_module(f"configs.{env}").get_config()
    c.unlock()
    c.model.checkpoint = os.fspath(model)
    c.env.vocab = "builtin"  # the checkpoint's tokenizer (resolve.make_env)
    c.model.system_prompt = system_prompt
    c.model.system_prompt = resolve.system_prompt(c)  # "auto": the instruction's text
    c.model.dtype = dtype
    if max_turns_cap:
        c.rollout.max_turns = min(c.rollout.max_turns, max_turns_cap)
    longest = resolve.make_env(c).max_action_len
    c.rollout.max_action_len = max(max_action_len, longest, c.rollout.max_action_len)
    data = data_size(num_tasks, num_devices or len(jax.devices()))
    c.mesh.shape = (data, 1, 1)
    # No training: the smallest batch the checks accept (groups of 2 for group estimators).
    c.rollout.num_tasks, c.rollout.group_size = data, 2
    c.train.minibatches, c.train.grad_accum = 1, 1
    # Nothing is trained, but the start-up memory check sizes the update too: with remat its
    # activations are one layer's, so the check measures what the evaluation needs.
    c.model.remat = True
    c.train.eval_tasks = num_tasks
    c.lock()
    return c


def evaluate_env(config: ml_collections.ConfigDict, num_tasks: int) -> dict:
    """One row of zero_shot.csv: the checkpoint's greedy and sampled results on `num_tasks`
    test tasks (`loop.evaluate`) and the wall seconds of it all."""
    start = time.perf_counter()
    exp = experiment.build(config)
    try:
        params = exp.pretrained_params()
        ev = loop.evaluate(exp, params, SPLIT, num_tasks)
    finally:
        exp.close()
    row = {"env": config.env.name, **{col: ev[key] for col, key in METRICS.items()}}
    return {**row, "num_tasks": num_tasks, "seconds": round(time.perf_counter() - start, 1)}


def read_rows(path: str) -> list[dict]:
    """The rows of a zero_shot.csv ([] when there is none), numbers as floats, num_tasks int."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for col in COLUMNS[1:]:
            row[col] = int(row[col]) if col == "num_tasks" else float(row[col])
    return rows


def write_rows(out: str, rows: list[dict]) -> None:
    """zero_shot.csv and zero_shot.md of `rows`, in `ENVS` order (each replaced whole)."""
    rows = sorted(rows, key=lambda r: ENVS.index(r["env"]))
    writers.write_csv(os.path.join(out, CSV_NAME), rows, list(COLUMNS))
    writers.write_text(os.path.join(out, MD_NAME), writers.format_table(rows, list(COLUMNS)) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Local Hugging Face checkpoint folder.")
    ap.add_argument("--out", required=True, help="Folder of zero_shot.csv/.md, command.txt.")
    ap.add_argument("--num_tasks", type=int, default=128, help="Test tasks per environment.")
    ap.add_argument("--envs", default="", help=f"Comma-separated subset of {list(ENVS)}.")
    ap.add_argument("--max_turns_cap", type=int, default=0, help="Cap on turns (0 = none).")
    ap.add_argument("--max_action_len", type=int, default=16, help="Action tokens per turn.")
    ap.add_argument(
        "--system_prompt",
        default=AUTO,
        help="System message: 'auto' the environment's instruction, '' none, else the text.",
    )
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.num_tasks < 1:
        print(f"zero_shot: --num_tasks={args.num_tasks}; allowed: >= 1", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"zero_shot: --model={args.model!r} holds no config.json", file=sys.stderr)
        return 2
    envs = [e for e in args.envs.split(",") if e] or list(ENVS)
    bad = [e for e in envs if e not in ENVS]
    if bad:
        print(f"zero_shot: --envs names {bad}; allowed: {list(ENVS)}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    writers.append_command(args.out, "scripts/zero_shot.py", argv, env=("XLA_FLAGS",))
    rows = read_rows(os.path.join(args.out, CSV_NAME))
    done = {r["env"]: r for r in rows}
    for i, env in enumerate(envs, 1):
        tag = f"[{i}/{len(envs)}] {env}"
        if env in done:
            print(f"{tag}: skipped, in {CSV_NAME} ({done[env]['num_tasks']} tasks)", flush=True)
            continue
        print(f"{tag}: evaluating {args.num_tasks} {SPLIT} tasks", flush=True)
        try:
            config = env_config(
                env,
                args.model,
                args.num_tasks,
                max_action_len=args.max_action_len,
                max_turns_cap=args.max_turns_cap,
                system_prompt=args.system_prompt,
                dtype=args.dtype,
            )
            row = evaluate_env(config, args.num_tasks)
        except ValueError as e:
            print(f"zero_shot: {env}: {e}", file=sys.stderr)
            return 2
        rows.append(row)
        write_rows(args.out, rows)
        print(
            f"{tag}: success greedy {row['greedy_success']:.3f} sampled "
            f"{row['sampled_success']:.3f}, invalid greedy {row['greedy_invalid_rate']:.3f} "
            f"sampled {row['sampled_invalid_rate']:.3f}, turns greedy "
            f"{row['greedy_avg_turns']:.2f} sampled {row['sampled_avg_turns']:.2f} "
            f"({row['seconds']:.1f} s, max_turns {config.rollout.max_turns}, max_action_len "
            f"{config.rollout.max_action_len})",
            flush=True,
        )
    jax.effects_barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
