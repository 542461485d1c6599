"""Resolve a config into everything a run needs: the one reader of a run's ConfigDict.

`resolve(config)` checks every field at start-up (one `ValueError` naming the field, the bad
value and what is allowed) and returns a `Run`: the environment and its rollout backend, the
tokenizer, the model config, the rollout config and layout, the mesh and the `StepConfig` of
the train step. Training (`experiment.build`), evaluation, sweep checks
(`check_only=True`), the memory estimate (`memory.estimate(run, ...)`), host-environment runs
and benchmarks (`step_config` with explicit values) all take their pieces from here; nothing
in a ConfigDict enters jitted code.

Facts that follow from a variant's name are declared by the variant where it registers (a
credit estimator's `needs_values`, `needs_greedy`, `needs_groups`; an environment's
`backend`), not derived here. Rollout backends ("jax", "host") register in `BACKENDS` how they
build an experiment and what they refuse (`check`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx

from rl4agents import checks, config_utils, credit, envs, losses, memory, sharding, text
from rl4agents.credit import tree as credit_tree
from rl4agents.envs import base as envs_base
from rl4agents.envs import instructions
from rl4agents.models import chat, hf, hf_tokenizer
from rl4agents.models import lora as lora_lib
from rl4agents.models import policy as policy_lib
from rl4agents.registry import Registry
from rl4agents.rollout import branch as branch_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import sampling as sampling_lib
from rl4agents.train import state as state_lib
from rl4agents.train import step as step_lib

# Rollout backends by name (the `backend` an environment declares in `envs.registry`): each
# entry is `build(run) -> Experiment`, with an optional fact `check(config)` raising a
# ValueError for what the backend does not offer. `experiment` registers "jax", `host_run`
# registers "host".
BACKENDS = Registry("rollout backend")

ARCH_FIELDS = ("d_model", "num_layers", "d_ff", "num_heads", "num_kv_heads", "head_dim")

config_utils.declare_choices("model.preset", sorted(policy_lib.PRESETS))
config_utils.declare_choices("loss.kl_estimator", losses.KL_KINDS)
config_utils.declare_choices("loss.kl_reward_estimator", losses.KL_KINDS)
config_utils.declare_choices("mismatch.name", ["none", *losses.mismatch.names()])
config_utils.declare_choices("sampling.filter", ["none", *sampling_lib.EPISODE_FILTERS.names()])
config_utils.declare_choices("rollout.branch.rule", ["none", *branch_lib.RULES])


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """Everything a run needs, resolved from its config.

    Attributes:
      config: the full config it was resolved from.
      backend: the environment's rollout backend, "jax" or "host" (`envs.registry.backend`).
      env: the training environment (its tokenizer is the run's).
      model_cfg: the policy's `ModelConfig`.
      rollout_cfg: the training rollout's static sizes and sampling settings.
      layout: `rollout.make_layout(env, rollout_cfg)`: the slot layout of an episode.
      needs_values: the credit estimator needs critic values (a value head).
      needs_greedy: the credit estimator needs one greedy episode per task.
      branch: the branching rule of the rollout (`rollout.branch`), or None (off).
      staleness: `train.staleness`, the parameter copies the sampler's ring keeps.
      mesh: the device mesh, or None when resolved with `check_only`.
      step_cfg: the train step's static configuration, or None with `check_only`.
    """

    config: ml_collections.ConfigDict
    backend: str
    env: Any
    model_cfg: policy_lib.ModelConfig
    rollout_cfg: rollout_lib.RolloutConfig
    layout: rollout_lib.Layout
    needs_values: bool
    needs_greedy: bool
    branch: branch_lib.BranchConfig | None = None
    staleness: int = 0
    mesh: jax.sharding.Mesh | None = None
    step_cfg: step_lib.StepConfig | None = None

    @property
    def tokenizer(self) -> Any:
        return self.env.tokenizer

    def split(self, split: str) -> tuple[Any, Any]:
        """`(env, env_params)` of evaluation split `split` ("train", "test", "ood")."""
        return self.env.make_split(split)


def checkpoint_folder(c: ml_collections.ConfigDict) -> str:
    """The local pretrained-model folder of `model.checkpoint`, or ""."""
    return c.model.get("checkpoint", "")


def make_env(c: ml_collections.ConfigDict) -> Any:
    """The environment of `config.env`, with the run's tokenizer: `model.checkpoint`'s when
    set, the environment's minimal one with `env.vocab="minimal"`, else the built-in one.

    Raises:
      ValueError: an unknown `env.name` or `env.vocab`, a field the environment does not
        take, or a vocabulary that does not go with `model.checkpoint`.
    """
    config_utils.check_choice("env.name", c.env.name, envs.registry.names(backend=None))
    config_utils.check_choice("env.vocab", c.env.vocab, ("builtin", "minimal"))
    config_utils.check_choice("model.chat", c.model.get("chat", "auto"), CHAT_MODES)
    kwargs = envs.registry.validate(c.env.name, config_utils.to_dict(c.env[c.env.name]))
    folder = checkpoint_folder(c)
    fmt = None
    if folder:  # a real model: its tokenizer encodes every environment fragment
        if c.env.vocab != "builtin":
            raise ValueError(
                f"env.vocab={c.env.vocab!r} with model.checkpoint={folder!r}: the "
                "checkpoint's own tokenizer is used; allowed: 'builtin' (the default)"
            )
        kwargs = {**kwargs, "tokenizer": hf_tokenizer.HFTokenizer(folder)}
        # Chat: episodes laid out in the checkpoint's chat template (model.chat).
        fmt = chat_format(c, kwargs["tokenizer"])
        kwargs["tokenizer"] = kwargs["tokenizer"] if fmt is None else chat.ChatTokenizer(fmt)
    env = envs.make(c.env.name, **kwargs)
    if fmt is not None and envs.registry.backend(c.env.name) == "jax":
        env = envs_base.ChatEnv(env, fmt.framing())  # host rollouts frame with the tokenizer
    if c.env.vocab == "minimal":
        if not envs.registry.ENVIRONMENTS.attr(c.env.name, "minimal_vocab", True):
            raise ValueError(
                f"env.vocab='minimal' with env.name={c.env.name!r}: its text is open-ended "
                "(no fixed word list); allowed: 'builtin' (or model.checkpoint's tokenizer)"
            )
        env = envs.make(c.env.name, tokenizer=text.minimal_tokenizer(env), **kwargs)
    return env


CHAT_MODES = ("auto", "on", "off")  # model.chat
AUTO_PROMPT = "auto"  # model.system_prompt: the environment's instruction


def system_prompt(c: ml_collections.ConfigDict) -> str:
    """The text of `model.system_prompt`: "auto" is the environment's instruction under its
    config's settings (`rl4agents.envs.instructions`, which names the task, the observation's
    symbols and the exact actions); "" is none; any other value is the text itself.

    Raises:
      KeyError: "auto" for an environment without an instruction (naming those with one).
    """
    text = c.model.get("system_prompt", "")
    if text != AUTO_PROMPT:
        return text
    name = c.env.name
    return instructions.get(name, config_utils.to_dict(c.env.get(name, {}))).text


def chat_format(c: ml_collections.ConfigDict, tokenizer: Any) -> chat.ChatFormat | None:
    """The chat layout of a checkpoint's episodes (`model.chat`, `model.system_prompt`), or
    None: `model.chat="off"`, or "auto" with a tokenizer that has no chat template.

    Raises:
      ValueError: `model.chat` is not one of "auto", "on", "off"; "on" without a chat
        template; or a template whose turns cannot be laid out (`chat.ChatFormat`).
    """
    mode = c.model.get("chat", "auto")
    config_utils.check_choice("model.chat", mode, CHAT_MODES)
    if mode == "off" or (mode == "auto" and tokenizer.chat_template is None):
        return None
    if tokenizer.chat_template is None:
        raise ValueError(
            f"model.chat='on' but {tokenizer.folder} has no chat template; allowed: 'auto' "
            "or 'off' for a checkpoint without one"
        )
    return chat.ChatFormat.from_tokenizer(tokenizer, system_prompt(c))


def model_config(c: ml_collections.ConfigDict, vocab_size: int) -> policy_lib.ModelConfig:
    """The `ModelConfig` of `config.model` for a vocabulary of `vocab_size`.

    Non-zero architecture fields override the preset; with `model.checkpoint` set, the
    architecture comes from that folder's config.json, and an architecture field that is set
    too is refused.
    """
    runtime = dict(
        value_head=c.model.value_head,
        dtype=c.model.dtype,
        param_dtype=c.model.param_dtype,
        remat=c.model.remat,
        scan_layers=c.model.get("scan_layers", False),
        attn_chunk=c.model.attn_chunk,
        logit_chunk=c.model.get("logit_chunk", 0),
    )
    # LoRA: the adapters' settings travel in the ModelConfig (checked there).
    runtime.update(lora_settings(c))
    overrides = {k: c.model[k] for k in ARCH_FIELDS if c.model[k]}
    folder = checkpoint_folder(c)
    if not folder:
        return policy_lib.make_config(c.model.preset, vocab_size, **runtime, **overrides)
    if overrides:
        field, value = next(iter(overrides.items()))
        raise ValueError(
            f"model.{field}={value} conflicts with model.checkpoint={folder!r}: the "
            "architecture comes from its config.json; allowed: 0 (unset)"
        )
    cfg = hf.config_from_hf(hf.read_config(folder), **runtime)
    if cfg.vocab_size != vocab_size:
        raise ValueError(
            f"model.checkpoint={folder!r}: config.json vocab_size {cfg.vocab_size} differs "
            f"from its tokenizer's {vocab_size}"
        )
    return cfg


def lora_settings(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `ModelConfig` LoRA fields of `config.model.lora` (rank 0 = off), checked."""
    section = c.model.get("lora", None)
    if section is None:
        return {}
    targets = section.targets
    targets = tuple(targets) if isinstance(targets, list | tuple) else targets
    lora_lib.check_settings(section.rank, section.alpha, targets)
    if not section.rank:
        return {}
    return dict(lora_rank=section.rank, lora_alpha=float(section.alpha), lora_targets=targets)


def rollout_config(c: ml_collections.ConfigDict) -> rollout_lib.RolloutConfig:
    """The training rollout of `config.rollout`, its fields checked."""
    r = c.rollout
    for field in ("num_tasks", "group_size", "max_turns", "max_action_len"):
        if r[field] < 1:
            raise ValueError(f"rollout.{field}={r[field]}; allowed: >= 1")
    config_utils.check_choice("rollout.context", r.context, ("full", "window"))
    if r.context == "window" and r.window_turns < 1:
        raise ValueError(f"rollout.window_turns={r.window_turns}; allowed: >= 1")
    if r.turn_groups < 1:
        raise ValueError(f"rollout.turn_groups={r.turn_groups}; allowed: >= 1")
    if r.max_episode_tokens < 0:
        raise ValueError(
            f"rollout.max_episode_tokens={r.max_episode_tokens}; allowed: >= 0 (0 = none)"
        )
    if r.temperature <= 0:
        raise ValueError(f"rollout.temperature={r.temperature}; allowed: > 0")
    return rollout_lib.RolloutConfig(
        num_tasks=r.num_tasks,
        group_size=r.group_size,
        max_turns=r.max_turns,
        max_action_len=r.max_action_len,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        max_context_len=r.max_context_len,
        context=r.context,
        window_turns=r.window_turns,
        max_episode_tokens=r.max_episode_tokens,
        turn_groups=r.turn_groups,
        role_params=c.model.get("role_params", 0),
    )


def branch_config(
    c: ml_collections.ConfigDict, lay: rollout_lib.Layout, backend: str
) -> branch_lib.BranchConfig | None:
    """The branching rule of `config.rollout.branch`, checked, or None for rule "none".

    Refuses a credit estimator that reads a tree (`credit.tree.requires_tree`) without
    branching, and with branching what assumes B = num_tasks x group_size episodes in groups
    of G rows: DAPO dynamic sampling, the top-p variance filter and the mutual-information
    proxy. Host environments cannot fork (their state is not a value), and the shared fork
    prefix (`train.share_fork_prefix`, `views.fork_prefix`) plans one level of branches only.
    """
    r = c.rollout.branch
    config_utils.check_choice("rollout.branch.rule", r.rule, ["none", *branch_lib.RULES])
    if r.rule == "none":
        if credit_tree.requires_tree(c.credit.name):
            raise ValueError(
                f"credit.name={c.credit.name!r} reads the tree of a branching rollout, but "
                "rollout.branch.rule='none'; allowed: a rule of "
                f"{list(branch_lib.RULES)} (docs/methods.md, 'Branching rollouts')"
            )
        return None
    turns = r.turns
    bc = branch_lib.BranchConfig(
        rule=r.rule,
        num_branches=r.num_branches,
        turns=tuple(turns) if isinstance(turns, list | tuple) else turns,
        max_forks=r.max_forks,
        entropy_threshold=r.entropy_threshold,
        entropy_tokens=r.entropy_tokens,
        arpo_weight=r.arpo_weight,
        arpo_prob=r.arpo_prob,
        levels=r.get("levels", 1),
    )
    branch_lib.check_config(bc, lay.turns, lay.action)
    if bc.levels > 1 and c.train.get("share_fork_prefix", False):
        raise ValueError(
            f"train.share_fork_prefix=True with rollout.branch.levels={bc.levels}: the shared "
            "prefix plan reads one level of branches after their roots; allowed: "
            "train.share_fork_prefix=False, or rollout.branch.levels=1"
        )
    refused = (
        ("sampling.dynamic", c.sampling.dynamic, c.sampling.dynamic, "False"),
        ("sampling.filter", c.sampling.filter, c.sampling.filter == "top_p_variance", "'none'"),
        ("log.mi_proxy", c.log.mi_proxy, c.log.mi_proxy, "False"),
    )
    for field, value, bad, allowed in refused:
        if bad:
            raise ValueError(
                f"{field}={value!r} with rollout.branch.rule={r.rule!r}: it assumes groups of "
                "rollout.group_size contiguous rows, a branching batch has B x (1 + M x N) "
                f"rows; allowed: {allowed}, or rollout.branch.rule='none'"
            )
    if backend != "jax":
        raise ValueError(
            f"rollout.branch.rule={r.rule!r} with env.name={c.env.name!r} (rollout backend "
            f"{backend!r}); allowed: 'none', forking needs the jitted rollout"
        )
    return bc


def check_role_params(
    c: ml_collections.ConfigDict,
    env: Any,
    model_cfg: policy_lib.ModelConfig,
    backend: str,
    branch: branch_lib.BranchConfig | None,
) -> None:
    """Check `model.role_params` (`models.roles`): 0 or 1 is one shared parameter set; R >= 2
    stacks one set per role, for an environment whose `num_agents` = R agents take turns, and
    refuses what does not yet handle a role axis (LoRA, a value head, branching, host
    environments, ECHO). A warm start from one saved set gives every role a copy of it."""
    num = c.model.get("role_params", 0)
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ValueError(
            f"model.role_params={num!r}; allowed: 0 or 1 (one shared set) or the "
            "environment's number of agents (one set per role)"
        )
    if num < 2:
        return
    agents = getattr(env, "num_agents", 1)
    if agents != num:
        raise ValueError(
            f"model.role_params={num} with env.name={c.env.name!r}, which has {agents} "
            f"agent(s) taking turns; allowed: 0 or 1"
            + (f", or {agents} (one set per agent)" if agents >= 2 else " (no roles)")
        )
    refused = (
        ("model.lora.rank", model_cfg.lora_rank, model_cfg.lora_rank > 0, "0"),
        ("model.value_head", model_cfg.value_head, model_cfg.value_head != "none", "'none'"),
        ("rollout.branch.rule", c.rollout.branch.rule, branch is not None, "'none'"),
        ("loss.echo_coef", c.loss.echo_coef, c.loss.echo_coef > 0, "0"),
    )
    for field, value, bad, allowed in refused:
        if bad:
            raise ValueError(
                f"{field}={value!r} with model.role_params={num}: not supported with one "
                f"parameter set per role; allowed: {allowed}, or model.role_params=0"
            )
    if backend != "jax":
        raise ValueError(
            f"model.role_params={num} with env.name={c.env.name!r} (rollout backend "
            f"{backend!r}); allowed: 0, role sets need the jitted rollout"
        )


def loss_settings(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `LossConfig` fields of `config.loss` other than the policy loss, checked."""
    lc = c.loss
    config_utils.check_choice("loss.kl_estimator", lc.kl_estimator, losses.KL_KINDS)
    config_utils.check_choice("loss.kl_reward_estimator", lc.kl_reward_estimator, losses.KL_KINDS)
    config_utils.check_choice("loss.tis_mode", lc.tis_mode, ("token", "sequence"))
    config_utils.check_choice("loss.kl_ctrl", lc.kl_ctrl, ("fixed", "adaptive"))
    if lc.kl_ctrl == "adaptive" and not (lc.kl_in_reward and lc.kl_coef > 0):
        raise ValueError(
            f"loss.kl_ctrl='adaptive' adapts the KL in the reward, but loss.kl_in_reward="
            f"{lc.kl_in_reward} and loss.kl_coef={lc.kl_coef}; allowed: "
            "loss.kl_in_reward=True with loss.kl_coef > 0 (the starting beta), or kl_ctrl='fixed'"
        )
    for field in ("echo_coef", "tis_cap", "kl_coef", "entropy_coef"):
        if lc[field] < 0:
            raise ValueError(f"loss.{field}={lc[field]}; allowed: >= 0")
    if 0 < lc.tis_cap < 1:
        raise ValueError(f"loss.tis_cap={lc.tis_cap}; allowed: 0 (off) or >= 1")
    checks.check_range("loss.epo_coef", lc.epo_coef, 0.0, note="(0 = off)")
    checks.check_range("loss.epo_decay", lc.epo_decay, 0.0, 1.0, high_open=True)
    checks.check_range("loss.epo_low", lc.epo_low, 0.0, 1.0)
    checks.check_range("loss.epo_high", lc.epo_high, 1.0)
    fields = (
        "entropy_coef",
        "kl_coef",
        "kl_estimator",
        "kl_in_reward",
        "kl_reward_estimator",
        "kl_ctrl",
        "kl_target",
        "kl_horizon",
        "value_coef",
        "value_clip",
        "echo_coef",
        "tis_cap",
        "tis_mode",
        "epo_coef",
        "epo_decay",
        "epo_low",
        "epo_high",
    )
    return {k: lc[k] for k in fields}


def mismatch_settings(c: ml_collections.ConfigDict) -> tuple[str, dict[str, Any]]:
    """`(name, hyperparameters)` of `config.mismatch`, checked: "none" or a correction of
    `losses.mismatch`, not combined with TIS (both reweight by the same ratio)."""
    name = c.mismatch.name
    config_utils.check_choice("mismatch.name", name, ["none", *losses.mismatch.names()])
    if name == "none":
        return name, {}
    if c.loss.tis_cap > 0:
        raise ValueError(
            f"mismatch.name={name!r} with loss.tis_cap={c.loss.tis_cap}: both weight the loss "
            "by the learner/sampler ratio; allowed: loss.tis_cap=0 or mismatch.name='none'"
        )
    return name, losses.mismatch.validate(name, config_utils.to_dict(c.mismatch[name]))


def shaping_config(c: ml_collections.ConfigDict) -> step_lib.ShapingConfig:
    config_utils.check_choice("shaping.overlong_per", c.shaping.overlong_per, ("turn", "episode"))
    if c.shaping.overlong_buffer < 0:
        raise ValueError(
            f"shaping.overlong_buffer={c.shaping.overlong_buffer}; allowed: >= 0 (0 = off)"
        )
    return step_lib.ShapingConfig(
        overlong_buffer=c.shaping.overlong_buffer,
        overlong_factor=c.shaping.overlong_factor,
        overlong_per=c.shaping.overlong_per,
    )


def sampling_config(c: ml_collections.ConfigDict) -> step_lib.SamplingConfig:
    """DAPO dynamic sampling and the episode filter of `config.sampling`, checked."""
    if c.sampling.max_gen_batches < 1:
        raise ValueError(f"sampling.max_gen_batches={c.sampling.max_gen_batches}; allowed: >= 1")
    name = c.sampling.filter
    filters = ["none", *sampling_lib.EPISODE_FILTERS.names()]
    config_utils.check_choice("sampling.filter", name, filters)
    filter_fn = None
    if name != "none":
        hparams = config_utils.to_dict(c.sampling[name])
        bound = sampling_lib.validate_filter(name, hparams, c.rollout.group_size)
        filter_fn = functools.partial(sampling_lib.EPISODE_FILTERS.get(name), **bound)
    return step_lib.SamplingConfig(
        dynamic=c.sampling.dynamic,
        max_gen_batches=c.sampling.max_gen_batches,
        filter_fn=filter_fn,
    )


def optimizer(c: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW of `config.optim` over the run's train.num_steps x epochs x minibatches updates."""
    return state_lib.make_optimizer(
        lr=c.optim.lr,
        b1=c.optim.b1,
        b2=c.optim.b2,
        weight_decay=c.optim.weight_decay,
        grad_clip=c.optim.grad_clip,
        warmup_steps=c.optim.warmup_steps,
        schedule=c.optim.schedule,
        total_steps=c.train.num_steps * c.train.epochs * c.train.minibatches,
        skip_zero_grad=c.optim.skip_zero_grad,
    )


def check_batch(batch: int, group: int, mesh, field: str) -> None:
    """Refuses a batch of `batch` episodes that the mesh's data axes do not divide."""
    del group  # groups may straddle devices (GSPMD reduces across them)
    div = sharding.batch_size_divisor(mesh)
    if batch % div:
        raise ValueError(
            f"{field}: batch of {batch} episodes is not divisible by the mesh's data size "
            f"{div} (mesh {dict(mesh.shape)}); allowed: multiples of {div}"
        )


@functools.lru_cache(maxsize=256)
def _validated(kind: str, name: str, items: tuple) -> tuple:
    """`credit.validate` / `losses.validate` of `name` with the hyperparameters `items`,
    once per distinct value (each traces its function once on abstract inputs)."""
    validate = credit.validate if kind == "credit" else losses.validate
    return tuple(validate(name, dict(items)).items())


def _validate(kind: str, name: str, hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    items = tuple(sorted(dict(hparams or {}).items()))
    try:
        hash(items)
    except TypeError:  # a list-valued field: validate without the cache
        validate = credit.validate if kind == "credit" else losses.validate
        return validate(name, dict(items))
    return dict(_validated(kind, name, items))


def check_credit(
    name: str, hparams: Mapping[str, Any] | None, value_head: str, group_size: int
) -> dict[str, Any]:
    """Checks credit variant `name` against the model and the rollout, from the facts the
    variant declares (`needs_values`, `needs_groups`); returns its bound hyperparameters.

    A critic estimator gets no implicit value head: `model.value_head="none"` with one is
    refused, and configs choose the head from `credit.requires_values(name)`.
    """
    config_utils.check_choice("credit.name", name, credit.names())
    bound = _validate("credit", name, hparams)
    if credit.requires_values(name) and value_head == "none":
        raise ValueError(
            f"credit.name={name!r} needs a critic but model.value_head='none'; "
            "allowed: 'shared' or 'separate'"
        )
    if credit.requires_groups(name) and group_size < 2:
        raise ValueError(
            f"rollout.group_size={group_size} is below 2, but credit.name={name!r} needs "
            "groups of at least 2 samples per task; allowed: >= 2"
        )
    return bound


def step_config(
    env: Any,
    model_cfg: policy_lib.ModelConfig,
    rollout_cfg: rollout_lib.RolloutConfig,
    mesh,
    *,
    credit_name: str = "grpo",
    credit_kwargs: Mapping[str, Any] | None = None,
    policy_loss: str = "ppo_clip",
    policy_kwargs: Mapping[str, Any] | None = None,
    loss: Mapping[str, Any] | None = None,
    optim: optax.GradientTransformation | None = None,
    epochs: int = 1,
    minibatches: int = 1,
    grad_accum: int = 1,
    shaping: step_lib.ShapingConfig | None = None,
    sampling: step_lib.SamplingConfig | None = None,
    shared_prompt: int = 0,
    mismatch: str = "none",
    mismatch_kwargs: Mapping[str, Any] | None = None,
    collapse_metrics: bool = False,
    mi_proxy: bool = False,
    branch: branch_lib.BranchConfig | None = None,
    share_fork_prefix: bool = False,
) -> step_lib.StepConfig:
    """The train step's `StepConfig`: the one place it is built (`resolve` passes a config's
    values; benchmarks and host-environment code pass their own).

    Args:
      env: the environment (or a `HostSpec`: the update reads only its layout sizes).
      model_cfg: the policy.
      rollout_cfg: the training rollout.
      mesh: the device mesh (or None).
      credit_name, credit_kwargs: the credit variant and its hyperparameters.
      policy_loss, policy_kwargs: the policy loss and its hyperparameters.
      loss: other `LossConfig` fields (`loss_settings`); unset ones keep their defaults.
      optim: the optimizer (default: AdamW at lr 1e-3, `state.make_optimizer`).
      epochs, minibatches, grad_accum: passes over a batch, minibatches per pass,
        microbatches per minibatch.
      shaping, sampling: reward shaping and batch-level sampling (defaults: off).
      shared_prompt: prompt slots the update computes once per group (0 = off).
      mismatch, mismatch_kwargs: a masking correction of `losses.mismatch` ("none": off)
        and its hyperparameters.
      collapse_metrics: log the reward spread (`step.reward_spread`).
      mi_proxy: log the prompt-swap mutual-information proxy (`step.prompt_mi_gap`).
      branch: sample with a branching rollout (`rollout.branch`), or None. A credit function
        with the hyperparameter train_on="roots" (vineppo) leaves the branches out of the
        loss (`StepConfig.train_roots_only`).
      share_fork_prefix: with `branch` and `shared_prompt` > 0, the update's teacher-forced
        passes compute each branch row's shared prefix once, in its root's pass
        (`views.fork_prefix`); else under `branch` they share nothing (`shared_prompt` is
        set to 0).

    Raises:
      ValueError: a variant that does not fit the model, the rollout or the batch split, or
        a credit estimator that reads a tree (`credit.tree.requires_tree`) without `branch`.
    """
    if branch is None and credit_tree.requires_tree(credit_name):
        raise ValueError(
            f"credit.name={credit_name!r} reads the tree of a branching rollout, but no "
            "branching rule is set; allowed: a rollout.branch.rule of "
            f"{list(branch_lib.RULES)}, or another credit.name"
        )
    credit_kw = check_credit(
        credit_name, credit_kwargs, model_cfg.value_head, rollout_cfg.group_size
    )
    config_utils.check_choice("loss.policy", policy_loss, losses.names())
    policy_kw = _validate("loss", policy_loss, policy_kwargs)
    policy_fn = losses.get(policy_loss)
    mismatch_fn = None
    if mismatch != "none":
        config_utils.check_choice("mismatch.name", mismatch, losses.mismatch.names())
        mismatch_kw = losses.mismatch.validate(mismatch, dict(mismatch_kwargs or {}))
        mismatch_fn = functools.partial(losses.mismatch.get(mismatch), **mismatch_kw)
    loss_cfg = step_lib.LossConfig(
        policy_fn=functools.partial(policy_fn, **policy_kw),
        agg=policy_kw.get("agg", "token-mean"),
        agg_scale=policy_kw.get("agg_scale"),
        policy_takes_segments="segment_ids" in inspect.signature(policy_fn).parameters,
        mismatch_fn=mismatch_fn,
        **dict(loss or {}),
    )
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(model_cfg, nnx.Rngs(0))))
    return step_lib.StepConfig(
        graphdef=graphdef,
        env=env,
        env_params=env.default_params("train"),
        rollout=rollout_cfg,
        credit_fn=functools.partial(credit.get(credit_name), **credit_kw),
        needs_values=credit.requires_values(credit_name),
        loss=loss_cfg,
        optimizer=optim if optim is not None else state_lib.make_optimizer(lr=1e-3),
        epochs=epochs,
        minibatches=minibatches,
        mesh=mesh,
        needs_greedy=credit.requires_greedy(credit_name),
        grad_accum=grad_accum,
        shaping=shaping or step_lib.ShapingConfig(),
        sampling=sampling or step_lib.SamplingConfig(),
        shared_prompt=shared_prompt if branch is None or share_fork_prefix else 0,
        collapse_metrics=collapse_metrics,
        mi_proxy=mi_proxy,
        branch=branch,
        train_roots_only=branch is not None and credit_kw.get("train_on") == "roots",
    )


def _check_train(c: ml_collections.ConfigDict, rows: int, lay) -> int:
    """Checks the split of a batch of `rows` episodes and the shaping limits; returns
    train.grad_accum."""
    grad_accum = c.train.get("grad_accum", 1)
    minibatch = rows // max(c.train.minibatches, 1)
    if grad_accum < 1 or minibatch % grad_accum:
        raise ValueError(
            f"train.grad_accum={grad_accum} does not divide the minibatch of {minibatch} "
            "episodes (batch / train.minibatches); allowed: a divisor of it, >= 1"
        )
    if rows % c.train.minibatches:
        raise ValueError(
            f"train.minibatches={c.train.minibatches} does not divide the batch of "
            f"{rows} episodes; allowed: a divisor of it"
        )
    buffer, per = c.shaping.overlong_buffer, c.shaping.overlong_per
    if buffer:
        limit = lay.action if per == "turn" else lay.turns * lay.action
        if buffer > limit:
            raise ValueError(
                f"shaping.overlong_buffer={buffer} exceeds the maximum {per} length of "
                f"{limit} action tokens; allowed: 0 (off) or 1..{limit}"
            )
    return grad_accum


def _check_sampling(c: ml_collections.ConfigDict, needs_greedy: bool) -> None:
    if c.sampling.dynamic and c.rollout.group_size < 2:
        raise ValueError(
            f"sampling.dynamic=True needs rollout.group_size >= 2 (a group of one sample is "
            f"never informative), got rollout.group_size={c.rollout.group_size}; allowed: "
            "rollout.group_size >= 2 or sampling.dynamic=False"
        )
    if c.sampling.dynamic and needs_greedy:
        raise ValueError(
            f"sampling.dynamic=True cannot be combined with credit.name={c.credit.name!r} "
            "(its greedy baseline needs the tasks of one batch); allowed: sampling.dynamic=False"
        )
    if c.rollout.context == "window" and c.sampling.dynamic:
        raise ValueError(
            "sampling.dynamic=True is not supported with rollout.context='window'; "
            "allowed: rollout.context='full' or sampling.dynamic=False"
        )
    if c.rollout.context == "window" and c.sampling.filter != "none":
        raise ValueError(
            f"sampling.filter={c.sampling.filter!r} is not supported with "
            "rollout.context='window' (it filters episodes, the update trains on step rows); "
            "allowed: rollout.context='full' or sampling.filter='none'"
        )
    if c.sampling.filter == "top_p_variance" and c.rollout.group_size < 2:
        raise ValueError(
            f"sampling.filter='top_p_variance' ranks groups by reward variance, but "
            f"rollout.group_size={c.rollout.group_size}; allowed: rollout.group_size >= 2"
        )
    if c.log.mi_proxy and c.rollout.context == "window":
        raise ValueError(
            "log.mi_proxy=True swaps the prompt slots of full-history episodes; allowed: "
            "rollout.context='full' or log.mi_proxy=False"
        )
    if c.log.mi_proxy and c.rollout.num_tasks < 2:
        raise ValueError(
            f"log.mi_proxy=True scores each episode under another task's prompt, but "
            f"rollout.num_tasks={c.rollout.num_tasks}; allowed: >= 2, or log.mi_proxy=False"
        )


def staleness_setting(c: ml_collections.ConfigDict, backend: str) -> int:
    """`train.staleness`, checked: a whole number >= 0, and 0 unless the rollout is jitted
    (host environments sample with the current parameters)."""
    k = c.train.get("staleness", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"train.staleness={k!r}; allowed: a whole number >= 0 (0 = off)")
    if k and backend != "jax":
        raise ValueError(
            f"train.staleness={k} with env.name={c.env.name!r} (rollout backend {backend!r}); "
            "allowed: 0, stale sampling needs the jitted rollout"
        )
    return k


def resolve(config: ml_collections.ConfigDict, mesh=None, *, check_only: bool = False) -> Run:
    """Check `config` and resolve it into a `Run`.

    Args:
      config: a full config (configs/base.py).
      mesh: a mesh overriding `config.mesh`.
      check_only: run the checks that need no devices and no model, and return a `Run`
        without mesh and step config (a sweep checks every run's config before any starts):
        the batch split is checked against the mesh's shape alone, and not at all when a batch
        axis is -1; the memory estimate is left to the run.

    Raises:
      ValueError, KeyError: a bad value, naming the field and what is allowed.
    """
    c = config
    config_utils.check_ranges(c)
    env = make_env(c)
    backend = envs.registry.backend(c.env.name)
    model_cfg = model_config(c, env.tokenizer.vocab_size)
    config_utils.check_choice("credit.name", c.credit.name, credit.names())
    credit_kw = config_utils.to_dict(c.credit[c.credit.name])
    check_credit(c.credit.name, credit_kw, model_cfg.value_head, c.rollout.group_size)
    config_utils.check_choice("loss.policy", c.loss.policy, losses.names())
    policy_kw = config_utils.to_dict(c.loss[c.loss.policy])
    _validate("loss", c.loss.policy, policy_kw)
    loss = loss_settings(c)
    mismatch, mismatch_kw = mismatch_settings(c)
    shaping = shaping_config(c)
    sampling = sampling_config(c)
    needs_greedy = credit.requires_greedy(c.credit.name)
    _check_sampling(c, needs_greedy)
    rc = rollout_config(c)
    backend_check: Callable[[Any], None] | None = BACKENDS.attr(backend, "check")
    if backend_check is not None:
        backend_check(c)
    staleness = staleness_setting(c, backend)
    # How a warm start fills a value head the saved policy lacks (sft.load_params).
    config_utils.check_choice(
        "init.critic", c.init.get("critic", "fresh"), config_utils.choices()["init.critic"]
    )
    lay = rollout_lib.make_layout(env, rc)  # raises if one turn does not fit
    branch = branch_config(c, lay, backend)
    check_role_params(c, env, model_cfg, backend, branch)
    rows = rc.batch_size if branch is None else branch.num_rows(rc.batch_size, lay.turns)
    if mesh is None and check_only:
        sharding.check_mesh_shape(c.mesh.axes, c.mesh.shape, c.mesh.axis_types)
        shape_only = sharding.abstract_mesh(c.mesh.axes, c.mesh.shape)
        if shape_only is not None:
            check_batch(rc.batch_size, rc.group_size, shape_only, "rollout.num_tasks")
    else:
        if mesh is None:
            mesh = sharding.make_mesh(c.mesh.axes, c.mesh.shape, c.mesh.axis_types)
        # B (1 + M N) branching rows (and the B M N branches alone) divide like B
        check_batch(rc.batch_size, rc.group_size, mesh, "rollout.num_tasks")
    grad_accum = _check_train(c, rows, lay)
    optim = optimizer(c)
    # LoRA: the optimizer trains the adapters (and a value head) only; base weights get no
    # update and no optimizer state.
    if model_cfg.lora_rank:
        optim = lora_lib.mask_optimizer(optim)
    run = Run(
        config=c,
        backend=backend,
        env=env,
        model_cfg=model_cfg,
        rollout_cfg=rc,
        layout=lay,
        needs_values=credit.requires_values(c.credit.name),
        needs_greedy=needs_greedy,
        branch=branch,
        staleness=staleness,
    )
    if check_only:
        return run
    # The memory estimate before the model is built: a size that cannot fit is refused in a
    # second, not after minutes of tracing its layers.
    memory.check_fits(run, mesh.size, memory.device_memory(c), mesh_shape=dict(mesh.shape))
    # Host episodes come from Python environments: their group's prompts are not guaranteed
    # equal, so only the jitted backend lets the update share them.
    share = c.train.get("share_prompt", True) and BACKENDS.attr(backend, "shared_prompts", True)
    step_cfg = step_config(
        env,
        model_cfg,
        rc,
        mesh,
        credit_name=c.credit.name,
        credit_kwargs=credit_kw,
        policy_loss=c.loss.policy,
        policy_kwargs=policy_kw,
        loss=loss,
        optim=optim,
        epochs=c.train.epochs,
        minibatches=c.train.minibatches,
        grad_accum=grad_accum,
        shaping=shaping,
        sampling=sampling,
        shared_prompt=lay.prompt if share else 0,
        mismatch=mismatch,
        mismatch_kwargs=mismatch_kw,
        collapse_metrics=c.log.collapse_metrics,
        mi_proxy=c.log.mi_proxy,
        branch=branch,
        share_fork_prefix=c.train.share_fork_prefix,
    )
    step_cfg = dataclasses.replace(step_cfg, staleness=staleness)
    return dataclasses.replace(run, mesh=mesh, step_cfg=step_cfg)
