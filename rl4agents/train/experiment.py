"""An `Experiment`: a resolved run (`resolve.resolve`) with its jitted programs.

`build(config)` resolves the config (every check at start-up, one `ValueError` naming the
field, the bad value and what is allowed) and hands the `Run` to its rollout backend
(`resolve.BACKENDS`): "jax" builds the `Experiment` here, "host" the `HostExperiment` of
`train.host_run`. Nothing in a ConfigDict enters jitted code.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rl4agents import config_utils, credit, sharding
from rl4agents.models import hf, roles
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import resolve as resolve_lib
from rl4agents.train import sft as sft_lib
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib

# Fields that must match between a checkpoint's config and a resuming run.
COMPAT_KEYS = (
    "env.name",
    "env.vocab",
    "model.preset",
    "model.value_head",
    "model.param_dtype",
    "model.d_model",
    "model.num_layers",
    "model.d_ff",
    "model.num_heads",
    "model.num_kv_heads",
    "model.head_dim",
    "model.role_params",  # R >= 2 stacks R parameter sets on a leading axis
    "model.lora.rank",  # adapters (and which parameters the optimizer state covers)
    "model.chat",  # the token stream of a checkpoint's chat template
    "model.system_prompt",
    "loss.kl_coef",
    "loss.kl_ctrl",  # "adaptive" keeps beta in the training state
    "loss.epo_coef",  # > 0 keeps EPO's running entropy average in the training state
    "train.staleness",  # k > 0 keeps k copies of the parameters (the sampler's) in the state
    "optim.grad_clip",
    "optim.weight_decay",
    "optim.skip_zero_grad",
    "seed",  # a resumed run replays the randomness of the uninterrupted one
)
# Compat keys added after runs were saved: the value such a run had (`Checkpointer`).
# Runs saved before the adaptive controller, EPO, staleness, LoRA, chat framing, role sets and
# the zero-gradient skip.
COMPAT_DEFAULTS = {
    "loss.kl_ctrl": "fixed",
    "loss.epo_coef": 0.0,
    "train.staleness": 0,
    "model.lora.rank": 0,
    "model.chat": "auto",
    "model.system_prompt": "",
    "model.role_params": 0,
    "optim.skip_zero_grad": False,
}

# Evaluation metrics (`step.evaluate`), reported per decoding mode as "{mode}_{key}".
EVAL_KEYS = step_lib.EVAL_KEYS
EVAL_MODES = ("greedy", "sampled")


def eval_keys(seed) -> tuple[jax.Array, jax.Array]:
    """(task stream, rollout key): the two keys of an evaluation seeded by `seed` (an int or
    i32[]). Task i of an N-task evaluation is row i of `jax.random.split(task stream, N)` (the
    host backend derives its integer game seeds from the same stream); the rollout's sampling
    draws from the rollout key. Every evaluation (`Experiment.eval_fn`, `task_outcomes_fn`,
    the host backend's, `scripts/show_episodes.py`) derives its tasks here, so two of them
    with one seed play the same tasks.
    """
    root = jax.random.key(seed)
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


# What a warm start (config.init.params) must share with the run that saved the parameters.
# LoRA and the chat framing are left out: adapters are the run's own, on top of the saved
# (full) parameters, and the framing does not change the parameters' shapes.
_NOT_INIT = ("model.lora.", "model.chat", "model.system_prompt")
INIT_COMPAT_KEYS = tuple(
    k for k in COMPAT_KEYS if k.startswith(("env.", "model.")) and not k.startswith(_NOT_INIT)
)

# Estimators that compare the samples of one task: they need group_size >= 2 (each declares
# `needs_groups` in the credit registry).
GROUP_ESTIMATORS = tuple(n for n in credit.names() if credit.requires_groups(n))


@dataclasses.dataclass(frozen=True)
class Experiment:
    config: ml_collections.ConfigDict
    env: Any
    model_cfg: policy_lib.ModelConfig
    step_cfg: step_lib.StepConfig
    mesh: jax.sharding.Mesh
    train_step: Any  # jitted (state, key_root) -> (state, metrics)

    @property
    def env_label(self) -> str:
        """The environment's name in messages ("frozen_lake")."""
        return self.config.env.name

    @property
    def rollout_cfg(self) -> rollout_lib.RolloutConfig:
        return self.step_cfg.rollout

    @property
    def layout(self) -> rollout_lib.Layout:
        return rollout_lib.make_layout(self.env, self.step_cfg.rollout)

    @property
    def needs_values(self) -> bool:
        return self.step_cfg.needs_values

    @property
    def config_json(self) -> str:
        return self.config.to_json_best_effort(sort_keys=True, indent=2)

    @functools.cached_property
    def state_shardings(self) -> state_lib.TrainState:
        """NamedShardings of the training state on the mesh (`sharding.tree_shardings`)."""
        return state_shardings(self.model_cfg, self.step_cfg, self.mesh)

    def init_state(self, key: jax.Array) -> state_lib.TrainState:
        """Fresh parameters, optimizer state and (when KL is on) the frozen reference copy,
        created directly in their shardings (no device holds a full copy on the way).

        The program is built once per experiment: more states (other seeds) reuse it."""
        return self._init_fn(key)

    @functools.cached_property
    def _init_fn(self):
        make = functools.partial(make_state, self.model_cfg, self.step_cfg)
        return jax.jit(make, out_shardings=self.state_shardings)

    def abstract_state(self) -> state_lib.TrainState:
        """Shapes, dtypes and shardings of the training state (a restore target)."""
        shapes = jax.eval_shape(
            functools.partial(make_state, self.model_cfg, self.step_cfg), jax.random.key(0)
        )
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            shapes,
            self.state_shardings,
        )

    def saved_params(self, directory: str, fresh: Any = None) -> Any:
        """The parameters saved in `directory` (`init.params`: a scripts/sft.py or
        scripts/pretrain.py workdir) placed in this run's shardings (`sft.load_params`, with
        `fresh` and `init.critic` for a value head the saved policy lacks).

        With `model.role_params` = R >= 2 and one saved set, every role's set starts as a copy
        of it, as from a pretrained checkpoint; a saved run with R sets restores as it is.
        """
        target = self.abstract_state().params
        num_roles = self.step_cfg.rollout.role_params
        stored = sft_lib.stored_config_value(directory, "model.role_params", 0)
        keys = INIT_COMPAT_KEYS
        one_set = roles.active(num_roles) and not roles.active(stored)
        if one_set:  # restore one set (no role axis), then stack R copies
            keys = tuple(k for k in keys if k != "model.role_params")
            stacked = target
            target = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(
                    x.shape[1:],
                    x.dtype,
                    sharding=NamedSharding(x.sharding.mesh, P(*x.sharding.spec[1:])),
                ),
                stacked,
            )
        params = sft_lib.load_params(
            directory,
            target,
            self.config_json,
            keys,
            compat_defaults=COMPAT_DEFAULTS,
            fresh=fresh,
            critic_init=self.config.init.get("critic", "fresh"),
        )
        if one_set:
            shardings = jax.tree.map(lambda x: x.sharding, stacked)
            params = jax.device_put(roles.stack(params, num_roles), shardings)
        return params

    def pretrained_params(self) -> Any:
        """The policy parameters of `model.checkpoint`, placed in their training shardings.

        A shared value head starts at zero; a separate critic starts as a copy of the trunk.
        """
        c = self.config.model
        policy, _ = hf.load_pretrained(
            resolve_lib.checkpoint_folder(self.config),
            mesh=self.mesh,
            value_head=c.value_head,
            dtype=c.dtype,
            param_dtype=c.param_dtype,
            remat=c.remat,
            scan_layers=c.get("scan_layers", False),
            attn_chunk=c.attn_chunk,
            logit_chunk=c.get("logit_chunk", 0),
            **resolve_lib.lora_settings(self.config),
        )
        params = nnx.split(policy)[1]
        if roles.active(self.step_cfg.rollout.role_params):  # every role set starts from it
            params = roles.stack(params, self.step_cfg.rollout.role_params)
        target = self.abstract_state().params
        if jax.tree.structure(params) != jax.tree.structure(target):
            raise ValueError(
                f"model.checkpoint={resolve_lib.checkpoint_folder(self.config)!r}: loaded "
                "parameters do not "
                "match the policy's parameter tree"
            )
        return jax.tree.map(lambda x, t: jax.device_put(x, t.sharding), params, target)

    def root_key(self) -> jax.Array:
        return jax.random.key(self.config.seed)

    @property
    def splits(self) -> tuple[str, ...]:
        """The evaluation splits this experiment has."""
        return ("train", "test", "ood")

    def close(self) -> None:
        """Release what the experiment holds outside JAX (nothing here; host env pools)."""

    @functools.cached_property
    def _eval_fns(self) -> dict:
        return {}

    def eval_rollout_config(
        self, split: str, greedy: bool, num_tasks: int
    ) -> rollout_lib.RolloutConfig:
        """The rollout settings of an evaluation: one sample per task, greedy or sampled, and
        `train.ood_max_turns` turns on the OOD split when set."""
        turns = self.config.train.get("ood_max_turns", 0) if split == "ood" else 0
        return dataclasses.replace(
            self.step_cfg.rollout,
            num_tasks=num_tasks,
            group_size=1,
            greedy=greedy,
            max_turns=turns or self.step_cfg.rollout.max_turns,
        )

    def eval_fn(self, split: str, num_tasks: int, swap_roles: bool = False):
        """A jitted `(params, seed) -> metrics` on `num_tasks` fixed tasks of `split`: greedy
        then sampled decoding of the same tasks, as `{"greedy_success": f32[], ...,
        "sampled_success": f32[], ...}` (the keys of `EVAL_KEYS` under each mode).
        `swap_roles`: the swapped-roles control of `model.role_params` >= 2 (`step.evaluate`).

        One compiled program serves both modes (the greedy flag is traced; the two rollouts
        run one after the other, so memory is that of one). Splits served by the training env
        itself (train and test: they differ only in the env params' layout class) share it
        too; the env params are its argument.
        """
        env, env_params = self.env.make_split(split)
        rc = self.eval_rollout_config(split, False, num_tasks)
        shared = env is self.env
        cache_key = (None if shared else split, rc, swap_roles)
        if cache_key not in self._eval_fns:
            check_batch(num_tasks, 1, self.mesh, field="train.eval_tasks")

            def run(params, seed, env_params):
                task_stream, rollout_key = eval_keys(seed)
                task_keys = jax.random.split(task_stream, num_tasks)

                def one(greedy):
                    return step_lib.evaluate(
                        params,
                        task_keys,
                        rollout_key,
                        self.step_cfg,
                        env,
                        env_params,
                        rc,
                        greedy=greedy,
                        swap_roles=swap_roles,
                    )

                m = jax.lax.map(one, jnp.array([True, False]))
                return {
                    f"{mode}_{k}": m[k][i] for i, mode in enumerate(EVAL_MODES) for k in EVAL_KEYS
                }

            self._eval_fns[cache_key] = jax.jit(run)
        return functools.partial(self._eval_fns[cache_key], env_params=env_params)

    def task_outcomes_fn(self, split: str, num_tasks: int, batch: int = 0):
        """A jitted `(params, seed) -> {"greedy_success": f32[N], "sampled_success": f32[N],
        "greedy_reward": f32[N], "sampled_reward": f32[N]}`: the outcome of each of the
        `num_tasks` fixed tasks of `split`, task i in row i.

        The same tasks, keys and decoding as `eval_fn(split, num_tasks)` (whose success rates
        are the means of these rows), so two policies evaluated with one seed are paired task
        by task: what a paired confidence interval of their difference needs.

        `batch` (0 = all `num_tasks` at once; else a divisor of it): play the tasks `batch` at
        a time, one rollout after the other, so memory (the KV cache above all) is that of
        `batch` episodes. Task i is still row i of the same task keys, so greedy rows equal the
        one-batch evaluation's; sampled rows draw from the rollout key folded with the batch's
        index, so they are a different (equally valid) sample, the same for every policy
        evaluated with the same `batch` and seed.
        """
        batch = batch or num_tasks
        if batch < 1 or num_tasks % batch:
            raise ValueError(
                f"batch={batch} for {num_tasks} tasks; allowed: 0 (all at once) or a divisor "
                f"of {num_tasks}"
            )
        chunks = num_tasks // batch
        env, env_params = self.env.make_split(split)
        rc = self.eval_rollout_config(split, False, batch)
        shared = env is self.env
        cache_key = ("per_task", None if shared else split, rc, chunks)
        if cache_key not in self._eval_fns:
            check_batch(batch, 1, self.mesh, field="train.eval_tasks")
            shard_fn = sharding.batch_constraint(self.mesh)

            def play(params, env_params, task_keys, rollout_key):
                def one(greedy):
                    traj = rollout_lib.rollout(
                        rollout_key,
                        self.step_cfg.graphdef,
                        params,
                        env,
                        env_params,
                        rc,
                        task_keys=task_keys,
                        shard_fn=shard_fn,
                        greedy=greedy,
                    )
                    return traj.success.astype(jnp.float32), traj.outcome_reward

                return jax.lax.map(one, jnp.array([True, False]))  # f32[2, batch] each

            def run(params, seed, env_params):
                task_stream, rollout_key = eval_keys(seed)
                task_keys = jax.random.split(task_stream, num_tasks)
                if chunks == 1:
                    success, reward = play(params, env_params, task_keys, rollout_key)
                else:
                    success, reward = jax.lax.map(
                        lambda xs: play(
                            params, env_params, xs[1], jax.random.fold_in(rollout_key, xs[0])
                        ),
                        (jnp.arange(chunks), task_keys.reshape(chunks, batch)),
                    )  # f32[chunks, 2, batch] each
                    success, reward = (
                        jnp.moveaxis(v, 1, 0).reshape(2, num_tasks) for v in (success, reward)
                    )
                return {
                    f"{mode}_{name}": v[i]
                    for i, mode in enumerate(EVAL_MODES)
                    for name, v in (("success", success), ("reward", reward))
                }

            self._eval_fns[cache_key] = jax.jit(run)
        return functools.partial(self._eval_fns[cache_key], env_params=env_params)


def make_state(
    model_cfg: policy_lib.ModelConfig, step_cfg: step_lib.StepConfig, key: jax.Array
) -> state_lib.TrainState:
    """A fresh training state (pure; jit it with `out_shardings` to create it sharded)."""
    model = policy_lib.Policy(model_cfg, nnx.Rngs(key))
    _, params = nnx.split(model)
    if roles.active(step_cfg.rollout.role_params):  # R role sets, all equal at the start
        params = roles.stack(params, step_cfg.rollout.role_params)
    # A separate copy: the train step donates its state, and a buffer cannot be donated twice.
    ref = jax.tree.map(jnp.copy, params) if step_cfg.loss.kl_coef > 0 else None
    return state_lib.TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=step_cfg.optimizer.init(params),
        ref_params=ref,
        kl_coef=step_lib.initial_kl_coef(step_cfg.loss),
        entropy_avg=step_lib.initial_entropy_avg(step_cfg.loss),
        stale_params=step_lib.initial_stale_params(params, step_cfg.staleness),
    )


def state_shardings(
    model_cfg: policy_lib.ModelConfig, step_cfg: step_lib.StepConfig, mesh
) -> state_lib.TrainState:
    """The training state's NamedShardings under the logical-axis rules of `sharding`.

    With `model.role_params` = R >= 2 the parameters, their reference and stale copies and
    AdamW's moments carry a leading role axis: each set is sharded as one set would be, the
    role axis replicated.
    """
    shapes = jax.eval_shape(functools.partial(make_state, model_cfg, step_cfg), jax.random.key(0))
    if not roles.active(step_cfg.rollout.role_params):
        return sharding.tree_shardings(shapes, mesh)
    stacked = ("params", "opt_state", "ref_params", "stale_params")

    def one_set(x):  # the shape of one set's leaf (AdamW's step count has no role axis)
        return jax.ShapeDtypeStruct(x.shape[1:], x.dtype) if x.shape else x

    per_set = {k: jax.tree.map(one_set, getattr(shapes, k)) for k in stacked}
    out = sharding.tree_shardings(shapes.replace(**per_set), mesh)

    def lead(sh, shape):  # a role axis in front of every stacked (non-scalar) leaf
        if not shape.shape:
            return sh
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *sh.spec))

    return out.replace(
        **{k: jax.tree.map(lead, getattr(out, k), getattr(shapes, k)) for k in stacked}
    )


check_batch = resolve_lib.check_batch
# The ranges of the base config's fields, checked at start-up before anything is built.
_RANGES = config_utils.RANGES
check_ranges = config_utils.check_ranges


def build(
    config: ml_collections.ConfigDict, mesh=None, *, check_only: bool = False
) -> Experiment | None:
    """Resolve `config` (`resolve.resolve`) and build its experiment with its rollout backend.

    Args:
      config: a full config (configs/base.py).
      mesh: a mesh overriding `config.mesh`.
      check_only: run the checks that need no devices and no model, then return None (a
        sweep checks every run's config before any starts).

    Raises:
      ValueError, KeyError: a bad value, naming the field and what is allowed.
    """
    run = resolve_lib.resolve(config, mesh, check_only=check_only)
    if check_only:
        return None
    return resolve_lib.BACKENDS.get(run.backend)(run)


@resolve_lib.BACKENDS.register("jax")
def build_jax(run: resolve_lib.Run) -> Experiment:
    """The `Experiment` of a jitted-rollout run: its train step jitted over the mesh."""
    state_sh = state_shardings(run.model_cfg, run.step_cfg, run.mesh)
    train_step = jit_train_step(run.step_cfg, run.mesh, state_sh)
    return Experiment(run.config, run.env, run.model_cfg, run.step_cfg, run.mesh, train_step)


def jit_train_step(step_cfg: step_lib.StepConfig, mesh, state_sh):
    """`train_step` jitted over `mesh`: the state in `state_sh` (`state_shardings`), key and
    metrics replicated, the state donated."""
    rep = sharding.replicated(mesh)
    return jax.jit(
        functools.partial(step_lib.train_step, cfg=step_cfg),
        in_shardings=(state_sh, rep),
        out_shardings=(state_sh, rep),
        donate_argnums=(0,),
    )


def jit_train_step_seeds(step_cfg: step_lib.StepConfig, mesh):
    """`train_step` vmapped over a leading seed axis: S independent runs in one program.

    `(states, key_roots) -> (states, metrics)` where every leaf of `states` and `key_roots`
    (key[S]) has a leading axis of S seeds; the metrics get one too. Each seed's trajectory is
    exactly that of its own `train_step` (tested); on a tiny model this trades S small programs
    for one larger one, which `scripts/bench.py --seeds S` times against S separate steps.
    """
    rep = sharding.replicated(mesh)
    return jax.jit(
        jax.vmap(functools.partial(step_lib.train_step, cfg=step_cfg)),
        in_shardings=(rep, rep),
        out_shardings=(rep, rep),
        donate_argnums=(0,),
    )
