"""The "host" rollout backend: training on host (Python) text environments.

An environment registered with `backend="host"` (`env.name="host"`, `envs.host.HostEnv`) is
resolved like any other (`resolve.resolve`: model, credit, loss, optimizer, mesh) and built
into a `HostExperiment`: the same interface `train.loop.run` and scripts/eval.py drive (train
step, evaluation, state), so progress bars, evaluation, JSONL/TensorBoard metrics, curves,
checkpoints and exact resume work unchanged. Its train step (`host_train_step`) is
`rollout.host.host_rollout_info` (each turn's sampling one jitted program, the environments
stepped on worker threads) followed by the jitted learning half of the train step
(`train.step.update`), on the config's mesh.

Per-step randomness derives from `fold_in(root, state.step)`, and training resets its games
from even seeds while the held-out splits use odd ones (`registry.split_seeds`), so a resumed
run replays exactly what an uninterrupted one does, as long as the games are deterministic
given their seeds.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import ml_collections

from rl4agents import credit, sharding
from rl4agents.envs import host
from rl4agents.envs.host import registry
from rl4agents.rollout import host as host_rollout
from rl4agents.train import experiment as experiment_lib
from rl4agents.train import resolve as resolve_lib
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib


def check_config(c: ml_collections.ConfigDict) -> None:
    """What the jitted rollout offers and host rollouts do not; each raises a ValueError."""
    if c.rollout.context != "full":
        raise ValueError(
            f"rollout.context={c.rollout.context!r} with env.name={c.env.name!r}; allowed: 'full'"
        )
    if c.sampling.dynamic:
        raise ValueError(f"sampling.dynamic=True with env.name={c.env.name!r}; allowed: False")
    if credit.requires_greedy(c.credit.name):
        raise ValueError(
            f"credit.name={c.credit.name!r} needs greedy rollouts, which host environments "
            "do not run; allowed: an estimator without a greedy baseline"
        )
    if jax.process_count() > 1:
        raise ValueError(
            f"env.name={c.env.name!r} runs in one process (got {jax.process_count()}); allowed: 1"
        )


def jit_update(cfg: step_lib.StepConfig, out_shardings=None):
    """`update` jitted: `(state, traj, key_perm) -> (state, metrics)`, the state donated."""
    kw = {} if out_shardings is None else {"out_shardings": out_shardings}
    return jax.jit(functools.partial(step_lib.update, cfg=cfg), donate_argnums=(0,), **kw)


def host_train_step(
    state: state_lib.TrainState,
    key_root: jax.Array,
    pool: host.HostPool,
    tokenizer,
    cfg: step_lib.StepConfig,
    update_fn,
) -> tuple[state_lib.TrainState, dict[str, float], host_rollout.HostInfo]:
    """One RL iteration on host environments: `host_rollout`, then `update_fn`.

    Args:
      state: the training state (donated to `update_fn`).
      key_root: the run's root key; the step's key is `fold_in(key_root, state.step)`, and
        the games reset from training seeds (`registry.split_seeds`: even; held-out splits
        use odd ones).
      pool: the environments.
      tokenizer: the run's tokenizer.
      cfg: the step configuration (`resolve.step_config` with the pool's `HostSpec`).
      update_fn: `jit_update(cfg)`, built once and reused (one compilation).

    Returns:
      The new state, a flat dict of float metrics (the update's and `HostInfo.metrics()`),
      and the rollout's `HostInfo`.
    """
    key = jax.random.fold_in(key_root, jax.device_get(state.step))
    key_rollout, key_perm = jax.random.split(key)
    seeds = registry.split_seeds(
        host_rollout.task_seeds(key_rollout, cfg.rollout.num_tasks), "train"
    )
    traj, info = host_rollout.host_rollout_info(
        key_rollout, cfg.graphdef, state.params, pool, tokenizer, cfg.rollout, seeds
    )
    state, metrics = update_fn(state, traj, key_perm)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return state, {**metrics, **info.metrics()}, info


@dataclasses.dataclass(frozen=True)
class HostExperiment(experiment_lib.Experiment):
    """An `Experiment` whose episodes come from host environments (see the module doc)."""

    pools: dict = dataclasses.field(default_factory=dict)  # split -> HostPool, made on first use

    def __post_init__(self):
        if self.train_step is None:  # built by `experiment.build`: the host step
            object.__setattr__(self, "train_step", self.host_train_step)

    @property
    def env_label(self) -> str:
        """The environment's name in messages: "host:<factory>"."""
        return f"{self.config.env.name}:{self.env.factory}"

    @property
    def splits(self) -> tuple[str, ...]:
        return self.env.splits

    def pool(self, split: str) -> host.HostPool:
        """The environments of `split`, made on first use (`HostEnv.make_pool`)."""
        if split not in self.pools:
            self.pools[split] = self.env.make_pool(split)
        return self.pools[split]

    def host_train_step(self, state, key_root: jax.Array):
        """`(state, key_root) -> (state, metrics)`: `host_train_step` on the training pool
        (rollout from training seeds, then the jitted update on the mesh)."""
        state, metrics, _ = host_train_step(
            state, key_root, self.pool("train"), self.env.tokenizer, self.step_cfg, self._update
        )
        return state, metrics

    @functools.cached_property
    def _update(self):
        rep = sharding.replicated(self.mesh)
        return jit_update(self.step_cfg, out_shardings=(self.state_shardings, rep))

    def eval_fn(self, split: str, num_tasks: int):
        """`(params, seed) -> metrics` on `num_tasks` fixed games of `split` (seeded by `seed`),
        greedy then sampled, as `Experiment.eval_fn` reports them."""
        pool = self.pool(split)

        def run(params, seed):
            task_stream, rollout_key = experiment_lib.eval_keys(seed)
            seeds = registry.split_seeds(host_rollout.task_seeds(task_stream, num_tasks), split)
            out = {}
            for mode in experiment_lib.EVAL_MODES:
                traj = host_rollout.host_rollout(
                    rollout_key,
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


@resolve_lib.BACKENDS.register("host", check=check_config, shared_prompts=False)
def build_host(run: resolve_lib.Run) -> HostExperiment:
    """The `HostExperiment` of a host-environment run (its train step is the host one)."""
    return HostExperiment(run.config, run.env, run.model_cfg, run.step_cfg, run.mesh, None)
