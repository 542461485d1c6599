"""Print a policy's episodes as text: the prompt, then per turn the action, whether it parsed,
the reward and the observation, then the outcome.

  # a saved base policy, in one environment of its corpus, greedy
  python scripts/show_episodes.py --config=configs/base_policy.py:wordle \
      --params=runs/base_policy_v3 --num=8 --greedy --out=wordle.txt
  # a trained run (its own config), sampled at temperature 0.7
  python scripts/show_episodes.py --workdir=runs/fl --num=4 --temperature=0.7
  # a pretrained chat model, zero-shot
  python scripts/show_episodes.py --config=configs/real_model.py:guess_number --greedy

The episodes are played by the rollout of training and evaluation (`rollout.rollout`, jitted,
one sample per task) on the tasks of an evaluation: the first `--num` of the task keys that
`Experiment.eval_fn` draws from `--seed` (default: the run's `train.eval_seed`), so greedy
episode i is task i of `scripts/eval.py`'s table. Tokens are decoded with the environment's
own tokenizer. The policy is `--params` (a scripts/pretrain.py or scripts/sft.py workdir, as
`--config.init.params` takes it; default: the config's `init.params`), a run's checkpoint
(`--workdir`, `--step`), or, with neither, the weights of the config's `model.checkpoint`
(a pretrained model, LoRA adapters at zero) or else its random initialisation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from configs import base  # noqa: E402
from rl4agents import checkpoint as checkpoint_lib  # noqa: E402
from rl4agents import config_utils, sharding  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402
from rl4agents.train import experiment  # noqa: E402

SPLITS = ("train", "test", "ood")
_CONFIG = config_utils.define_config_flag("Config file (FILE[:ARG]); not with --workdir.")
_PARAMS = flags.DEFINE_string(
    "params", "", "Saved policy parameters (a pretrain/sft workdir); default: init.params."
)
_WORKDIR = flags.DEFINE_string("workdir", "", "A scripts/train.py run: its config and checkpoint.")
_STEP = flags.DEFINE_integer("step", -1, "With --workdir: checkpoint step (-1 = latest).")
_SPLIT = flags.DEFINE_string("split", "test", f"Task split, one of {SPLITS}.")
_NUM = flags.DEFINE_integer("num", 4, "Episodes to show (the first tasks of the split).")
_GREEDY = flags.DEFINE_bool("greedy", False, "Greedy decoding (argmax) instead of sampling.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", None, "Sampling temperature (default: the config's rollout.temperature)."
)
_SEED = flags.DEFINE_integer("seed", -1, "Task and sampling seed (-1 = train.eval_seed).")
_OUT = flags.DEFINE_string("out", "", "Also write the text to this file.")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One decoded turn of an episode (host-side text)."""

    action: str  # the action's tokens without end-of-action, decoded
    ended: bool  # the policy emitted end-of-action (else the action budget cut it)
    valid: bool  # the environment parsed the action
    reward: float
    observation: str  # the environment's reply, decoded


@dataclasses.dataclass(frozen=True)
class Episode:
    """One decoded episode (host-side text)."""

    prompt: str
    turns: tuple[Turn, ...]
    success: bool
    reward: float  # sum of turn rewards
    done: bool  # ended by the environment (else cut at the turn or token limit)


def decode_episodes(traj, tokenizer, num: int | None = None) -> list[Episode]:
    """The first `num` (default: all) rows of a `Trajectory` as `Episode`s.

    Slots are read by their masks: the prompt is `obs_mask` with `turn_ids == -1` less its
    first slot (BOS); turn k's action is `action_mask` with `turn_ids == k` (its end-of-action
    token dropped), its observation `obs_mask` with `turn_ids == k`.

    Args:
      traj: a `Trajectory` of B rows (device or host arrays).
      tokenizer: the environment's tokenizer (`decode`, `eoa_id`).
      num: rows to decode.
    """
    t = jax.tree.map(np.asarray, jax.device_get(traj))
    rows = t.tokens.shape[0] if num is None else num
    out = []
    for b in range(rows):
        tok, valid, tid = t.tokens[b], t.valid_mask[b], t.turn_ids[b]
        prompt = valid & t.obs_mask[b] & (tid == -1)
        prompt[0] = False  # BOS
        turns = []
        for k in range(int(t.num_turns[b])):
            act = tok[valid & t.action_mask[b] & (tid == k)]
            obs = tok[valid & t.obs_mask[b] & (tid == k)]
            ended = act.size > 0 and int(act[-1]) == tokenizer.eoa_id
            turns.append(
                Turn(
                    action=tokenizer.decode(act[:-1] if ended else act),
                    ended=bool(ended),
                    valid=bool(t.turn_action_valid[b, k]),
                    reward=float(t.turn_rewards[b, k]),
                    observation=tokenizer.decode(obs),
                )
            )
        out.append(
            Episode(
                prompt=tokenizer.decode(tok[prompt]),
                turns=tuple(turns),
                success=bool(t.success[b]),
                reward=float(t.outcome_reward[b]),
                done=bool(t.done[b]),
            )
        )
    return out


def _indent(text: str, pad: str = "    ") -> str:
    """`text` with trailing blanks dropped and every line indented by `pad`."""
    return "\n".join(pad + line.rstrip() for line in text.rstrip().split("\n"))


def format_episode(ep: Episode, title: str, max_turns: int) -> str:
    """An episode as text: a title line, the prompt, each turn, the outcome.

    Example (a two-cell map solved in one turn):
      === episode 1: task 0 ===
      prompt:
          P G
      turn 1: action 'right' valid reward +1.00
        observation:
          _ P
      outcome: success, return +1.00, 1 of 8 turns, ended by the environment
    """
    lines = [f"=== {title} ===", "prompt:", _indent(ep.prompt)]
    for k, turn in enumerate(ep.turns):
        # An action that fills the budget needs no end-of-action; say so only where it failed.
        cut = "" if turn.ended or turn.valid else " (no end-of-action: cut at the budget)"
        valid = "valid" if turn.valid else "INVALID"
        lines.append(f"turn {k + 1}: action {turn.action!r}{cut} {valid} reward {turn.reward:+.2f}")
        lines.append("  observation:")
        lines.append(_indent(turn.observation) if turn.observation else "    (none)")
    how = "ended by the environment" if ep.done else "cut at the turn limit"
    result = "success" if ep.success else "failure"
    lines.append(
        f"outcome: {result}, return {ep.reward:+.2f}, {len(ep.turns)} of {max_turns} turns, {how}"
    )
    return "\n".join(lines)


def play(exp, params, split: str, num: int, greedy: bool, temperature: float, seed: int):
    """(Trajectory of at least `num` rows, rollout config): the evaluation's first tasks of
    `split` (task keys as `Experiment.eval_fn` draws them from `seed`), one sample each.

    The batch is `num` rounded up to a multiple of the mesh's data size (the rollout shards
    episodes over it); the extra rows are tasks num, num + 1, ...
    """
    env, env_params = exp.env.make_split(split)
    div = sharding.batch_size_divisor(exp.mesh)
    batch = div * math.ceil(num / div)
    rc = dataclasses.replace(
        exp.eval_rollout_config(split, greedy, batch), temperature=float(temperature)
    )
    shard_fn = sharding.batch_constraint(exp.mesh)

    def run(params, env_params):
        task_stream, rollout_key = experiment.eval_keys(seed)
        task_keys = jax.random.split(task_stream, batch)
        return rollout_lib.rollout(
            rollout_key,
            exp.step_cfg.graphdef,
            params,
            env,
            env_params,
            rc,
            task_keys=task_keys,
            shard_fn=shard_fn,
        )

    return jax.jit(run)(params, env_params), rc


def episodes_text(exp, params, split: str, num: int, greedy: bool, temperature: float, seed: int):
    """`num` episodes of `params` on `split`, decoded and formatted (`play`, `format_episode`)."""
    traj, rc = play(exp, params, split, num, greedy, temperature, seed)
    mode = "greedy" if greedy else f"sampled at temperature {temperature:g}"
    header = f"# {exp.config.env.name}, {split} split, {mode}, seed {seed}"
    eps = decode_episodes(traj, exp.env.tokenizer, num)
    turns = rollout_lib.make_layout(exp.env, rc).turns
    body = [format_episode(ep, f"episode {i + 1}: task {i}", turns) for i, ep in enumerate(eps)]
    solved = sum(ep.success for ep in eps)
    return "\n\n".join([header, *body, f"# solved {solved} of {num}"]) + "\n"


def _run_config(workdir: str):
    """The config of a scripts/train.py run (checkpoints/config.json over today's defaults)."""
    path = os.path.join(workdir, "checkpoints", "config.json")
    if not os.path.isfile(path):
        config_utils.fail(f"--workdir={workdir!r} holds no run (no checkpoints/config.json)")
    config = base.get_config()
    config.unlock()
    try:
        with open(path) as f:
            config.update(json.load(f))
    except (ValueError, TypeError, AttributeError) as e:
        config_utils.fail(f"{path} is not this project's run config: {e}")
    return config


def _checkpoint_params(exp, workdir: str, step: int):
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        config_json=exp.config_json,
        compat_keys=experiment.COMPAT_KEYS,
        compat_defaults=experiment.COMPAT_DEFAULTS,
    )
    try:
        steps = ckpt.all_steps()
        step = max(steps, default=-1) if step < 0 else step
        if step not in steps:
            config_utils.fail(f"--step={step} is not saved in --workdir; saved steps: {steps}")
        return ckpt.restore(step, exp.abstract_state()).params, f"checkpoint step {step}"
    finally:
        ckpt.close()


def check_flags() -> None:
    """Refuses (`config_utils.fail`, one line) a bad combination or value of the flags."""
    if _WORKDIR.value and (_CONFIG.value is not None or _PARAMS.value):
        fail_with = "--config" if _CONFIG.value is not None else "--params"
        config_utils.fail(
            f"--workdir={_WORKDIR.value!r} with {fail_with}: a run brings its own config and "
            "parameters; allowed: --workdir alone, or --config with an optional --params"
        )
    if not _WORKDIR.value and _CONFIG.value is None:
        config_utils.fail("no policy given; allowed: --config=FILE[:ARG] or --workdir=DIR")
    if _SPLIT.value not in SPLITS:
        config_utils.fail(f"--split={_SPLIT.value!r}; allowed: one of {list(SPLITS)}")
    if _NUM.value < 1:
        config_utils.fail(f"--num={_NUM.value}; allowed: >= 1")
    if _SEED.value < -1:
        config_utils.fail(f"--seed={_SEED.value}; allowed: >= 0, or -1 (= train.eval_seed)")
    t = _TEMPERATURE.value
    if t is not None and _GREEDY.value:
        config_utils.fail(f"--temperature={t} with --greedy; allowed: one of the two")
    if t is not None and not (math.isfinite(t) and t > 0):
        config_utils.fail(f"--temperature={t}; allowed: a finite number > 0")
    if _OUT.value:
        config_utils.check_output_file("--out", _OUT.value)


def main(argv):
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments {argv[1:]}; allowed: flags only")
    logging.set_verbosity(logging.ERROR)  # Orbax logs every restore at INFO
    check_flags()
    config = _run_config(_WORKDIR.value) if _WORKDIR.value else _CONFIG.value
    params_dir = _PARAMS.value or ("" if _WORKDIR.value else config.init.get("params", ""))
    try:
        exp = experiment.build(config)
    except (ValueError, KeyError) as e:
        config_utils.fail(str(e))
    if not isinstance(exp, experiment.Experiment):
        exp.close()
        config_utils.fail(
            f"env.name={config.env.name!r} runs on the host backend; allowed: an environment "
            "of the jitted rollout"
        )
    if _WORKDIR.value:
        params, source = _checkpoint_params(exp, _WORKDIR.value, _STEP.value)
    elif params_dir:
        try:
            params = exp.saved_params(params_dir)
        except (FileNotFoundError, ValueError) as e:
            config_utils.fail(config_utils.one_line(str(e)))
        source = f"parameters of {params_dir}"
    elif config.model.get("checkpoint", ""):
        params, source = exp.pretrained_params(), f"pretrained {config.model.checkpoint}"
    else:
        params, source = exp.init_state(exp.root_key()).params, f"random init (seed {config.seed})"
    seed = config.train.eval_seed if _SEED.value < 0 else _SEED.value
    temperature = config.rollout.temperature if _TEMPERATURE.value is None else _TEMPERATURE.value
    text = episodes_text(exp, params, _SPLIT.value, _NUM.value, _GREEDY.value, temperature, seed)
    text = f"# policy: {source}\n{text}"
    print(text, end="")
    if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value, "w") as f:
            f.write(text)


def parse(argv: list[str]) -> list[str]:
    """`config_utils.parse_flags` when a --config is given, else its plain-flag parsing."""
    given = any(a == "--config" or a.startswith("--config=") for a in argv[1:])
    return config_utils.parse_flags(argv) if given else config_utils.parse_plain_flags(argv)


if __name__ == "__main__":
    app.run(main, flags_parser=parse)
