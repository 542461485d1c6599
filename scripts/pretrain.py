"""Pretrain the base policy: one decoder on imperfect demonstrations of every environment.

  python scripts/pretrain.py --config=configs/base_policy.py --workdir=runs/base_policy
  python scripts/train.py --config=configs/base_policy.py:maze --workdir=runs/maze_base \
      --config.init.params=runs/base_policy

The config (`configs/base_policy.py` without an argument) holds the model and the `pretrain`
section: `envs`, the noise levels `eps`, `demos_per_env`, `weights`, `steps`, `batch_size`,
`lr`, `warmup_steps`, `eval_tasks`, `eval_every`. Each environment's settings come from
`configs/base_policy.py:<env>`, with this run's `model` and `seed` (so a model override here
reaches every environment, and an RL run needs the same override). Writes `<workdir>/params/`
(`--config.init.params` accepts it for each environment of `pretrain.envs`), `corpus.json`,
`eval.json`, `metrics.jsonl`, `provenance.json` and `summary.json` (last), and prints the
held-out greedy and sampled success per environment (rl4agents/train/pretrain.py,
docs/base_policy.md). The workdir must be new, hold none of these, or hold this run's
`checkpoints/` (every `pretrain.checkpoint_every` steps).

  # resume a killed or time-cut run: the same command again
  python scripts/pretrain.py --config=configs/base_policy.py --workdir=runs/base_policy
  # continued pretraining: 500 more steps from a saved base, in a new workdir
  python scripts/pretrain.py --config=configs/base_policy.py --workdir=runs/base_policy_more \
      --config.pretrain.init=runs/base_policy --config.pretrain.steps=500
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
from absl import app, flags, logging  # noqa: E402

from rl4agents import config_utils  # noqa: E402

_CONFIG = config_utils.define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_PUBLISH = flags.DEFINE_string(
    "publish",
    None,
    "Instead of pretraining: write the finished run in --workdir to this results folder "
    "(table.md with --command, table.csv, summary, eval, corpus, provenance, metrics).",
)
_COMMAND = flags.DEFINE_string("command", "", "--publish: the command that made the run.")
flags.mark_flags_as_required(["config", "workdir"])

OUTPUTS = ("params", "corpus.json", "eval.json", "metrics.jsonl", "summary.json")


def env_configs(config) -> dict:
    """{env: configs/base_policy.py:<env>} for `pretrain.envs`, with this run's model, seed
    and `log.progress`."""
    from configs import base_policy
    from rl4agents.train import pretrain

    out = {}
    for name in pretrain.parse_envs(config.pretrain.envs, base_policy.ENVS):
        c = base_policy.env_config(name)
        c.unlock()
        c.model = config.model
        c.seed = config.seed
        c.pretrain = config.pretrain
        c.log.progress = False
        c.lock()
        out[name] = c
    return out


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    workdir = _WORKDIR.value
    if _PUBLISH.value:
        from rl4agents.train import pretrain

        try:
            pretrain.publish(workdir, _PUBLISH.value, _COMMAND.value)
        except FileNotFoundError as e:
            config_utils.fail(str(e))
        print(open(os.path.join(_PUBLISH.value, "table.md")).read())
        return
    config_utils.check_workdir("--workdir", workdir)
    from rl4agents import checkpoint
    from rl4agents.train import pretrain

    if os.path.isdir(workdir):
        found = [n for n in OUTPUTS if os.path.lexists(os.path.join(workdir, n))]
        resumable = checkpoint.saved_steps(os.path.join(workdir, pretrain.CHECKPOINT_DIR))
        if found and not resumable:
            config_utils.fail(
                f"--workdir={workdir!r} already holds {', '.join(found)} and no checkpoint; "
                "allowed: a new directory, one holding no pretraining output, or a run's "
                "workdir with its checkpoints/ (to resume it)"
            )
    from rl4agents import provenance
    from rl4agents.train import writers

    config = _CONFIG.value
    try:
        configs = env_configs(config)
        os.makedirs(workdir, exist_ok=True)
        provenance.write(workdir, config)
        summary = pretrain.run(config, configs, workdir, log=lambda s: print(s, flush=True))
    except (ValueError, KeyError, FileNotFoundError) as e:
        config_utils.fail(str(e))
    rows = [
        {"env": n, **{k: m[k] for k in ("greedy_success", "sampled_success", "seconds")}}
        for n, m in summary["test"].items()
    ]
    print(f"\nheld-out success on {summary['eval_tasks']} test tasks per environment:")
    print(writers.format_table(rows))
    print(
        f"{summary['num_params']:,} parameters; corpus {summary['collect_s']} s, training "
        f"{summary['train_s']} s, evaluation {summary['eval_s']} s"
    )
    print(f"parameters: {summary['params']}  (RL: --config.init.params={workdir})")
    if summary.get("cut"):
        print(f"cut: {summary['cut']} of {config.pretrain.steps}; rerun this command to continue")


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_flags)
