"""Resolve a config into an `Experiment`: validated, static, ready to jit.

Every check happens here, at start-up, and raises one `ValueError` naming the field, the bad
value and what is allowed. Nothing in a ConfigDict enters jitted code.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from rl4agents import checks, config_utils, credit, envs, losses, memory, sharding, text
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
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
    "loss.kl_coef",
    "loss.kl_ctrl",  # "adaptive" keeps beta in the training state
    "optim.grad_clip",
    "optim.weight_decay",
    "seed",  # a resumed run replays the randomness of the uninterrupted one
)
# Compat keys added after runs were saved: the value such a run had (`Checkpointer`).
COMPAT_DEFAULTS = {"loss.kl_ctrl": "fixed"}  # runs saved before the adaptive controller

# Evaluation metrics (`step.evaluate`), reported per decoding mode as "{mode}_{key}".
EVAL_KEYS = step_lib.EVAL_KEYS
EVAL_MODES = ("greedy", "sampled")
# What a warm start (config.init.params) must share with the run that saved the parameters.
INIT_COMPAT_KEYS = tuple(k for k in COMPAT_KEYS if k.startswith(("env.", "model.")))

# Estimators that compare the samples of one task: they need group_size >= 2.
GROUP_ESTIMATORS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp_baseline",
    "gigpo",
    "mt_grpo",
    "empg",
    "opo",
)


@dataclasses.dataclass(frozen=True)
class Experiment:
    config: ml_collections.ConfigDict
    env: Any
    model_cfg: policy_lib.ModelConfig
    step_cfg: step_lib.StepConfig
    mesh: jax.sharding.Mesh
    train_step: Any  # jitted (state, key_root) -> (state, metrics)

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

    def pretrained_params(self) -> Any:
        """The policy parameters of `model.checkpoint`, placed in their training shardings.

        A shared value head starts at zero; a separate critic starts as a copy of the trunk.
        """
        from rl4agents.models import hf

        c = self.config.model
        policy, _ = hf.load_pretrained(
            _checkpoint(self.config),
            mesh=self.mesh,
            value_head=c.value_head,
            dtype=c.dtype,
            param_dtype=c.param_dtype,
            remat=c.remat,
            attn_chunk=c.attn_chunk,
        )
        params = nnx.split(policy)[1]
        target = self.abstract_state().params
        if jax.tree.structure(params) != jax.tree.structure(target):
            raise ValueError(
                f"model.checkpoint={_checkpoint(self.config)!r}: loaded parameters do not "
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

    def eval_fn(self, split: str, num_tasks: int):
        """A jitted `(params, seed) -> metrics` on `num_tasks` fixed tasks of `split`: greedy
        then sampled decoding of the same tasks, as `{"greedy_success": f32[], ...,
        "sampled_success": f32[], ...}` (the keys of `EVAL_KEYS` under each mode).

        One compiled program serves both modes (the greedy flag is traced; the two rollouts
        run one after the other, so memory is that of one). Splits served by the training env
        itself (train and test: they differ only in the env params' layout class) share it
        too; the env params are its argument.
        """
        env, env_params = self.env.make_split(split)
        rc = self.eval_rollout_config(split, False, num_tasks)
        shared = env is self.env
        cache_key = (None if shared else split, rc)
        if cache_key not in self._eval_fns:
            check_batch(num_tasks, 1, self.mesh, field="train.eval_tasks")

            def run(params, seed, env_params):
                root = jax.random.key(seed)
                task_keys = jax.random.split(jax.random.fold_in(root, 0), num_tasks)

                def one(greedy):
                    return step_lib.evaluate(
                        params,
                        task_keys,
                        jax.random.fold_in(root, 1),
                        self.step_cfg,
                        env,
                        env_params,
                        rc,
                        greedy=greedy,
                    )

                m = jax.lax.map(one, jnp.array([True, False]))
                return {
                    f"{mode}_{k}": m[k][i] for i, mode in enumerate(EVAL_MODES) for k in EVAL_KEYS
                }

            self._eval_fns[cache_key] = jax.jit(run)
        return functools.partial(self._eval_fns[cache_key], env_params=env_params)


def make_state(
    model_cfg: policy_lib.ModelConfig, step_cfg: step_lib.StepConfig, key: jax.Array
) -> state_lib.TrainState:
    """A fresh training state (pure; jit it with `out_shardings` to create it sharded)."""
    model = policy_lib.Policy(model_cfg, nnx.Rngs(key))
    _, params = nnx.split(model)
    # A separate copy: the train step donates its state, and a buffer cannot be donated twice.
    ref = jax.tree.map(jnp.copy, params) if step_cfg.loss.kl_coef > 0 else None
    return state_lib.TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=step_cfg.optimizer.init(params),
        ref_params=ref,
        kl_coef=step_lib.initial_kl_coef(step_cfg.loss),
    )


def state_shardings(
    model_cfg: policy_lib.ModelConfig, step_cfg: step_lib.StepConfig, mesh
) -> state_lib.TrainState:
    """The training state's NamedShardings under the logical-axis rules of `sharding`."""
    shapes = jax.eval_shape(functools.partial(make_state, model_cfg, step_cfg), jax.random.key(0))
    return sharding.tree_shardings(shapes, mesh)


def check_batch(batch: int, group: int, mesh, field: str) -> None:
    div = sharding.batch_size_divisor(mesh)
    if batch % div:
        raise ValueError(
            f"{field}: batch of {batch} episodes is not divisible by the mesh's data size "
            f"{div} (mesh {dict(mesh.shape)}); allowed: multiples of {div}"
        )
    # Groups may straddle devices (GSPMD reduces across them); a per-device batch that is a
    # multiple of the group size keeps group statistics local, which is faster.


_ARCH_FIELDS = ("d_model", "num_layers", "d_ff", "num_heads", "num_kv_heads", "head_dim")


def _checkpoint(c: ml_collections.ConfigDict) -> str:
    """The local pretrained-model folder of `model.checkpoint`, or ""."""
    return c.model.get("checkpoint", "")


def _model_config(c: ml_collections.ConfigDict, vocab_size: int) -> policy_lib.ModelConfig:
    overrides = {k: c.model[k] for k in _ARCH_FIELDS if c.model[k]}
    folder = _checkpoint(c)
    if folder:  # the architecture comes from the checkpoint's config.json
        from rl4agents.models import hf

        if overrides:
            raise ValueError(
                f"model.{next(iter(overrides))}={next(iter(overrides.values()))} conflicts "
                f"with model.checkpoint={folder!r}: the architecture comes from its "
                "config.json; allowed: 0 (unset)"
            )
        cfg = hf.config_from_hf(
            hf.read_config(folder),
            value_head=c.model.value_head,
            dtype=c.model.dtype,
            param_dtype=c.model.param_dtype,
            remat=c.model.remat,
            attn_chunk=c.model.attn_chunk,
        )
        if cfg.vocab_size != vocab_size:
            raise ValueError(
                f"model.checkpoint={folder!r}: config.json vocab_size {cfg.vocab_size} differs "
                f"from its tokenizer's {vocab_size}"
            )
        return cfg
    return policy_lib.make_config(
        c.model.preset,
        vocab_size,
        value_head=c.model.value_head,
        dtype=c.model.dtype,
        param_dtype=c.model.param_dtype,
        remat=c.model.remat,
        attn_chunk=c.model.attn_chunk,
        **overrides,
    )


# Ranges of the scalar fields of the base config (`checks.check_range` arguments after the
# value): each is checked at start-up, before anything is built or written.
_RANGES: dict[str, dict[str, Any]] = {
    "train.num_steps": dict(low=1),
    "train.epochs": dict(low=1),
    "train.minibatches": dict(low=1),
    "train.grad_accum": dict(low=1),
    "train.eval_every": dict(low=1),
    "train.eval_tasks": dict(low=1),
    "train.max_minutes": dict(low=0, note="(0 = no limit)"),
    "train.ood_max_turns": dict(low=0, note="(0 = rollout.max_turns)"),
    "checkpoint.every": dict(low=1),
    "checkpoint.max_to_keep": dict(low=1),
    "log.every": dict(low=1),
    "optim.lr": dict(low=0, low_open=True),
    "optim.b1": dict(low=0, high=1, high_open=True),
    "optim.b2": dict(low=0, high=1, high_open=True),
    "optim.grad_clip": dict(low=0, note="(0 = off)"),
    "optim.weight_decay": dict(low=0),
    "optim.warmup_steps": dict(low=0),
    "model.d_model": dict(low=0, note="(0 = the preset's)"),
    "model.num_layers": dict(low=0, note="(0 = the preset's)"),
    "model.d_ff": dict(low=0, note="(0 = the preset's)"),
    "model.num_heads": dict(low=0, note="(0 = the preset's)"),
    "model.num_kv_heads": dict(low=0, note="(0 = the preset's)"),
    "model.head_dim": dict(low=0, note="(0 = the preset's)"),
    "rollout.num_tasks": dict(low=1),
    "rollout.group_size": dict(low=1),
    "rollout.max_turns": dict(low=1),
    "rollout.max_action_len": dict(low=1),
    "rollout.temperature": dict(low=0, low_open=True),
    "rollout.turn_groups": dict(low=1),
    "rollout.max_episode_tokens": dict(low=0, note="(0 = none)"),
    "rollout.top_k": dict(low=0, note="(0 = off)"),
    "rollout.top_p": dict(low=0, high=1, low_open=True),
    "rollout.max_context_len": dict(low=0, note="(0 = fit all K turns)"),
    "loss.value_coef": dict(low=0),
    # 0 would clip V to V_old: the critic could not learn. None turns the clipping off.
    "loss.value_clip": dict(low=0, low_open=True, allow_none=True, note="(None = no clipping)"),
    "loss.kl_coef": dict(low=0),
    "loss.entropy_coef": dict(low=0),
    "loss.echo_coef": dict(low=0),
    "loss.tis_cap": dict(low=0, note="(0 = off, else >= 1)"),
    "loss.kl_target": dict(low=0, low_open=True),
    "loss.kl_horizon": dict(low=0, low_open=True),
    "shaping.overlong_buffer": dict(low=0, note="(0 = off)"),
    "shaping.overlong_factor": dict(low=0),
    "sampling.max_gen_batches": dict(low=1),
    "mesh.device_memory_gb": dict(low=0, note="(0 = what the runtime reports)"),
}


def check_ranges(c: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first field of `_RANGES` outside its range, then the
    first field anywhere that fails the checks of every field (`config_utils.check_values`:
    finite floats, 32-bit seeds, int32 integers, bounded model sizes)."""
    for dotted, bounds in _RANGES.items():
        section, field = dotted.split(".")
        if section in c and field in c[section]:
            checks.check_range(dotted, c[section][field], **bounds)
    config_utils.check_values(c)


def build(
    config: ml_collections.ConfigDict, mesh=None, *, check_only: bool = False
) -> Experiment | None:
    """Validate `config` and build the environment, model config, step config and jitted step.

    Args:
      config: a full config (configs/base.py).
      mesh: a mesh overriding `config.mesh`.
      check_only: run the checks that need no devices and no model, then return None (a
        sweep checks every run's config before any starts): the batch split is checked
        against the mesh's shape alone, and not at all when a batch axis is -1.

    Raises:
      ValueError, KeyError: a bad value, naming the field and what is allowed.
    """
    c = config
    check_ranges(c)
    # Environment: a registered JAX environment, or Python text environments on the host.
    is_host = c.env.name == "host"
    if not is_host:
        config_utils.check_choice("env.name", c.env.name, envs.registry.names() + ["host"])
        env_kwargs = envs.registry.validate(c.env.name, config_utils.to_dict(c.env[c.env.name]))
    config_utils.check_choice("env.vocab", c.env.vocab, ("builtin", "minimal"))
    tokenizer = None
    if _checkpoint(c):  # a real model: its tokenizer encodes every environment fragment
        from rl4agents.models import hf_tokenizer

        if c.env.vocab != "builtin":
            raise ValueError(
                f"env.vocab={c.env.vocab!r} with model.checkpoint={_checkpoint(c)!r}: the "
                "checkpoint's own tokenizer is used; allowed: 'builtin' (the default)"
            )
        tokenizer = hf_tokenizer.HFTokenizer(_checkpoint(c))
    if is_host:
        from rl4agents.train import host_run

        env = host_run.make_env(c, tokenizer)
    else:
        if tokenizer is not None:
            env_kwargs = {**env_kwargs, "tokenizer": tokenizer}
        env = envs.make(c.env.name, **env_kwargs)
        if c.env.vocab == "minimal":
            env = envs.make(c.env.name, tokenizer=text.minimal_tokenizer(env), **env_kwargs)
    # Model.
    model_cfg = _model_config(c, env.tokenizer.vocab_size)
    # Credit.
    config_utils.check_choice("credit.name", c.credit.name, credit.names())
    credit_kw = credit.validate(c.credit.name, config_utils.to_dict(c.credit[c.credit.name]))
    needs_values = credit.requires_values(c.credit.name)
    if needs_values and model_cfg.value_head == "none":
        raise ValueError(
            f"credit.name={c.credit.name!r} needs a critic but model.value_head='none'; "
            "allowed: 'shared' or 'separate'"
        )
    if c.credit.name in GROUP_ESTIMATORS and c.rollout.group_size < 2:
        raise ValueError(
            f"rollout.group_size={c.rollout.group_size} is below 2, but "
            f"credit.name={c.credit.name!r} needs groups of at least 2 samples per task; "
            "allowed: >= 2"
        )
    # Loss.
    config_utils.check_choice("loss.policy", c.loss.policy, losses.names())
    policy_kw = losses.validate(c.loss.policy, config_utils.to_dict(c.loss[c.loss.policy]))
    config_utils.check_choice("loss.kl_estimator", c.loss.kl_estimator, losses.KL_KINDS)
    config_utils.check_choice(
        "loss.kl_reward_estimator", c.loss.kl_reward_estimator, losses.KL_KINDS
    )
    config_utils.check_choice("loss.tis_mode", c.loss.tis_mode, ("token", "sequence"))
    config_utils.check_choice("loss.kl_ctrl", c.loss.kl_ctrl, ("fixed", "adaptive"))
    if c.loss.kl_ctrl == "adaptive" and not (c.loss.kl_in_reward and c.loss.kl_coef > 0):
        raise ValueError(
            f"loss.kl_ctrl='adaptive' adapts the KL in the reward, but loss.kl_in_reward="
            f"{c.loss.kl_in_reward} and loss.kl_coef={c.loss.kl_coef}; allowed: "
            "loss.kl_in_reward=True with loss.kl_coef > 0 (the starting beta), or kl_ctrl='fixed'"
        )
    for field in ("echo_coef", "tis_cap", "kl_coef", "entropy_coef"):
        if c.loss[field] < 0:
            raise ValueError(f"loss.{field}={c.loss[field]}; allowed: >= 0")
    if 0 < c.loss.tis_cap < 1:
        raise ValueError(f"loss.tis_cap={c.loss.tis_cap}; allowed: 0 (off) or >= 1")
    policy_fn = losses.get(c.loss.policy)
    loss_cfg = step_lib.LossConfig(
        policy_fn=functools.partial(policy_fn, **policy_kw),
        agg=policy_kw.get("agg", "token-mean"),
        agg_scale=policy_kw.get("agg_scale"),
        entropy_coef=c.loss.entropy_coef,
        kl_coef=c.loss.kl_coef,
        kl_estimator=c.loss.kl_estimator,
        kl_in_reward=c.loss.kl_in_reward,
        kl_reward_estimator=c.loss.kl_reward_estimator,
        kl_ctrl=c.loss.kl_ctrl,
        kl_target=c.loss.kl_target,
        kl_horizon=c.loss.kl_horizon,
        value_coef=c.loss.value_coef,
        value_clip=c.loss.value_clip,
        echo_coef=c.loss.echo_coef,
        tis_cap=c.loss.tis_cap,
        tis_mode=c.loss.tis_mode,
        policy_takes_segments="segment_ids" in inspect.signature(policy_fn).parameters,
    )
    # Shaping and batch-level sampling.
    config_utils.check_choice("shaping.overlong_per", c.shaping.overlong_per, ("turn", "episode"))
    if c.shaping.overlong_buffer < 0:
        raise ValueError(
            f"shaping.overlong_buffer={c.shaping.overlong_buffer}; allowed: >= 0 (0 = off)"
        )
    shaping_cfg = step_lib.ShapingConfig(
        overlong_buffer=c.shaping.overlong_buffer,
        overlong_factor=c.shaping.overlong_factor,
        overlong_per=c.shaping.overlong_per,
    )
    if c.sampling.max_gen_batches < 1:
        raise ValueError(f"sampling.max_gen_batches={c.sampling.max_gen_batches}; allowed: >= 1")
    if c.sampling.dynamic and c.rollout.group_size < 2:
        raise ValueError(
            f"sampling.dynamic=True needs rollout.group_size >= 2 (a group of one sample is "
            f"never informative), got rollout.group_size={c.rollout.group_size}; allowed: "
            "rollout.group_size >= 2 or sampling.dynamic=False"
        )
    needs_greedy = credit.requires_greedy(c.credit.name)
    if c.sampling.dynamic and needs_greedy:
        raise ValueError(
            f"sampling.dynamic=True cannot be combined with credit.name={c.credit.name!r} "
            "(its greedy baseline needs the tasks of one batch); allowed: sampling.dynamic=False"
        )
    if is_host:
        host_run.check_config(c, needs_greedy)
    sampling_cfg = step_lib.SamplingConfig(
        dynamic=c.sampling.dynamic, max_gen_batches=c.sampling.max_gen_batches
    )
    # Rollout and mesh.
    for field in ("num_tasks", "group_size", "max_turns", "max_action_len"):
        if c.rollout[field] < 1:
            raise ValueError(f"rollout.{field}={c.rollout[field]}; allowed: >= 1")
    config_utils.check_choice("rollout.context", c.rollout.context, ("full", "window"))
    if c.rollout.context == "window" and c.rollout.window_turns < 1:
        raise ValueError(f"rollout.window_turns={c.rollout.window_turns}; allowed: >= 1")
    if c.rollout.turn_groups < 1:
        raise ValueError(f"rollout.turn_groups={c.rollout.turn_groups}; allowed: >= 1")
    if c.rollout.max_episode_tokens < 0:
        raise ValueError(
            f"rollout.max_episode_tokens={c.rollout.max_episode_tokens}; allowed: >= 0 (0 = none)"
        )
    if c.rollout.context == "window" and c.sampling.dynamic:
        raise ValueError(
            "sampling.dynamic=True is not supported with rollout.context='window'; "
            "allowed: rollout.context='full' or sampling.dynamic=False"
        )
    if c.rollout.temperature <= 0:
        raise ValueError(f"rollout.temperature={c.rollout.temperature}; allowed: > 0")
    rollout_cfg = rollout_lib.RolloutConfig(
        num_tasks=c.rollout.num_tasks,
        group_size=c.rollout.group_size,
        max_turns=c.rollout.max_turns,
        max_action_len=c.rollout.max_action_len,
        temperature=c.rollout.temperature,
        top_k=c.rollout.top_k,
        top_p=c.rollout.top_p,
        max_context_len=c.rollout.max_context_len,
        context=c.rollout.context,
        window_turns=c.rollout.window_turns,
        max_episode_tokens=c.rollout.max_episode_tokens,
        turn_groups=c.rollout.turn_groups,
    )
    layout = rollout_lib.make_layout(env, rollout_cfg)  # raises if one turn does not fit
    if mesh is None and check_only:
        sharding.check_mesh_shape(c.mesh.axes, c.mesh.shape, c.mesh.axis_types)
        shape_only = sharding.abstract_mesh(c.mesh.axes, c.mesh.shape)
        if shape_only is not None:
            check_batch(
                rollout_cfg.batch_size, rollout_cfg.group_size, shape_only, "rollout.num_tasks"
            )
    else:
        if mesh is None:
            mesh = sharding.make_mesh(c.mesh.axes, c.mesh.shape, c.mesh.axis_types)
        check_batch(rollout_cfg.batch_size, rollout_cfg.group_size, mesh, "rollout.num_tasks")
    grad_accum = c.train.get("grad_accum", 1)
    minibatch = rollout_cfg.batch_size // max(c.train.minibatches, 1)
    if grad_accum < 1 or minibatch % grad_accum:
        raise ValueError(
            f"train.grad_accum={grad_accum} does not divide the minibatch of {minibatch} "
            "episodes (batch / train.minibatches); allowed: a divisor of it, >= 1"
        )
    if rollout_cfg.batch_size % c.train.minibatches:
        raise ValueError(
            f"train.minibatches={c.train.minibatches} does not divide the batch of "
            f"{rollout_cfg.batch_size} episodes; allowed: a divisor of it"
        )
    optimizer = state_lib.make_optimizer(
        lr=c.optim.lr,
        b1=c.optim.b1,
        b2=c.optim.b2,
        weight_decay=c.optim.weight_decay,
        grad_clip=c.optim.grad_clip,
        warmup_steps=c.optim.warmup_steps,
        schedule=c.optim.schedule,
        total_steps=c.train.num_steps * c.train.epochs * c.train.minibatches,
    )
    if shaping_cfg.overlong_buffer:
        limit = (
            layout.action if shaping_cfg.overlong_per == "turn" else layout.turns * layout.action
        )
        if shaping_cfg.overlong_buffer > limit:
            raise ValueError(
                f"shaping.overlong_buffer={shaping_cfg.overlong_buffer} exceeds the maximum "
                f"{shaping_cfg.overlong_per} length of {limit} action tokens; "
                f"allowed: 0 (off) or 1..{limit}"
            )
    if check_only:
        return None
    # The memory estimate before the model is built: a size that cannot fit is refused in a
    # second, not after minutes of tracing its layers.
    memory.check_fits(
        c,
        mesh.size,
        memory.device_memory(c),
        mesh_shape=dict(mesh.shape),
        env=env,
        model_cfg=model_cfg,
    )
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(model_cfg, nnx.Rngs(0))))
    step_cfg = step_lib.StepConfig(
        graphdef=graphdef,
        env=env,
        env_params=env.default_params("train"),
        rollout=rollout_cfg,
        credit_fn=functools.partial(credit.get(c.credit.name), **credit_kw),
        needs_values=needs_values,
        loss=loss_cfg,
        optimizer=optimizer,
        epochs=c.train.epochs,
        minibatches=c.train.minibatches,
        mesh=mesh,
        needs_greedy=needs_greedy,
        grad_accum=grad_accum,
        shaping=shaping_cfg,
        sampling=sampling_cfg,
        # host episodes come from Python environments: their group's prompts are not
        # guaranteed equal, so the update does not share them
        shared_prompt=(layout.prompt if c.train.get("share_prompt", True) and not is_host else 0),
    )
    if is_host:  # its train step is the host rollout, then the jitted update
        return host_run.HostExperiment(c, env, model_cfg, step_cfg, mesh, None)
    state_sh = state_shardings(model_cfg, step_cfg, mesh)
    return Experiment(c, env, model_cfg, step_cfg, mesh, jit_train_step(step_cfg, mesh, state_sh))


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
