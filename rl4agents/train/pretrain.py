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

Checkpoints and resume: every `pretrain.checkpoint_every` steps the loop saves, atomically
(`checkpoint.Checkpointer`, the newest 2 kept, in `<workdir>/checkpoints/`), a
`PretrainState`: parameters, optimizer state, the step, each environment's minibatch stream
position and the NLL values of the metrics window not yet written. The corpus is not saved: it
is regenerated from the seed (the same keys give the same episodes), and its sha256 is stored
with the recipe so that a resumed run refuses a corpus that came out differently. Running the
same command on the same workdir continues from the newest checkpoint and ends with the
parameters and metric rows of an uninterrupted run. `pretrain.max_minutes` limits each
invocation: the run is cut there (a checkpoint, the parameters, the evaluation, a summary
saying so), and running the command again continues it.

Continued pretraining: `pretrain.init` names a saved base (or an `scripts/sft.py` workdir)
whose parameters start the run; the optimizer and its schedule start fresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import flax.struct
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
# A metrics row (the mean NLL per environment since the previous row) every this many steps.
LOG_EVERY = 50
CHECKPOINT_DIR = "checkpoints"
MAX_CHECKPOINTS = 2
# Fields that may change between invocations of one run: they do not change what is trained.
RESUMABLE_FIELDS = (
    "pretrain.max_minutes",
    "pretrain.eval_tasks",
    "pretrain.eval_every",
    "pretrain.checkpoint_every",
)


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


class RunKeys(NamedTuple):
    """The PRNG keys of a pretraining run, all folded from one root key (`run_keys`)."""

    root: jax.Array  # fold_in(key(seed), 11): pretraining's own stream

    def corpus(self, i: int) -> jax.Array:
        """Environment i's corpus key (`collect_corpus`)."""
        return jax.random.fold_in(self.root, i)

    def init(self) -> jax.Array:
        """The key of the parameters' random initialisation."""
        return jax.random.fold_in(self.root, 10_000)

    def stream(self, i: int) -> jax.Array:
        """Environment i's minibatch stream key (`minibatches_from`)."""
        return jax.random.fold_in(self.root, 20_000 + i)

    def schedule(self) -> jax.Array:
        """The key of `env_schedule`."""
        return jax.random.fold_in(self.root, 30_000)


def run_keys(seed: int) -> RunKeys:
    """The keys of a run with `config.seed` = `seed`."""
    return RunKeys(jax.random.fold_in(jax.random.key(seed), 11))


def minibatches_from(
    demos: sft.Demos, batch_size: int, key: jax.Array, start: int = 0
) -> Iterator[sft.Demos]:
    """`sft.minibatches(demos, batch_size, key)` from its `start`-th minibatch on.

    Minibatch j is slot j % M of pass j // M (M = N // batch_size), the pass shuffled with
    `fold_in(key, pass)`, so the stream continues at any position without replaying it.

    Args:
      demos: N episodes (numpy or device arrays).
      batch_size: episodes per minibatch (at most N).
      key: the stream's key.
      start: the index of the first minibatch yielded.

    Yields:
      `Demos` of `batch_size` episodes (device arrays).
    """
    host = jax.tree.map(np.asarray, demos)
    n = host.tokens.shape[0]
    per_pass = n // batch_size
    index = start
    while True:
        pass_id, first = divmod(index, per_pass)
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, pass_id), n))
        for slot in range(first, per_pass):
            idx = perm[slot * batch_size : (slot + 1) * batch_size]
            yield jax.tree.map(lambda x, idx=idx: jnp.asarray(x[idx]), host)
        index = (pass_id + 1) * per_pass


def corpus_digest(corpus: Corpus) -> str:
    """The sha256 of a corpus's episodes (tokens, masks, noise levels), as hex."""
    h = hashlib.sha256()
    for x in (
        corpus.demos.tokens,
        corpus.demos.valid_mask,
        corpus.demos.action_mask,
        corpus.eps,
    ):
        x = np.ascontiguousarray(np.asarray(x))
        h.update(f"{x.dtype}{x.shape}".encode())
        h.update(x.tobytes())
    return h.hexdigest()


@flax.struct.dataclass
class PretrainState:
    """Everything the pretraining loop needs to continue a run (the checkpointed pytree)."""

    params: Any  # nnx.State: the decoder's parameters
    opt_state: Any  # the optimizer's state (optax)
    step: jax.Array  # int32[] optimizer steps done
    positions: jax.Array  # int32[E] minibatches drawn from each environment's stream
    window_nll: jax.Array  # f32[LOG_EVERY] NLL of each step since the last metrics row, 0 after
    wall_s: jax.Array  # f32[] seconds of the run so far (every invocation)
    train_s: jax.Array  # f32[] seconds spent training so far (every invocation)


def recipe(
    config: ml_collections.ConfigDict,
    env_configs: Mapping[str, ml_collections.ConfigDict],
    digests: Mapping[str, str] | None = None,
) -> dict:
    """What a run trains, flattened: {dotted field: value}.

    The pretraining config's fields but `RESUMABLE_FIELDS` and `log.*`, each environment's
    config as `envs.<name>.<field>` (but its copy of `pretrain` and `log`), and, once the
    corpus is collected, each corpus's sha256 as `corpus.<name>` (`corpus_digest`).
    """
    out = {
        k: v
        for k, v in checkpoint_lib.flatten(json.loads(config.to_json_best_effort())).items()
        if k not in RESUMABLE_FIELDS and not k.startswith("log.")
    }
    for name, c in env_configs.items():
        tree = json.loads(c.to_json_best_effort())
        tree.pop("pretrain", None)
        tree.pop("log", None)
        out.update(checkpoint_lib.flatten(tree, f"envs.{name}"))
    for name, digest in (digests or {}).items():
        out[f"corpus.{name}"] = digest
    return out


def check_recipe(stored: Mapping[str, Any], new: Mapping[str, Any], where: str) -> None:
    """Raises a one-line `ValueError` naming the first field (sorted) on which a run's
    `recipe` differs from the one stored with its checkpoints; `corpus.*` fields are
    compared only when `new` has them."""
    corpus = any(k.startswith("corpus.") for k in new)
    for key in sorted(stored.keys() | new.keys()):
        if key.startswith("corpus.") and not corpus:
            continue
        old, value = stored.get(key, "<missing>"), new.get(key, "<missing>")
        if old != value:
            what = "the corpus" if key.startswith("corpus.") else "the config"
            raise ValueError(
                f"{where} holds checkpoints of another pretraining run: {key}={value!r} in "
                f"{what}, stored {old!r}; allowed: the stored value (to resume), or a new "
                "workdir"
            )


def _stored_recipe(directory: str) -> dict | None:
    """The recipe stored beside a checkpoint `directory`'s saved steps, or None."""
    path = os.path.join(directory, checkpoint_lib.CONFIG_NAME)
    if not checkpoint_lib.saved_steps(directory) or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


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
    for field in ("warmup_steps", "eval_every", "max_minutes", "checkpoint_every"):
        if p[field] < 0:
            raise ValueError(f"pretrain.{field}={p[field]}; allowed: >= 0")
    if not p.lr >= 0:
        raise ValueError(f"pretrain.lr={p.lr}; allowed: >= 0")


def _finished(workdir: str, steps: int) -> dict | None:
    """The workdir's summary.json if it records a run finished at `steps`, else None."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    done = summary.get("finished") and summary.get("steps") == steps
    return summary if done else None


def run(
    config: ml_collections.ConfigDict,
    env_configs: Mapping[str, ml_collections.ConfigDict],
    workdir: str,
    log: Callable[[str], None] = print,
    *,
    stop_after: int | None = None,
) -> dict:
    """Collect the corpus, pretrain, evaluate every environment, save; returns the summary.

    Resumes from the newest checkpoint in `workdir/checkpoints` if there is one (the recipe
    must be the stored one, `check_recipe`); a resumed run ends as an uninterrupted one would
    (the same parameters and metric rows). A run already finished returns its summary.

    Args:
      config: the pretraining config (`configs/base_policy.py`, no argument): `model`,
        `seed` and the `pretrain` section.
      env_configs: {env name: its config} for every name of `pretrain.envs`; each must share
        the pretraining config's model and `env.vocab` (the parameters are one tree).
      workdir: where `checkpoints/`, `params/`, `metrics.jsonl`, `corpus.json`, `eval.json`
        and `summary.json` (last) are written.
      log: progress lines.
      stop_after: stop after this many steps of this call, with a checkpoint and before the
        parameters and the evaluation (for tests of interruption and resume); returns
        {"steps", "finished": False}.

    Returns:
      The summary: the corpus recipe and per-environment stats, the schedule, the final
      held-out (test) greedy and sampled success per environment, timings, `finished` and
      `cut` (why training stopped before `pretrain.steps`, or None).
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
    ckpt_dir = os.path.join(workdir, CHECKPOINT_DIR)
    saved = _stored_recipe(ckpt_dir)
    if saved is not None:
        if not p.checkpoint_every:
            raise ValueError(
                f"pretrain.checkpoint_every=0 but {ckpt_dir} holds checkpoints of this run; "
                "allowed: > 0 (to resume), or a new workdir"
            )
        check_recipe(saved, recipe(config, env_configs), workdir)
        done = _finished(workdir, p.steps)
        if done is not None and checkpoint_lib.saved_steps(ckpt_dir)[-1] == p.steps:
            log(f"already finished at step {p.steps}: {os.path.join(workdir, 'summary.json')}")
            return done
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    exps = {name: experiment_lib.build(env_configs[name]) for name in names}
    first = exps[names[0]]
    keys = run_keys(config.seed)
    corpora = {}
    for i, name in enumerate(names):
        corpora[name] = collect_corpus(exps[name], p.demos_per_env, levels, keys.corpus(i))
        log(f"corpus {name}: {json.dumps(corpora[name].stats())}")
    collect_s = time.perf_counter() - t0
    digests = {name: corpus_digest(corpora[name]) for name in names}
    run_recipe = recipe(config, env_configs, digests)
    if saved is not None:
        check_recipe(saved, run_recipe, workdir)
    optimizer = state_lib.make_optimizer(
        lr=p.lr,
        grad_clip=config.optim.grad_clip,
        warmup_steps=p.warmup_steps,
        schedule="cosine",
        total_steps=p.steps,
    )
    params = first.init_state(keys.init()).params
    state = PretrainState(
        params=params,
        opt_state=sft.init_opt_state(optimizer, params, first.mesh),
        step=jnp.zeros((), jnp.int32),
        positions=jnp.zeros((len(names),), jnp.int32),
        window_nll=jnp.zeros((LOG_EVERY,), jnp.float32),
        wall_s=jnp.zeros((), jnp.float32),
        train_s=jnp.zeros((), jnp.float32),
    )
    ckpt = None
    if p.checkpoint_every:
        ckpt = checkpoint_lib.Checkpointer(
            ckpt_dir,
            max_to_keep=MAX_CHECKPOINTS,
            config_json=json.dumps(run_recipe),
            compat_keys=(),  # `check_recipe` compares every field, in one line
        )
    try:
        start = ckpt.latest_step() if ckpt is not None else None
        if start is not None:
            state = ckpt.restore(start, state)
            log(f"resuming from step {start} ({ckpt_dir})")
        elif p.init:
            # The base's environments need not be these: its model and vocabulary must match.
            params = sft.load_params(
                p.init,
                first.abstract_state().params,
                config.to_json_best_effort(),
                tuple(k for k in experiment_lib.INIT_COMPAT_KEYS if k != "env.name"),
                compat_defaults=experiment_lib.COMPAT_DEFAULTS,
            )
            state = state.replace(params=params)
            log(f"parameters from {p.init}")
        resumed = start is not None
        usage = writers.Usage(workdir, cpu0, resumed=resumed)
        start = start or 0
        t0 -= float(state.wall_s)  # the run's clock counts every invocation
        step_fn = sft.make_step(first.step_cfg.graphdef, optimizer, first.mesh)
        params, opt_state = state.params, state.opt_state
        positions = np.array(state.positions, np.int64)
        streams = {
            name: minibatches_from(
                corpora[name].demos,
                min(p.batch_size, corpora[name].demos.tokens.shape[0]),
                keys.stream(i),
                int(positions[i]),
            )
            for i, name in enumerate(names)
        }
        schedule = env_schedule(probs, p.steps, keys.schedule())
        # The NLL of each step since the last metrics row, in step order.
        row_start = start // LOG_EVERY * LOG_EVERY
        window = list(np.asarray(state.window_nll)[: start - row_start])
        os.makedirs(workdir, exist_ok=True)
        # Rows after the checkpointed step are redone by this run; they are dropped first.
        writer = writers.MetricWriter(workdir, resume_step=start + 1)
        t_train = time.perf_counter()
        train_offset = float(state.train_s)
        step, saved_at, cut = start, (start if resumed else None), None

        def save(step: int) -> None:
            nll = np.zeros(LOG_EVERY, np.float32)
            nll[: len(window)] = jax.device_get(window)
            now = time.perf_counter()
            ckpt.save(
                step,
                PretrainState(
                    params=params,
                    opt_state=opt_state,
                    step=jnp.asarray(step, jnp.int32),
                    positions=jnp.asarray(positions, jnp.int32),
                    window_nll=jnp.asarray(nll),
                    wall_s=jnp.asarray(now - t0, jnp.float32),
                    train_s=jnp.asarray(train_offset + now - t_train, jnp.float32),
                ),
            )

        try:
            while step < p.steps:
                if stop_after is not None and step - start >= stop_after:
                    break
                if p.max_minutes and time.perf_counter() - t_train > 60 * p.max_minutes:
                    cut = f"pretrain.max_minutes={p.max_minutes} reached at step {step}"
                    log(f"{cut} of {p.steps}; rerun the command to continue")
                    break
                i = int(schedule[step])
                params, opt_state, m = step_fn(params, opt_state, next(streams[names[i]]))
                positions[i] += 1
                window.append(m["nll"])
                step += 1
                if step % LOG_EVERY == 0 or step == p.steps:
                    row = _nll_row(window, schedule[row_start:step], names)
                    window, row_start = [], step
                    writer.write(step, row, prefix="pretrain", wall_time=time.perf_counter() - t0)
                    usage.write()
                    log(
                        f"step {step}/{p.steps} {time.perf_counter() - t_train:.0f}s "
                        + json.dumps({k: round(v, 3) for k, v in row.items()})
                    )
                if p.eval_every and step % p.eval_every == 0 and step < p.steps:
                    ev = evaluate_all(exps, params, min(p.eval_tasks, 64), ("test",))
                    for n in names:
                        writer.write(step, ev[n]["test"], prefix=f"eval_test/{n}")
                    log(
                        "eval "
                        + json.dumps({n: round(ev[n]["test"]["greedy_success"], 3) for n in names})
                    )
                if ckpt is not None and step % p.checkpoint_every == 0:
                    save(step)
                    saved_at = step
        except KeyboardInterrupt:
            if ckpt is not None and saved_at != step:
                save(step)
                ckpt.wait()
                log(f"interrupted at step {step}; checkpoint saved, rerun to resume")
            writer.close()
            raise
        if ckpt is not None and saved_at != step:
            save(step)
        if ckpt is not None:
            ckpt.wait()
        train_s = train_offset + time.perf_counter() - t_train
    finally:
        if ckpt is not None:
            ckpt.close()
    if stop_after is not None and step < p.steps and cut is None:
        writer.close()
        return {"steps": step, "finished": False}
    config_json = checkpoint_lib.with_compat_choices(
        config.to_json_best_effort(sort_keys=True, indent=2), {"env.name": list(names)}
    )
    # Saved before the evaluation, which writes eval.json after each environment. A run
    # resumed after this save (killed in the evaluation) finds the same parameters there.
    if step not in checkpoint_lib.saved_steps(os.path.join(workdir, sft.PARAMS_DIR)):
        sft.save_params(workdir, params, step, config_json, experiment_lib.INIT_COMPAT_KEYS)
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
        writer.write(step, evals[n]["test"], prefix=f"eval_test/{n}")
    writer.close()
    counts = np.bincount(schedule[:step], minlength=len(names))
    cpu_s, peak_gb = usage.write()
    summary = {
        "envs": list(names),
        "model": config_utils.to_dict(config.model),
        "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
        "pretrain": config_utils.to_dict(p),
        "steps": step,
        "finished": cut is None,
        "cut": cut,  # why training stopped before pretrain.steps (rerun to continue), or None
        "start_step": start,  # where this invocation began (> 0: resumed from a checkpoint)
        "init": p.init or None,
        "steps_per_env": {n: int(counts[i]) for i, n in enumerate(names)},
        "corpus": corpus,
        "test": {n: evals[n]["test"] for n in names},
        "eval_tasks": p.eval_tasks,
        "collect_s": round(collect_s, 1),  # this invocation's (a resumed run collects again)
        "train_s": round(train_s, 1),  # every invocation's
        "eval_s": round(eval_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),  # every invocation's
        "process_cpu_s": cpu_s,  # every invocation's: user + system (`writers.Usage`)
        "peak_rss_gb": peak_gb,  # the largest of any invocation
        "params": os.path.join(workdir, sft.PARAMS_DIR),
    }
    writers.write_text(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2))
    return summary


def _nll_row(window: list, envs: np.ndarray, names: Sequence[str]) -> dict:
    """{"nll/<env>": mean NLL} of a metrics window: `window[k]` is the NLL of a step on
    environment `envs[k]`; environments without a step in it are left out."""
    values = jax.device_get(window)
    row = {}
    for i, name in enumerate(names):
        mine = [v for v, e in zip(values, envs) if e == i]
        if mine:
            row[f"nll/{name}"] = float(np.mean(mine))
    return row


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
