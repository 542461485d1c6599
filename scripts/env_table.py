"""The environment suite at a glance: baselines, oracle, speed, and SFT-then-GRPO results.

  python scripts/env_table.py --train --out=experiments/results/envs      # everything
  python scripts/env_table.py --out=experiments/results/envs             # no training

For every environment with a config (configs/<env>.py), on held-out test tasks and the OOD
split: the success of a uniformly random valid policy, of the degenerate probes (junk every
turn, the best single action repeated every turn), and of the oracle run closed-loop; env steps
per second (jitted, vmapped, 1024 episodes of random valid actions, this machine); and with
`--train`, success after a short `scripts/sft.py` warm start on oracle demonstrations and after
GRPO from it (`scripts/train.py --config.init.params=...`, fine-tuning settings: learning rate
--rl_lr, entropy bonus --rl_entropy), run in runs/envs/<env>/ (finished runs are reused).
Writes table.md, table.csv and examples.md (one oracle episode per environment, as the policy
reads it) to --out.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
from absl import app, flags  # noqa: E402

from rl4agents import config_utils  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS = (  # cheapest first (training cost grows with the context length T)
    "frozen_lake",
    "maze",
    "wordle",
    "countdown",
    "sokoban",
    "search_qa",
    "two_agent",
    "web_shop",
    "terminal",
    "household",
)

_OUT = flags.DEFINE_string("out", "experiments/results/envs", "Output directory.")
_ENVS = flags.DEFINE_list("envs", ",".join(ENVS), "Environments (each needs configs/<env>.py).")
_TASKS = flags.DEFINE_integer("tasks", 256, "Held-out tasks per split for baselines and oracle.")
_TRAIN = flags.DEFINE_bool("train", False, "Also run SFT then GRPO per environment.")
_REUSE_ONLY = flags.DEFINE_bool(
    "reuse_only", False, "--train: report finished runs only; start none (others: 'not run')."
)
_TRAIN_ENVS = flags.DEFINE_list(
    "train_envs", [], "--train: start new runs only for these (others as --reuse_only)."
)
_RUNS = flags.DEFINE_string("runs", "runs/envs", "Where --train keeps its runs.")
_SFT_STEPS = flags.DEFINE_integer("sft_steps", 200, "SFT steps per environment.")
_RL_STEPS = flags.DEFINE_integer("rl_steps", 40, "GRPO steps after SFT per environment.")
_RL_MINUTES = flags.DEFINE_float("rl_minutes", 6.0, "Wall-time cap of each GRPO run.")
_RL_LR = flags.DEFINE_float("rl_lr", 2e-4, "GRPO learning rate after SFT (fine-tuning).")
_RL_ENTROPY = flags.DEFINE_float("rl_entropy", 0.0, "GRPO entropy bonus after SFT.")
_EVAL_TASKS = flags.DEFINE_integer("eval_tasks", 64, "--train: held-out tasks per evaluation.")
_SFT_FLAGS = flags.DEFINE_list(
    "sft_flags", [], "--train: extra config overrides for SFT, e.g. config.sft.batch_size=8."
)
_RL_FLAGS = flags.DEFINE_list(
    "rl_flags", [], "--train: extra config overrides for GRPO, e.g. config.rollout.num_tasks=4."
)


def _config(name: str):
    module = importlib.import_module(f"configs.{name}")
    return module.get_config()


def _train(name: str) -> dict | None:
    """SFT then GRPO for `name` in runs/envs/<name>/ (reused when finished).

    With --reuse_only, None unless both runs have finished.
    """
    base = os.path.join(ROOT, _RUNS.value, name)
    if _REUSE_ONLY.value or (_TRAIN_ENVS.value and name not in _TRAIN_ENVS.value):
        try:
            rl = json.load(open(os.path.join(base, "rl", "summary.json")))
            sft = json.load(open(os.path.join(base, "sft", "summary.json")))
        except FileNotFoundError:
            return None
        return {"sft": sft, "rl": rl} if rl.get("finished") else None
    cfg = f"--config={os.path.join(ROOT, 'configs', name + '.py')}"
    sft_dir, rl_dir = os.path.join(base, "sft"), os.path.join(base, "rl")
    py = sys.executable
    if not os.path.exists(os.path.join(sft_dir, "summary.json")):
        subprocess.run(
            [py, "scripts/sft.py", cfg, f"--workdir={sft_dir}",
             f"--config.sft.steps={_SFT_STEPS.value}", "--config.log.progress=False",
             f"--config.train.eval_tasks={_EVAL_TASKS.value}"]
            + [f"--{f}" for f in _SFT_FLAGS.value],
            cwd=ROOT, check=True,
        )  # fmt: skip
    rl_summary = os.path.join(rl_dir, "summary.json")
    done = os.path.exists(rl_summary) and json.load(open(rl_summary)).get("finished")
    if not done:
        subprocess.run(
            [py, "scripts/train.py", cfg, f"--workdir={rl_dir}",
             f"--config.init.params={sft_dir}", f"--config.train.num_steps={_RL_STEPS.value}",
             f"--config.train.max_minutes={_RL_MINUTES.value}",
             f"--config.train.eval_every={_RL_STEPS.value}", "--config.log.progress=False",
             f"--config.optim.lr={_RL_LR.value}", f"--config.loss.entropy_coef={_RL_ENTROPY.value}",
             f"--config.train.eval_tasks={_EVAL_TASKS.value}"]
            + [f"--{f}" for f in _RL_FLAGS.value],
            cwd=ROOT, check=True,
        )  # fmt: skip
    return {
        "sft": json.load(open(os.path.join(sft_dir, "summary.json"))),
        "rl": json.load(open(rl_summary)),
    }


def _transcript(env, demos, lay) -> str:
    """One demonstrated episode as the policy reads it: observations, then `> action`."""
    tok = env.tokenizer
    tokens, valid, act = demos.tokens[0], demos.valid_mask[0], demos.action_mask[0]
    out = [tok.decode(tokens[1 : lay.prompt][valid[1 : lay.prompt]])]
    blk = lay.action + lay.obs
    for k in range(int(demos.num_turns[0])):
        s = lay.prompt + k * blk
        a = tokens[s : s + lay.action][act[s : s + lay.action]]
        a = [t for t in a if t != tok.eoa_id]
        o = tokens[s + lay.action : s + blk][valid[s + lay.action : s + blk]]
        out.append(f"> {tok.decode(a)}")
        out.append(tok.decode(o))
    return "\n".join(line.rstrip() for line in "\n".join(out).split("\n"))


def _measure(name: str, num_tasks: int) -> tuple[dict, str]:
    import dataclasses

    import jax
    import numpy as np

    from rl4agents.envs import probes
    from rl4agents.rollout import rollout as rollout_lib
    from rl4agents.train import experiment, sft

    config = _config(name)
    exp = experiment.build(config)
    row = {"env": name}
    key = jax.random.key(2026)
    for split in ("test", "ood"):
        env, params = exp.env.make_split(split)
        turns = config.train.ood_max_turns if split == "ood" else 0
        turns = turns or config.rollout.max_turns
        rep = probes.probe_report(env, params, num_tasks, turns, jax.random.fold_in(key, 1))
        row[f"{split}_random"] = rep["random"]["success"]
        if split == "test":
            row["invalid_probe"] = rep["invalid"]["success"]
            row["constant_probe"] = rep["constant"]["success"]
            row["constant_action"] = rep["constant"]["best_action"]
        rc = dataclasses.replace(exp.step_cfg.rollout, max_turns=turns)
        lay = rollout_lib.make_layout(env, rc)
        task_keys = jax.random.split(jax.random.fold_in(key, 2), num_tasks)
        t0 = time.perf_counter()
        demos = sft.collect_demos(env, params, task_keys, lay, jax.random.fold_in(key, 3))
        row[f"{split}_oracle"] = float(np.mean(demos.success))
        if split == "test":
            row["oracle_turns"] = float(np.mean(demos.num_turns))
            row["oracle_s"] = time.perf_counter() - t0
            example = _transcript(env, demos, lay)
    row["steps_per_s"] = probes.steps_per_second(exp.env, exp.env.default_params("train"))
    return row, example


def _check_flags(argv: list[str]) -> None:
    """Every flag's value, before anything runs or is written."""
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    for name in _ENVS.value:
        if not os.path.isfile(os.path.join(ROOT, "configs", name + ".py")):
            config_utils.fail(f"--envs={name!r} has no configs/{name}.py; allowed: {list(ENVS)}")
    if not _ENVS.value:
        config_utils.fail(f"--envs is empty; allowed: some of {list(ENVS)}")
    for name in _TRAIN_ENVS.value:
        if name not in _ENVS.value:
            config_utils.fail(f"--train_envs={name!r} is not in --envs; allowed: {_ENVS.value}")
    for flag in (_TASKS, _SFT_STEPS, _RL_STEPS, _EVAL_TASKS):
        if flag.value < 1:
            config_utils.fail(f"--{flag.name}={flag.value}; allowed: >= 1")
    if not _RL_LR.value > 0:
        config_utils.fail(f"--rl_lr={_RL_LR.value}; allowed: > 0")
    for flag in (_RL_MINUTES, _RL_ENTROPY):
        if flag.value < 0:
            config_utils.fail(f"--{flag.name}={flag.value}; allowed: >= 0")
    for flag in (_SFT_FLAGS, _RL_FLAGS):
        for f in flag.value:
            if not (f.startswith("config.") and "=" in f):
                config_utils.fail(
                    f"--{flag.name}={f!r}; allowed: config.KEY=VALUE, comma separated"
                )
    for flag, path in ((_OUT, _OUT.value), (_RUNS, os.path.join(ROOT, _RUNS.value))):
        if os.path.exists(path) and not os.path.isdir(path):
            config_utils.fail(
                f"--{flag.name}={flag.value!r} is a file; allowed: a directory (new or existing)"
            )


def main(argv):
    _check_flags(argv)
    os.makedirs(_OUT.value, exist_ok=True)
    rows, examples = [], []
    for name in _ENVS.value:
        print(f"== {name}", flush=True)
        row, example = _measure(name, _TASKS.value)
        if _TRAIN.value:
            res = _train(name)
            if res is None:
                row["grpo_steps"] = "not run"
                rows.append(row)
                examples.append((name, example))
                continue
            for split in ("test", "ood"):
                row[f"{split}_sft"] = res["sft"][split]["greedy_success"]
                row[f"{split}_sft_grpo"] = res["rl"][f"eval_{split}"]["greedy_success"]
            row["grpo_steps"] = res["rl"]["steps"]
        rows.append(row)
        examples.append((name, example))
        print(json.dumps(row), flush=True)
    cols = [
        ("env", "environment"),
        ("test_random", "random (test)"),
        ("constant_probe", "best constant action (test)"),
        ("invalid_probe", "junk actions (test)"),
        ("test_oracle", "oracle (test)"),
        ("ood_random", "random (OOD)"),
        ("ood_oracle", "oracle (OOD)"),
    ]
    if _TRAIN.value:
        cols += [
            ("test_sft", "SFT (test)"),
            ("test_sft_grpo", "SFT+GRPO (test)"),
            ("ood_sft", "SFT (OOD)"),
            ("ood_sft_grpo", "SFT+GRPO (OOD)"),
            ("grpo_steps", "GRPO steps"),
        ]
    cols += [("steps_per_s", "env steps/s"), ("oracle_turns", "oracle turns")]

    def cell(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if v >= 100 else f"{v:.3f}"
        return str(v)

    lines = [
        "| " + " | ".join(h for _, h in cols) + " |",
        "|" + "|".join("---" if k == "env" else "---:" for k, _ in cols) + "|",
    ]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k, _ in cols) + " |" for r in rows]
    table = "\n".join(lines)
    with open(os.path.join(_OUT.value, "table.md"), "w") as f:
        f.write(
            f"Greedy success rates on {_TASKS.value} held-out tasks per split; the best "
            "constant action is the best of up to 64 actions each repeated every turn.\n\n"
        )
        f.write(table + "\n")
    keys = sorted({k for r in rows for k in r}, key=lambda k: [c for c, _ in cols].index(k)
                  if k in [c for c, _ in cols] else 99)  # fmt: skip
    with open(os.path.join(_OUT.value, "table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(_OUT.value, "examples.md"), "w") as f:
        f.write("# One oracle episode per environment, as the policy reads it\n\n")
        f.write("Observations as the tokenizer decodes them; `> ` marks the agent's action.\n")
        for name, ex in examples:
            f.write(f"\n## {name}\n\n```\n{ex}\n```\n")
    print("\n" + table)


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_plain_flags)
