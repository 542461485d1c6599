"""Config-driven training on host (Python) text environments: `env.name = "host"`.

`experiment.build` resolves such a config like any other (model, credit, loss, optimizer,
mesh), with a `HostEnv` standing in for the environment, and returns a `HostExperiment`: the
same interface `train.loop.run` and scripts/eval.py drive (train step, evaluation, state), so
progress bars, evaluation, JSONL/TensorBoard metrics, curves, checkpoints and exact resume work
unchanged. Its train step is `rl4agents.envs.host.host_rollout_info` (each turn's sampling one
jitted program, the environments stepped on worker threads) followed by the jitted learning
half of the train step (`train.step.update`), on the config's mesh.

Per-step randomness derives from `fold_in(root, state.step)`, and training resets its games
from even seeds while the held-out splits use odd ones (`registry.split_seeds`), so a resumed
run replays exactly what an uninterrupted one does, as long as the games are deterministic
given their seeds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import ml_collections

from rl4agents import config_utils, sharding, text
from rl4agents.envs import host
from rl4agents.envs.host import registry
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import step as step_lib

NAME = "host"


@dataclasses.dataclass(frozen=True, eq=False)
class HostEnv:
    """The static geometry and tokenizer of host episodes (what `experiment.build` and
    `rollout.make_layout` read of an environment)."""

    max_prompt_len: int
    max_obs_len: int
    tokenizer: Any
    factory: str
    args: tuple  # sorted (name, value) pairs of the factory's keyword arguments
    max_action_len: int = 1  # host environments parse any action text

    def default_params(self, split: str) -> None:
        del split
        return None

    def factory_for(self, split: str):
        """`task -> TextEnv` for `split`, or None when the factory has no such split."""
        return registry.make_factory(self.factory, split, dict(self.args))


def make_env(c: ml_collections.ConfigDict, tokenizer=None) -> HostEnv:
    """Validate `config.env.host` and return its `HostEnv` (the built-in tokenizer unless one
    is given, e.g. a checkpoint's)."""
    h = c.env.host
    if not h.factory:
        raise ValueError(
            "env.name='host' needs env.host.factory; allowed: one of "
            f"{registry.names()} or 'package.module:function'"
        )
    args = registry.validate(h.factory, config_utils.to_dict(h.args))
    for field in ("max_prompt_len", "max_obs_len", "num_workers"):
        if h[field] < 1:
            raise ValueError(f"env.host.{field}={h[field]}; allowed: >= 1")
    if h.step_timeout_s <= 0:
        raise ValueError(f"env.host.step_timeout_s={h.step_timeout_s}; allowed: > 0")
    if c.env.vocab != "builtin":
        raise ValueError(
            f"env.vocab={c.env.vocab!r} with env.name='host': host text is open-ended; "
            "allowed: 'builtin' (or model.checkpoint's tokenizer)"
        )
    env = HostEnv(
        max_prompt_len=h.max_prompt_len,
        max_obs_len=h.max_obs_len,
        tokenizer=tokenizer or text.BuiltinTokenizer(),
        factory=h.factory,
        args=tuple(sorted(args.items())),
    )
    if env.factory_for("train") is None:
        raise ValueError(f"env.host.factory={h.factory!r} returned no training environments")
    return env


def check_config(c: ml_collections.ConfigDict, needs_greedy: bool) -> None:
    """What the jitted rollout offers and host rollouts do not; each raises a ValueError."""
    if c.rollout.context != "full":
        raise ValueError(
            f"rollout.context={c.rollout.context!r} with env.name='host'; allowed: 'full'"
        )
    if c.sampling.dynamic:
        raise ValueError("sampling.dynamic=True with env.name='host'; allowed: False")
    if needs_greedy:
        raise ValueError(
            f"credit.name={c.credit.name!r} needs greedy rollouts, which host environments "
            "do not run; allowed: an estimator without a greedy baseline"
        )
    if jax.process_count() > 1:
        raise ValueError(
            f"env.name='host' runs in one process (got {jax.process_count()}); allowed: 1"
        )


@dataclasses.dataclass(frozen=True)
class HostExperiment(experiment_lib.Experiment):
    """An `Experiment` whose episodes come from host environments (see the module doc)."""

    pools: dict = dataclasses.field(default_factory=dict)  # split -> HostPool, made on first use

    def __post_init__(self):
        if self.train_step is None:  # built by `experiment.build`: the host step
            object.__setattr__(self, "train_step", self.host_train_step)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in registry.SPLITS if self.env.factory_for(s) is not None)

    def pool(self, split: str) -> host.HostPool:
        if split not in self.pools:
            factory = self.env.factory_for(split)
            if factory is None:
                raise ValueError(
                    f"split={split!r}: env.host.factory={self.env.factory!r} has no such split; "
                    f"allowed: {list(self.splits)}"
                )
            h = self.config.env.host
            self.pools[split] = host.HostPool(
                factory,
                max_prompt_len=h.max_prompt_len,
                max_obs_len=h.max_obs_len,
                num_workers=h.num_workers,
                step_timeout_s=h.step_timeout_s,
                failure_reward=h.failure_reward,
            )
        return self.pools[split]

    def host_train_step(self, state, key_root: jax.Array):
        """`(state, key_root) -> (state, metrics)`: `host.train.host_train_step` on the training
        pool (rollout from training seeds, then the jitted update on the mesh)."""
        state, metrics, _ = host.train.host_train_step(
            state, key_root, self.pool("train"), self.env.tokenizer, self.step_cfg, self._update
        )
        return state, metrics

    @functools.cached_property
    def _update(self):
        rep = sharding.replicated(self.mesh)
        return jax.jit(
            functools.partial(step_lib.update, cfg=self.step_cfg),
            out_shardings=(self.state_shardings, rep),
            donate_argnums=(0,),
        )

    def eval_fn(self, split: str, num_tasks: int):
        """`(params, seed) -> metrics` on `num_tasks` fixed games of `split` (seeded by `seed`),
        greedy then sampled, as `Experiment.eval_fn` reports them."""
        pool = self.pool(split)

        def run(params, seed):
            root = jax.random.key(seed)
            seeds = registry.split_seeds(
                host.task_seeds(jax.random.fold_in(root, 0), num_tasks), split
            )
            out = {}
            for mode in experiment_lib.EVAL_MODES:
                traj = host.host_rollout(
                    jax.random.fold_in(root, 1),
                    self.step_cfg.graphdef,
                    params,
                    pool,
                    self.env.tokenizer,
                    self.eval_rollout_config(split, mode == "greedy", num_tasks),
                    seeds,
                )
                m = step_lib.rollout_metrics(traj, 1)
                out.update({f"{mode}_{k}": m[k] for k in experiment_lib.EVAL_KEYS})
            return out

        return run

    def close(self) -> None:
        """Close the environment pools (their worker threads)."""
        for p in self.pools.values():
            p.close()
        self.pools.clear()
