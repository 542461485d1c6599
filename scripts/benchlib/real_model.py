"""A real Hugging Face model folder, timed in rl4agents and in PyTorch/transformers side by side.

`scripts/bench.py --real-model=DIR` drives this. Both libraries load the same folder in one
process and run the same two jobs on the same inputs, interleaved per round (one timed call of
every job x library x dtype per round), in float32 and in bf16:

- generation: P left-padded prompts of at most L tokens (chat-template text), T new tokens
  each, sampled at temperature 1 from the full softmax, no end-of-sequence stop. Ours is the
  jitted KV-cache rollout of training (`rollout.rollout`, one turn of T action slots, prompt
  prefilled once, then one token per step; `FixedPrompts` serves the prompts); theirs is
  `model.generate(do_sample=True, top_k=0, max_new_tokens=T, min_new_tokens=T)` under
  `torch.inference_mode()`.
- GRPO step: one policy-gradient update on a fixed batch of G prompt + completion rows with
  fixed advantages and fixed old log-probs. Per token t of the completion mask m, with
  rho_t = exp(log p_theta(y_t) - log p_old(y_t)),
  loss = sum_t m_t max(-A rho_t, -A clip(rho_t, 1 - eps, 1 + eps)) / sum_t m_t
  (PPO's clipped surrogate, https://arxiv.org/abs/1707.06347, with GRPO's group-normalised
  advantages, https://arxiv.org/abs/2402.03300), then gradient clipping at global norm 1 and
  one AdamW step. Ours: `rollout.score_params` log-probs of the completion slots (LM head and
  log-softmax `LOGIT_CHUNK` slots at a time), the registry's `ppo_clip` (no dual clip,
  token-mean), `optax` AdamW (`train.state.make_optimizer`), jitted. Theirs: the same formula
  by hand (`log_softmax` + `gather` of `logits_to_keep` = T + 1 positions, as TRL scores
  completions), `backward`, `clip_grad_norm_`, `torch.optim.AdamW`.

When `trl` is importable (run the benchmark with a Python that has it; it is not a
dependency of rl4agents), the GRPO step is also timed in TRL: `trl.GRPOTrainer.compute_loss`
on the same batch (`loss_type="bnpo"`, the token mean over the batch that the formula above
is; `beta=0`, `epsilon` = `CLIP`, the old log-probs given), then `backward`,
`clip_grad_norm_` and the trainer's own AdamW. TRL scores completions with its fused LM head
(log-probs and entropy in one pass) and passes no position ids, so on left-padded rows its
log-probs and first loss differ from the other two (its first loss is reported beside theirs).

bf16 is bf16 compute with float32 weights in both: ours `model.dtype="bfloat16"` (float32
master weights, bf16 operands into float32 products), theirs `torch.autocast("cpu",
torch.bfloat16)` around the forward. Generation always uses the loaded weights; each library's
GRPO steps update a copy of them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl4agents import sharding, text
from rl4agents.losses import registry as loss_registry
from rl4agents.models import hf
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import state as state_lib
from rl4agents.types import TimeStep

from . import jobs

DTYPES = ("float32", "bfloat16")
LIBRARIES = ("rl4agents", "torch")
TRL = "trl"  # a third library for the GRPO step, when `trl` is importable
JOBS = ("generate", "grpo_step")
LOGIT_CHUNK = 16  # completion slots per block of the LM head + log-softmax (ours)
LR = 1e-6
CLIP = 0.2  # eps of the clipped ratio
GRAD_CLIP = 1.0  # global gradient norm (TRL's default; ours `optim.grad_clip`)
WEIGHT_DECAY = 0.0
OLD_LOGP_SHIFT = 0.3  # |log p_old - log p| at most, so that some ratios leave the clip range
QUESTIONS = (
    "What is the capital of France, and why did it become the capital?",
    "Explain how a bicycle stays upright while it is moving.",
    "Write a short poem about the sea at night.",
    "How many legs do three spiders and two ants have in total?",
    "Give me three tips for learning a new language quickly.",
    "Why is the sky blue during the day and red at sunset?",
    "Summarize the plot of a detective story in two sentences.",
    "What should I pack for a weekend hiking trip in the mountains?",
)
FILLER = (
    "Please answer carefully and step by step, with short sentences, simple words and one "
    "example for each point, because I am reading this on a small phone screen while waiting "
    "for a train that is already late, and I would like to remember the answer tomorrow."
)
ANSWER = (
    "Sure! Here is a clear answer. First, think about the question itself and what it asks. "
    "Second, list what you already know. Third, put the pieces together one at a time, and "
    "check each step before moving on. Finally, write the result in one short sentence."
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    prompts: int = 8  # P generation prompts
    prompt_len: int = 64  # L prompt slots (left-padded)
    new_tokens: int = 32  # T generated tokens per prompt, and completion slots per GRPO row
    group: int = 8  # G rows of the GRPO batch

    def __post_init__(self):
        for name, low in (("prompts", 1), ("prompt_len", 2), ("new_tokens", 1), ("group", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"real-model {name}={getattr(self, name)}; allowed: >= {low}")


class Prompts(NamedTuple):
    tokens: np.ndarray  # int32[P, L] left-padded with `pad_id`
    mask: np.ndarray  # bool[P, L] real tokens
    pad_id: int


class Batch(NamedTuple):
    """A fixed GRPO batch: G rows of L prompt slots then T completion slots."""

    tokens: jax.Array  # int32[G, L + T] left-padded prompt, completion, pad after its end
    valid: jax.Array  # bool[G, L + T] real tokens
    action_mask: jax.Array  # bool[G, T] completion tokens trained on
    advantages: jax.Array  # f32[G] one advantage per row
    logp_old: jax.Array  # f32[G, T] old log-probs of the completion tokens (0 off the mask)


def _template_ids(tokenizer, content: str) -> list[int]:
    messages = [{"role": "user", "content": content}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(chat, add_special_tokens=False)["input_ids"]


def chat_prompts(tokenizer, num: int, length: int) -> Prompts:
    """`num` prompts of at most `length` tokens, left-padded to `length`.

    Prompt i is the chat template (with the generation prompt) around the longest word prefix
    of question i + `FILLER` that fits; where even one word does not fit the template (a short
    `length`), it is the tokenizer's BOS (or pad) token and the plain text's first
    `length - 1 - i % 3` tokens. Every prompt starts with the same token.

    Args:
      tokenizer: a `transformers` tokenizer (its chat template, if any, is used).
      num: P prompts.
      length: L slots per prompt.

    Returns:
      Prompts with int32[P, L] tokens and bool[P, L] mask, padded on the left.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    for i in range(num):
        words = f"{QUESTIONS[i % len(QUESTIONS)]} {FILLER}".split()
        best = None
        if tokenizer.chat_template:
            for n in range(1, len(words) + 1):
                ids = _template_ids(tokenizer, " ".join(words[:n]))
                if len(ids) > length:
                    break
                best = ids
        if best is None:
            first = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad
            body = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
            best = [first, *body[: max(length - 1 - i % 3, 1)]]
        rows.append(best)
    if len({r[0] for r in rows}) > 1:
        raise ValueError(f"prompts start with different tokens {sorted({r[0] for r in rows})}")
    tokens = np.full((num, length), pad, np.int32)
    mask = np.zeros((num, length), bool)
    for i, ids in enumerate(rows):
        tokens[i, length - len(ids) :] = ids
        mask[i, length - len(ids) :] = True
    return Prompts(tokens, mask, int(pad))


def grpo_batch(tokenizer, prompts: Prompts, group: int, new_tokens: int) -> Batch:
    """G rows: prompt g mod P, then `new_tokens` completion slots holding tokens g.. of the
    encoded `ANSWER`, of which the first T - (g mod 3) (at least 1) are real; fixed GRPO
    advantages (rewards (g mod 3) / 2, normalised within the group, std + 1e-4). `logp_old`
    is zero until `with_old_logp`."""
    p = prompts.tokens.shape[0]
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    answer = answer * (-(-(group + new_tokens) // max(len(answer), 1)))
    comp = np.full((group, new_tokens), prompts.pad_id, np.int32)
    comp_mask = np.zeros((group, new_tokens), bool)
    for g in range(group):
        n = max(new_tokens - g % 3, 1)
        comp[g, :n] = answer[g : g + n]
        comp_mask[g, :n] = True
    rows = np.arange(group) % p
    rewards = (np.arange(group) % 3) / 2.0
    adv = (rewards - rewards.mean()) / (rewards.std(ddof=1 if group > 1 else 0) + 1e-4)
    return Batch(
        tokens=jnp.asarray(np.concatenate([prompts.tokens[rows], comp], axis=1)),
        valid=jnp.asarray(np.concatenate([prompts.mask[rows], comp_mask], axis=1)),
        action_mask=jnp.asarray(comp_mask),
        advantages=jnp.asarray(adv, jnp.float32),
        logp_old=jnp.zeros((group, new_tokens), jnp.float32),
    )


def with_old_logp(batch: Batch, logp: jax.Array, seed: int = 0) -> Batch:
    """The batch with log p_old = logp - u, u ~ U(-`OLD_LOGP_SHIFT`, `OLD_LOGP_SHIFT`) fixed
    by `seed`: ratios exp(u) in [0.74, 1.35] fall on both sides of the clip range [0.8, 1.2],
    so the first step's loss depends on the model (with p_old = p it is -mean A)."""
    shift = np.random.default_rng(seed).uniform(-OLD_LOGP_SHIFT, OLD_LOGP_SHIFT, logp.shape)
    old = jnp.where(batch.action_mask, logp - jnp.asarray(shift, jnp.float32), 0.0)
    return batch._replace(logp_old=old)


class _Tokens(NamedTuple):
    pad_id: int
    bos_id: int
    eoa_id: int  # -1: no end-of-action token (fixed-length generation)


@flax.struct.dataclass
class _PromptState:
    done: jax.Array  # bool[]


class FixedPrompts:
    """One turn over a fixed table of prompts, for `rollout.rollout` with `task_keys` =
    int32[P] row indices: `reset(i, params)` returns prompt i (after its first token, which the
    rollout writes as BOS); `step` ends the episode with reward 0. No end-of-action token."""

    def __init__(self, prompts: Prompts):
        p, length = prompts.tokens.shape
        obs = np.full((p, length - 1), prompts.pad_id, np.int32)
        lens = prompts.mask.sum(axis=1).astype(np.int32) - 1
        for i in range(p):
            ids = prompts.tokens[i][prompts.mask[i]]
            obs[i, : lens[i]] = ids[1:]
        self._obs, self._lens = obs, lens
        first = prompts.tokens[0, np.argmax(prompts.mask[0])]
        self.tokenizer = _Tokens(prompts.pad_id, int(first), -1)
        self.max_prompt_len = length - 1
        self.max_obs_len = 1
        self.max_action_len = 1

    def default_params(self, split: str = "train"):
        del split
        return jnp.asarray(self._obs), jnp.asarray(self._lens)

    def reset(self, index: jax.Array, params) -> tuple[_PromptState, TimeStep]:
        obs, lens = params
        return _PromptState(jnp.zeros((), bool)), self._timestep(obs[index], lens[index])

    def step(self, key, state, action_tokens, action_len, params):
        del key, action_tokens, action_len, params
        pad = jnp.full((self.max_obs_len,), self.tokenizer.pad_id, jnp.int32)
        return _PromptState(jnp.ones((), bool)), self._timestep(pad, jnp.zeros((), jnp.int32))

    def _timestep(self, obs, obs_len) -> TimeStep:
        return TimeStep(
            obs_tokens=obs,
            obs_len=obs_len,
            reward=jnp.zeros((), jnp.float32),
            done=obs_len == 0,
            anchor=text.hash_u32(obs[:1]),
            valid_action=jnp.ones((), bool),
            success=jnp.zeros((), bool),
        )


def graphdef_for(cfg: policy_lib.ModelConfig, dtype: str) -> nnx.GraphDef:
    """The policy's graph in compute dtype `dtype` (float32 parameters either way) with
    `LOGIT_CHUNK`; it merges with the state `hf.load_pretrained` gives for `cfg`."""
    cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype="float32", logit_chunk=LOGIT_CHUNK)
    return nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(cfg, nnx.Rngs(0))))[0]


def make_generate(graphdef, prompts: Prompts, new_tokens: int, mesh) -> Callable:
    """Jitted `(key, params) -> (int32[P, T] sampled tokens, f32[P, T] their log-probs)`: the
    training rollout (one turn of `new_tokens` action slots, temperature 1, no top-k/top-p,
    no end token) over `FixedPrompts`."""
    env = FixedPrompts(prompts)
    num, length = prompts.tokens.shape
    cfg = rollout_lib.RolloutConfig(
        num_tasks=num, group_size=1, max_turns=1, max_action_len=new_tokens
    )
    task_keys = jnp.arange(num, dtype=jnp.int32)
    fn = jobs.make_rollout_fn(graphdef, env, env.default_params(), cfg, mesh, task_keys=task_keys)

    def generate(key, params):
        traj = fn(key, params)
        window = slice(length, length + new_tokens)  # the turn's action slots
        return traj.tokens[:, window], traj.logp_behavior[:, window]

    return generate


def completion_logp(graphdef, params, batch: Batch) -> jax.Array:
    """f32[G, T] log-prob of each completion slot's token (0 off `action_mask`), from the
    teacher-forced pass the update uses (`rollout.score_params` over the completion slots)."""
    g, t = batch.action_mask.shape
    length = batch.tokens.shape[1] - t
    slots = jnp.broadcast_to(length + jnp.arange(t, dtype=jnp.int32), (g, t))
    scores = rollout_lib.score_params(graphdef, params, batch.tokens, batch.valid, slots=slots)
    logp = jnp.take_along_axis(scores.logp, slots, axis=1)
    return jnp.where(batch.action_mask, logp, 0.0)


def grpo_loss(logp: jax.Array, batch: Batch) -> jax.Array:
    """The clipped surrogate of the module docstring: registry `ppo_clip`, no dual clip,
    token-mean over `action_mask`. logp f32[G, T] -> f32[]."""
    chex.assert_equal_shape([logp, batch.logp_old])
    adv = jnp.broadcast_to(batch.advantages[:, None], logp.shape)
    loss_fn = loss_registry.get("ppo_clip")
    loss, _ = loss_fn(
        logp,
        batch.logp_old,
        adv,
        batch.action_mask,
        clip_low=CLIP,
        clip_high=CLIP,
        dual_clip_c=None,
        agg="token-mean",
    )
    return loss


def optimizer() -> optax.GradientTransformation:
    return state_lib.make_optimizer(lr=LR, weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP)


def make_grpo_step(graphdef, mesh, donate: bool = True) -> Callable:
    """Jitted `(params, opt_state, batch) -> (params, opt_state, loss f32[])`; params and
    optimizer state are donated (unless `donate` is False: a profiler calls the step on the
    same inputs again) and come back replicated over `mesh` (as they go in), so steps of
    either compute dtype take each other's outputs without recompiling."""
    tx = optimizer()
    rep = sharding.replicated(mesh)

    def loss_of(params, batch):
        return grpo_loss(completion_logp(graphdef, params, batch), batch)

    @functools.partial(
        jax.jit, donate_argnums=(0, 1) if donate else (), out_shardings=(rep, rep, rep)
    )
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_of)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _autocast(dtype: str):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def torch_batch(batch: Batch) -> dict:
    import torch

    def tensor(x):
        return torch.from_numpy(np.array(x))  # a writable host copy

    valid = tensor(batch.valid).long()
    return dict(
        tokens=tensor(batch.tokens).long(),
        valid=valid,
        positions=(valid.cumsum(1) - 1).clamp(min=0),
        action_mask=tensor(batch.action_mask).float(),
        advantages=tensor(batch.advantages)[:, None],
        logp_old=tensor(batch.logp_old),
    )


def torch_completion_logp(model, tb: dict, dtype: str = "float32"):
    """float32[G, T] log-probs of the completion tokens (with grad): the forward keeps the
    logits of the last T + 1 positions (`logits_to_keep`, as TRL), log_softmax, gather."""
    import torch

    t = tb["action_mask"].shape[1]
    with _autocast(dtype):
        out = model(
            input_ids=tb["tokens"],
            attention_mask=tb["valid"],
            position_ids=tb["positions"],
            logits_to_keep=t + 1,
            use_cache=False,
        )
    logits = out.logits[:, :-1].float()  # [G, T, V]: positions L - 1 .. L + T - 2
    logp_all = torch.log_softmax(logits, dim=-1)
    return logp_all.gather(-1, tb["tokens"][:, -t:, None])[..., 0]


def torch_grpo_loss(logp, tb: dict):
    import torch

    mask = tb["action_mask"]
    ratio = torch.exp(logp - tb["logp_old"])
    adv = tb["advantages"]
    per_token = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def torch_grpo_step(model, opt, tb: dict, dtype: str) -> float:
    """One hand-written PyTorch GRPO update; returns the loss before it."""
    import torch

    loss = torch_grpo_loss(torch_completion_logp(model, tb, dtype), tb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    return float(loss.detach())


def trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def trl_trainer(model, tokenizer, sizes: Sizes, workdir: str):
    """A `trl.GRPOTrainer` around `model` (trained in place) with the settings of our step:
    token-mean loss over the batch (`bnpo`), clip `CLIP`, no KL term, AdamW at `LR`, gradient
    norm clipped at `GRAD_CLIP`, no activation checkpointing (as our step here). Its own mixed
    precision is off (GRPOConfig turns bf16 autocast on by default): the compute dtype is the
    caller's, through `_autocast` around each step, as for the PyTorch rows. Its dataset and
    reward function are placeholders: the benchmark feeds the trainer's loss the fixed batch
    and never generates with it."""
    import datasets
    import trl

    args = trl.GRPOConfig(
        output_dir=workdir,
        per_device_train_batch_size=sizes.group,
        num_generations=sizes.group,
        max_completion_length=sizes.new_tokens,
        loss_type="bnpo",
        beta=0.0,
        epsilon=CLIP,
        learning_rate=LR,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=GRAD_CLIP,
        gradient_checkpointing=False,  # TRL's default recomputes activations; ours here does not
        bf16=False,  # TRL defaults to bf16 autocast; float32 rows must run in float32
        fp16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["-"] * sizes.group}),
        processing_class=tokenizer,
    )
    trainer.create_optimizer()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop, which is not run
    return trainer


def trl_inputs(tb: dict, prompt_len: int) -> dict:
    """`torch_batch`'s batch in the layout `GRPOTrainer.compute_loss` reads."""
    return dict(
        prompt_ids=tb["tokens"][:, :prompt_len],
        prompt_mask=tb["valid"][:, :prompt_len],
        completion_ids=tb["tokens"][:, prompt_len:],
        completion_mask=tb["action_mask"].long(),
        advantages=tb["advantages"][:, 0],
        old_per_token_logps=tb["logp_old"],
    )


def trl_logp_vs_torch(trainer, inputs: dict, model, tb: dict) -> float:
    """Max |log p| difference on the completion tokens, float32, between TRL's scoring (its
    fused LM head, given no position ids: RoPE is relative, so left padding moves no score
    beyond rounding) and the full log-softmax of `torch_completion_logp`."""
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    valid = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    t = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, valid, t)
        full = torch_completion_logp(model, tb)
    return float((theirs - full)[inputs["completion_mask"].bool()].abs().max())


def trl_grpo_step(trainer, inputs: dict, dtype: str) -> float:
    """One GRPO update through TRL's own loss; returns the loss before it."""
    import torch

    model = trainer.model
    with _autocast(dtype):
        loss = trainer.compute_loss(model, inputs)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    trainer.optimizer.step()
    return float(loss.detach())


def torch_generate(model, prompts: Prompts, new_tokens: int, dtype: str, seed: int):
    """int64[P, T] tokens from `model.generate`: sampling at temperature 1 over the full
    vocabulary (top_k 0, top_p 1), exactly `new_tokens` new tokens."""
    import torch

    torch.manual_seed(seed)
    with torch.inference_mode(), _autocast(dtype):
        out = model.generate(
            input_ids=torch.from_numpy(prompts.tokens).long(),
            attention_mask=torch.from_numpy(prompts.mask).long(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=prompts.pad_id,
        )
    return out[:, prompts.tokens.shape[1] :]


def data_size(n: int, devices: int) -> int:
    """The largest device count <= `devices` that divides `n` (the batch axis's shards)."""
    return max(d for d in range(1, devices + 1) if n % d == 0)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """Which of `BF16_FLAGS` the CPU reports: whether bf16 matrix products have native units
    (avx512_bf16, AMX) or fall back to float32 arithmetic ([] where /proc/cpuinfo is absent)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in BF16_FLAGS if flag in have]
    except OSError:
        pass
    return []


class Setup(NamedTuple):
    """Both libraries' models and the jobs' inputs (see `setup`)."""

    graphdefs: dict[str, Any]  # dtype -> our graph
    params: Any  # our loaded (float32) state, for generation
    torch_model: Any  # theirs, loaded, for generation (eval mode)
    torch_train: Any  # a copy that the GRPO steps update
    prompts: Prompts
    batch: Batch  # ours, logp_old set
    torch_batch: dict
    mesh: Any
    parity: dict  # max |logp ours - theirs| on the batch per dtype


def setup(folder: str, sizes: Sizes, mesh=None) -> Setup:
    """Load `folder` in both libraries, build the prompts and the GRPO batch, and compare the
    batch's completion log-probs of the two (float32 and bf16)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompts = chat_prompts(tokenizer, sizes.prompts, sizes.prompt_len)
    batch = grpo_batch(tokenizer, prompts, sizes.group, sizes.new_tokens)
    if mesh is None:
        n = data_size(np.gcd(sizes.prompts, sizes.group), jax.device_count())
        mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (n, 1, 1), devices=jax.devices()[:n])
    policy, cfg = hf.load_pretrained(folder, "float32")
    _, params = nnx.split(policy)
    params = jax.device_put(params, sharding.replicated(mesh))
    graphdefs = {d: graphdef_for(cfg, d) for d in DTYPES}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    parity = {}
    for dtype in DTYPES:
        ours = np.asarray(
            jax.jit(completion_logp, static_argnums=0)(graphdefs[dtype], params, batch)
        )
        with torch.no_grad():
            theirs = torch_completion_logp(model, torch_batch(batch), dtype).numpy()
        mask = np.asarray(batch.action_mask)
        parity[dtype] = float(np.abs(ours - theirs)[mask].max())
        if dtype == "float32":
            batch = with_old_logp(batch, jnp.asarray(ours))
    batch = Batch(*(jax.device_put(x, sharding.batch_sharding(mesh, x.ndim)) for x in batch))
    train = copy.deepcopy(model).train()
    return Setup(graphdefs, params, model, train, prompts, batch, torch_batch(batch), mesh, parity)


def _stats(times: list[float]) -> dict:
    return dict(
        times_s=[round(t, 4) for t in times],
        median_s=round(statistics.median(times), 4),
        min_s=round(min(times), 4),
        max_s=round(max(times), 4),
    )


def run(
    folder: str,
    sizes: Sizes = Sizes(),
    repeats: int = 3,
    dtypes: tuple[str, ...] = DTYPES,
    log: Callable[[str], None] = print,
    trl: bool | None = None,
) -> dict:
    """Time both jobs in both libraries and `dtypes`, interleaved per round.

    Each (job, library, dtype) first runs once untimed (ours: trace + compile + run, reported
    as `first_s`), then once per round for `repeats` rounds. Returns rows (job, library,
    dtype, first_s, times_s, median_s, min_s, max_s; generation adds tokens_per_s; the
    rl4agents rows add `time_ratio` = ours / theirs median seconds), the first GRPO losses of
    each library (`first_loss`, before any update in float32), the log-prob parity and the
    metadata (threads, devices, CPU, versions, sizes). With `trl` (default: when it is
    importable) the GRPO step is also timed in TRL (library "trl"), and our GRPO rows add
    `time_ratio_trl` = ours / TRL's median seconds.
    """
    import torch
    import transformers

    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"real-model dtype {dtype!r}; allowed: {list(DTYPES)}")
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(threads)
    log(f"real model {folder}: loading in both libraries, {sizes}")
    s = setup(folder, sizes)
    log(f"log-prob parity (max |ours - torch|): {s.parity}")
    p, t = sizes.prompts, sizes.new_tokens
    gen_fns = {d: make_generate(s.graphdefs[d], s.prompts, t, s.mesh) for d in dtypes}
    step_fns = {d: make_grpo_step(s.graphdefs[d], s.mesh) for d in dtypes}
    rep = sharding.replicated(s.mesh)
    train = {"params": jax.device_put(jax.tree.map(jnp.copy, s.params), rep)}
    train["opt"] = jax.device_put(optimizer().init(train["params"]), rep)
    torch_opt = torch.optim.AdamW(
        s.torch_train.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY
    )
    key = jax.random.key(0)
    trl = trl_available() if trl is None else trl
    libraries = LIBRARIES + ((TRL,) if trl else ())
    if trl:
        import tempfile

        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        trainer = trl_trainer(
            copy.deepcopy(s.torch_model), tokenizer, sizes, tempfile.mkdtemp(prefix="trl_bench_")
        )
        inputs = trl_inputs(s.torch_batch, sizes.prompt_len)
        trl_parity = trl_logp_vs_torch(trainer, inputs, s.torch_model, s.torch_batch)
        log(f"log-prob parity (max |TRL - torch|, float32): {trl_parity:.3g}")

    def ours_gen(dtype, i):
        out = gen_fns[dtype](jax.random.fold_in(key, i), s.params)
        jax.block_until_ready(out)
        return None

    def ours_step(dtype, i):
        del i
        train["params"], train["opt"], loss = step_fns[dtype](
            train["params"], train["opt"], s.batch
        )
        return float(loss)

    def torch_gen(dtype, i):
        torch_generate(s.torch_model, s.prompts, t, dtype, seed=i)
        return None

    def torch_step(dtype, i):
        del i
        return torch_grpo_step(s.torch_train, torch_opt, s.torch_batch, dtype)

    calls = {
        ("generate", "rl4agents"): ours_gen,
        ("generate", "torch"): torch_gen,
        ("grpo_step", "rl4agents"): ours_step,
        ("grpo_step", "torch"): torch_step,
    }
    if trl:
        calls[("grpo_step", TRL)] = lambda dtype, i: trl_grpo_step(trainer, inputs, dtype)
    cells = [(j, lib, d) for j in JOBS for d in dtypes for lib in libraries if (j, lib) in calls]
    first, first_loss, times = {}, {}, {c: [] for c in cells}
    for cell in cells:
        job, lib, dtype = cell
        t0 = time.perf_counter()
        out = calls[(job, lib)](dtype, 0)
        first[cell] = time.perf_counter() - t0
        if out is not None:
            first_loss[f"{lib}/{dtype}"] = out
        log(f"first call {job} {lib} {dtype}: {first[cell]:.2f} s")
    for r in range(repeats):
        for cell in cells:
            job, lib, dtype = cell
            t0 = time.perf_counter()
            calls[(job, lib)](dtype, r + 1)
            times[cell].append(time.perf_counter() - t0)
        log(f"round {r + 1}/{repeats}: " + ", ".join(f"{times[c][-1]:.2f}" for c in cells))
    rows = []
    for cell in cells:
        job, lib, dtype = cell
        row = dict(job=job, library=lib, dtype=dtype, first_s=round(first[cell], 4))
        row.update(_stats(times[cell]))
        if job == "generate":
            row["new_tokens"] = p * t
            row["tokens_per_s"] = round(p * t / row["median_s"], 2)
        rows.append(row)
    by_cell = {(r["job"], r["library"], r["dtype"]): r for r in rows}
    for r in rows:
        if r["library"] == "rl4agents":
            theirs = by_cell[(r["job"], "torch", r["dtype"])]["median_s"]
            r["time_ratio"] = round(r["median_s"] / theirs, 4)
            if (r["job"], TRL, r["dtype"]) in by_cell:
                trl_s = by_cell[(r["job"], TRL, r["dtype"])]["median_s"]
                r["time_ratio_trl"] = round(r["median_s"] / trl_s, 4)
    meta = dict(
        folder=os.path.basename(os.path.normpath(folder)),
        sizes=dataclasses.asdict(sizes),
        repeats=repeats,
        dtypes=list(dtypes),
        logit_chunk=LOGIT_CHUNK,
        lr=LR,
        clip=CLIP,
        grad_clip=GRAD_CLIP,
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        trl=_trl_version() if trl else None,
        jax=jax.__version__,
        jax_devices=[str(d) for d in jax.devices()],
        mesh=dict(s.mesh.shape),
        cpu_model=cpu_model(),
        cpu_flags=cpu_flags(),
        cpu_count=os.cpu_count(),
    )
    res = dict(rows=rows, first_loss=first_loss, logp_parity=s.parity, meta=meta)
    if trl:
        res["logp_parity_trl"] = trl_parity
    return res


def _trl_version() -> str:
    import trl

    return trl.__version__


def table(res: dict) -> str:
    """The rows as a Markdown table (job, dtype, library, first call, median, rate, ratio)."""
    m, sz = res["meta"], res["meta"]["sizes"]
    parity = ", ".join(f"{d} {v:.2g}" for d, v in res["logp_parity"].items())
    losses = ", ".join(f"{k} {v:.6f}" for k, v in res["first_loss"].items())
    head = ["job", "dtype", "library", "first call s", "median s (min-max)", "rate", "ours/theirs"]
    lines = [
        f"\n{m['folder']}: generation {sz['prompts']} prompts x {sz['prompt_len']} slots -> "
        f"{sz['new_tokens']} new tokens; GRPO step {sz['group']} rows x "
        f"{sz['prompt_len'] + sz['new_tokens']} slots; median of {m['repeats']} rounds",
        f"{m['cpu_model']} ({' '.join(m.get('cpu_flags') or ['no flags read'])}), "
        f"{m['cpu_count']} cores; torch {m['torch_threads']} threads; jax "
        f"{len(m['jax_devices'])} devices, mesh {m['mesh']}",
        f"max |log p ours - torch| on the GRPO batch: {parity}; first GRPO losses: {losses}"
        + (
            f"; max |log p TRL - torch| (float32): {res['logp_parity_trl']:.2g}"
            if "logp_parity_trl" in res
            else ""
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in res["rows"]:
        rate = f"{r['tokens_per_s']:,.1f} tok/s" if "tokens_per_s" in r else "-"
        ratio = f"{r['time_ratio']:.3g}x time" if "time_ratio" in r else ""
        if "time_ratio_trl" in r:
            ratio += f", {r['time_ratio_trl']:.3g}x TRL's"
        cells = [
            r["job"],
            r["dtype"],
            r["library"],
            f"{r['first_s']:.2f}",
            f"{r['median_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f})",
            rate,
            ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
