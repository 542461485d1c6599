"""Multi-task pretraining on imperfect demonstrations: the base policy RL starts from.

A stand-in for the pretrained LLM of the papers: one decoder trained on episodes of every
environment, in which the oracle's action is replaced, with a per-episode probability eps,
by a uniformly random action of the environment's action space (`sft.collect_demos` with
`eps`). Failed episodes are kept. The model learns each task's format and a competent but
fallible behaviour; RL then has room to improve it.

The environments share the built-in vocabulary, and the decoder has no position table
(rotary embeddings), so one set of parameters runs in every environment's layout. Each step
trains on one environment's batch, drawn by `weights`; an environment's episodes are packed
(`pack`) to the longest one of its corpus, so the step compiles once per environment.

The parameters are saved like `scripts/sft.py`'s (`sft.save_params`), with the config's
`env.name` accepting every trained environment (`checkpoint.with_compat_choices`): an RL run
in any of them starts from it with `--config.init.params`, and only in those.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl4agents import checkpoint as checkpoint_lib
from rl4agents import config_utils
from rl4agents.envs import registry as env_registry
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import sft
from rl4agents.train import state as state_lib

# Packed episodes are padded to a multiple of this many slots.
PACK_MULTIPLE = 16


def parse_envs(value: str, known: Sequence[str]) -> tuple[str, ...]:
    """The environment names of a comma-separated `pretrain.envs`."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise ValueError(f"pretrain.envs={value!r}; allowed: comma-separated names of {known}")
    for n in names:
        if n not in known:
            raise ValueError(f"pretrain.envs: unknown environment {n!r}; allowed: {list(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"pretrain.envs={value!r} names an environment twice")
    return names


def parse_eps(value: str) -> tuple[float, ...]:
    """The noise levels of a comma-separated `pretrain.eps` (each in [0, 1])."""
    try:
        levels = tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or not all(0.0 <= x <= 1.0 for x in levels):
        raise ValueError(
            f"pretrain.eps={value!r}; allowed: comma-separated numbers in [0, 1], e.g. '0,0.25'"
        )
    return levels


def parse_weights(value: str, envs: Sequence[str], known: Sequence[str] = ()) -> np.ndarray:
    """f64[len(envs)] sampling probabilities from `pretrain.weights` ("name=w,..."; others 1).

    A weight for an environment of `known` that the corpus leaves out (not in `envs`) is
    ignored, so a recipe's weights still apply to a subset of its environments.
    """
    w = dict.fromkeys(envs, 1.0)
    skip = set(known) - set(envs)
    for item in (x.strip() for x in value.split(",") if x.strip()):
        name, sep, num = item.partition("=")
        try:
            weight = float(num)
        except ValueError:
            weight = -1.0
        if sep and name in skip and weight >= 0:
            continue
        if not sep or name not in w or not weight >= 0:
            raise ValueError(
                f"pretrain.weights: {item!r}; allowed: name=weight (weight >= 0) for a "
                f"name in pretrain.envs {list(envs)}"
            )
        w[name] = weight
    p = np.array([w[n] for n in envs], np.float64)
    if p.sum() <= 0:
        raise ValueError(f"pretrain.weights={value!r} gives every environment weight 0")
    return p / p.sum()


def _lookup(config: dict, dotted: str):
    """`config["a"]["b"]` for "a.b", or None."""
    for part in dotted.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def noise_levels(n: int, levels: Sequence[float]) -> np.ndarray:
    """f32[n]: episode i gets `levels[i % len(levels)]` (each level an equal share)."""
    return np.asarray(levels, np.float32)[np.arange(n) % len(levels)]


def pack(demos: sft.Demos, multiple: int = PACK_MULTIPLE, pad_id: int = 0) -> sft.Demos:
    """The episodes with their valid slots moved to the front, in order, and the unused tail
    cut: length = the longest episode's valid slots, rounded up to `multiple`.

    The teacher-forced pass gives each token the position of its rank among the valid slots
    and attends valid slots only (`rollout.score`), so a packed episode scores exactly as
    its slot layout does, in fewer slots.

    Args:
      demos: N episodes of T slots (numpy or device arrays).
      multiple: the packed length is a multiple of this.
      pad_id: the token written in the unused slots.

    Returns:
      `Demos` of N episodes of L <= T slots (numpy arrays; PAD after the valid slots).
    """
    tokens, valid = np.asarray(demos.tokens), np.asarray(demos.valid_mask)
    action = np.asarray(demos.action_mask)
    t = tokens.shape[1]
    counts = valid.sum(axis=1)
    length = min(t, max(multiple, -(-int(counts.max(initial=1)) // multiple) * multiple))
    # A stable sort of "not valid" puts the valid slots first, each row in its order.
    order = np.argsort(~valid, axis=1, kind="stable")[:, :length]
    keep = np.arange(length)[None, :] < counts[:, None]
    take = lambda x: np.take_along_axis(x, order, axis=1)  # noqa: E731
    return dataclasses.replace(
        demos,
        tokens=np.where(keep, take(tokens), pad_id).astype(np.int32),
        valid_mask=keep,
        action_mask=take(action) & keep,
        success=np.asarray(demos.success),
        num_turns=np.asarray(demos.num_turns),
        reward=np.asarray(demos.reward),
    )


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One environment's demonstrations, packed, and how they were made."""

    name: str
    demos: sft.Demos
    eps: np.ndarray  # f32[N] each episode's noise level
    collect_s: float

    def stats(self) -> dict:
        """Success, reward and turns per noise level, and the packed length."""
        out = {"episodes": int(self.eps.shape[0]), "packed_len": int(self.demos.tokens.shape[1])}
        out["success"] = float(np.mean(self.demos.success))
        for level in np.unique(self.eps):
            on = self.eps == level
            out[f"success_eps{level:g}"] = float(np.mean(self.demos.success[on]))
        out["mean_turns"] = float(np.mean(self.demos.num_turns))
        out["action_tokens"] = int(np.asarray(self.demos.action_mask).sum())
        out["collect_s"] = round(self.collect_s, 1)
        return out


def collect_corpus(
    exp: experiment_lib.Experiment, num: int, levels: Sequence[float], key: jax.Array
) -> Corpus:
    """`num` imperfect demonstrations on training tasks of `exp`'s environment, packed.

    Args:
      exp: the environment's experiment (its env, rollout layout and training params).
      num: episodes; episode i has noise level `levels[i % len(levels)]`.
      levels: the noise levels eps (`parse_eps`).
      key: this environment's corpus key.
    """
    t0 = time.perf_counter()
    lay = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout)
    eps = noise_levels(num, levels)
    demos = sft.collect_demos(
        exp.env,
        exp.env.default_params("train"),
        jax.random.split(jax.random.fold_in(key, 0), num),
        lay,
        jax.random.fold_in(key, 1),
        eps=eps,
        action_key=jax.random.fold_in(key, 2),
    )
    packed = pack(demos, pad_id=exp.env.tokenizer.pad_id)
    return Corpus(exp.config.env.name, packed, eps, time.perf_counter() - t0)


def env_schedule(probs: np.ndarray, steps: int, key: jax.Array) -> np.ndarray:
    """int32[steps]: the environment index trained at each step, drawn i.i.d. from `probs`."""
    return np.asarray(jax.random.choice(key, len(probs), (steps,), p=jnp.asarray(probs)))


def evaluate_all(
    exps: Mapping[str, experiment_lib.Experiment],
    params,
    num_tasks: int,
    splits: Sequence[str],
    done: Callable[[dict], None] = lambda _: None,
) -> dict:
    """{env: {split: metrics}} of `loop.evaluate` (greedy and sampled) on `num_tasks` tasks,
    each with the seconds it took (`seconds`); `done` gets the dict after each environment."""
    from rl4agents.train import loop

    out = {}
    for name, exp in exps.items():
        out[name] = {}
        for split in splits:
            t0 = time.perf_counter()
            m = loop.evaluate(exp, params, split, num_tasks)
            out[name][split] = {**m, "seconds": round(time.perf_counter() - t0, 1)}
        done(out)
    return out


def _check(p: ml_collections.ConfigDict) -> None:
    for field in ("demos_per_env", "steps", "batch_size", "eval_tasks"):
        if p[field] < 1:
            raise ValueError(f"pretrain.{field}={p[field]}; allowed: >= 1")
    for field in ("warmup_steps", "eval_every", "max_minutes"):
        if p[field] < 0:
            raise ValueError(f"pretrain.{field}={p[field]}; allowed: >= 0")
    if not p.lr > 0:
        raise ValueError(f"pretrain.lr={p.lr}; allowed: > 0")


def run(
    config: ml_collections.ConfigDict,
    env_configs: Mapping[str, ml_collections.ConfigDict],
    workdir: str,
    log: Callable[[str], None] = print,
) -> dict:
    """Collect the corpus, pretrain, evaluate every environment, save; returns the summary.

    Args:
      config: the pretraining config (`configs/base_policy.py`, no argument): `model`,
        `seed` and the `pretrain` section.
      env_configs: {env name: its config} for every name of `pretrain.envs`; each must share
        the pretraining config's model and `env.vocab` (the parameters are one tree).
      workdir: where `params/`, `metrics.jsonl`, `corpus.json`, `eval.json` and
        `summary.json` (last) are written.
      log: progress lines.

    Returns:
      The summary: the corpus recipe and per-environment stats, the schedule, the final
      held-out (test) greedy and sampled success per environment, and timings.
    """
    from rl4agents.train import writers

    p = config.pretrain
    _check(p)
    names = parse_envs(p.envs, tuple(env_configs))
    levels = parse_eps(p.eps)
    probs = parse_weights(p.weights, names, env_registry.names(backend=None))
    stored = json.loads(config.to_json_best_effort())
    for name in names:
        c = json.loads(env_configs[name].to_json_best_effort())
        for key in experiment_lib.INIT_COMPAT_KEYS:
            if key == "env.name":
                continue
            a, b = _lookup(stored, key), _lookup(c, key)
            if a != b:
                raise ValueError(
                    f"environment {name!r}: {key}={b!r} differs from the pretraining config's "
                    f"{a!r}; allowed: one model and vocabulary for every environment"
                )
    t0 = time.perf_counter()
    exps = {name: experiment_lib.build(env_configs[name]) for name in names}
    first = exps[names[0]]
    root = jax.random.fold_in(jax.random.key(config.seed), 11)  # pretraining's own stream
    corpora = {}
    for i, name in enumerate(names):
        corpora[name] = collect_corpus(
            exps[name], p.demos_per_env, levels, jax.random.fold_in(root, i)
        )
        log(f"corpus {name}: {json.dumps(corpora[name].stats())}")
    collect_s = time.perf_counter() - t0
    optimizer = state_lib.make_optimizer(
        lr=p.lr,
        grad_clip=config.optim.grad_clip,
        warmup_steps=p.warmup_steps,
        schedule="cosine",
        total_steps=p.steps,
    )
    params = first.init_state(jax.random.fold_in(root, 10_000)).params
    opt_state = sft.init_opt_state(optimizer, params, first.mesh)
    step_fn = sft.make_step(first.step_cfg.graphdef, optimizer, first.mesh)
    streams = {
        name: sft.minibatches(
            corpora[name].demos,
            min(p.batch_size, corpora[name].demos.tokens.shape[0]),
            jax.random.fold_in(root, 20_000 + i),
        )
        for i, name in enumerate(names)
    }
    schedule = env_schedule(probs, p.steps, jax.random.fold_in(root, 30_000))
    os.makedirs(workdir, exist_ok=True)
    writer = writers.MetricWriter(workdir)
    t_train = time.perf_counter()
    recent = {name: [] for name in names}
    steps = p.steps
    for s in range(p.steps):
        if p.max_minutes and time.perf_counter() - t_train > 60 * p.max_minutes:
            steps = s
            log(f"pretrain.max_minutes={p.max_minutes} reached after {s} steps")
            break
        name = names[int(schedule[s])]
        params, opt_state, m = step_fn(params, opt_state, next(streams[name]))
        recent[name].append(m["nll"])
        if (s + 1) % 50 == 0 or s + 1 == p.steps:
            row = {f"nll/{n}": float(np.mean(jax.device_get(v))) for n, v in recent.items() if v}
            recent = {n: [] for n in names}
            writer.write(s + 1, row, prefix="pretrain", wall_time=time.perf_counter() - t0)
            log(
                f"step {s + 1}/{p.steps} {time.perf_counter() - t_train:.0f}s "
                + json.dumps({k: round(v, 3) for k, v in row.items()})
            )
        if p.eval_every and (s + 1) % p.eval_every == 0 and s + 1 < p.steps:
            ev = evaluate_all(exps, params, min(p.eval_tasks, 64), ("test",))
            for n in names:
                writer.write(s + 1, ev[n]["test"], prefix=f"eval_test/{n}")
            log("eval " + json.dumps({n: round(ev[n]["test"]["greedy_success"], 3) for n in names}))
    train_s = time.perf_counter() - t_train
    config_json = checkpoint_lib.with_compat_choices(
        config.to_json_best_effort(sort_keys=True, indent=2), {"env.name": list(names)}
    )
    # Saved before the evaluation, which writes eval.json after each environment.
    sft.save_params(workdir, params, steps, config_json, experiment_lib.INIT_COMPAT_KEYS)
    corpus = {
        "recipe": {
            "eps": list(levels),
            "demos_per_env": p.demos_per_env,
            "split": "train",
            "kept": "all episodes, failed ones included",
            "random_action": "uniform over the environment's action space (env.num_actions)",
        },
        "envs": {n: corpora[n].stats() for n in names},
    }
    with open(os.path.join(workdir, "corpus.json"), "w") as f:
        json.dump(corpus, f, indent=2)

    def write_eval(evals: dict) -> None:
        with open(os.path.join(workdir, "eval.json"), "w") as f:
            json.dump(evals, f, indent=2)

    t_eval = time.perf_counter()
    evals = evaluate_all(exps, params, p.eval_tasks, ("test",), done=write_eval)
    eval_s = time.perf_counter() - t_eval
    for n in names:
        writer.write(steps, evals[n]["test"], prefix=f"eval_test/{n}")
    writer.close()
    counts = np.bincount(schedule[:steps], minlength=len(names))
    summary = {
        "envs": list(names),
        "model": config_utils.to_dict(config.model),
        "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
        "pretrain": config_utils.to_dict(p),
        "steps": steps,
        "steps_per_env": {n: int(counts[i]) for i, n in enumerate(names)},
        "corpus": corpus,
        "test": {n: evals[n]["test"] for n in names},
        "eval_tasks": p.eval_tasks,
        "collect_s": round(collect_s, 1),
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "process_cpu_s": round(time.process_time(), 1),  # user + system, every thread
        "params": os.path.join(workdir, sft.PARAMS_DIR),
    }
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


TABLE_COLUMNS = (
    "env",
    "greedy_success",
    "sampled_success",
    "eval_tasks",
    "eval_s",
    "steps",
    "demos",
    "demo_success",
    "packed_len",
)


def table_rows(summary: Mapping) -> list[dict]:
    """One row per environment of a pretraining `summary`: held-out (test) greedy and sampled
    success, the evaluation's seconds, the steps trained on it and its corpus."""
    rows = []
    for name in summary["envs"]:
        test, corpus = summary["test"][name], summary["corpus"]["envs"][name]
        rows.append(
            {
                "env": name,
                "greedy_success": round(test["greedy_success"], 3),
                "sampled_success": round(test["sampled_success"], 3),
                "eval_tasks": summary["eval_tasks"],
                "eval_s": test["seconds"],
                "steps": summary["steps_per_env"][name],
                "demos": corpus["episodes"],
                "demo_success": round(corpus["success"], 3),
                "packed_len": corpus["packed_len"],
            }
        )
    return rows


def publish(workdir: str, out: str, command: str) -> list[dict]:
    """Writes a finished run's results to `out`: `table.md` (with `command`), `table.csv`,
    and its `summary.json`, `eval.json`, `corpus.json`, `provenance.json`, `metrics.jsonl`.

    Raises:
      FileNotFoundError: `workdir` holds no finished run (no summary.json).
    """
    import csv
    import shutil

    path = os.path.join(workdir, "summary.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{workdir!r} holds no finished pretraining run ({path})")
    with open(path) as f:
        summary = json.load(f)
    rows = table_rows(summary)
    os.makedirs(out, exist_ok=True)
    for name in ("summary.json", "eval.json", "corpus.json", "provenance.json", "metrics.jsonl"):
        if os.path.isfile(os.path.join(workdir, name)):
            shutil.copyfile(os.path.join(workdir, name), os.path.join(out, name))
    with open(os.path.join(out, "table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    recipe = summary["corpus"]["recipe"]
    lines = [
        f"Base policy: held-out (test split) success per environment, {summary['eval_tasks']} "
        "tasks each, one set of parameters "
        f"({summary['num_params']:,} parameters, model {json.dumps(summary['model'])}).",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Corpus: {recipe['demos_per_env']} episodes per environment on training tasks, noise "
        f"levels eps {recipe['eps']} (equal shares; each turn a uniformly random action with "
        "probability eps, else the oracle's), failed episodes kept. Training: "
        f"{summary['steps']} steps of {summary['pretrain']['batch_size']} episodes, each on one "
        f"environment's batch; corpus {summary['collect_s']} s, training {summary['train_s']} "
        f"s, evaluation {summary['eval_s']} s, {summary['wall_s']} s in all.",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|---|" + "---:|" * (len(TABLE_COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(str(r[c]) for c in TABLE_COLUMNS) + " |" for r in rows]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows
