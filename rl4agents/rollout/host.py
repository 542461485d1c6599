"""`host_rollout`: multi-turn episodes of host text environments in the jitted slot layout.

Per turn, one jitted function (`sample_turn`, compiled once for every turn: fixed shapes, the
turn index traced) writes the previous observation into the KV cache and samples up to A
action tokens for all B episodes, stopping each at the end-of-action token; the cache stays on
the device between turns. The host then decodes the actions with the run's tokenizer, steps
the environments side by side (`HostPool`), and encodes their observations for the next turn.

The result is a `Trajectory` with exactly the slot layout and fields of
`rl4agents.rollout.rollout` (a prompt block of P slots, then K blocks of A action and O
observation slots; RoPE positions from the count of valid tokens), so `rollout.score`
reproduces its behaviour log-probs and `train.step.update` learns from it unchanged.
Observations longer than their block are clipped and flagged; a turn's anchor is the CRC-32
of the observation text it acted from. With a chat tokenizer (`rl4agents.models.chat.
ChatTokenizer`) each observation is framed as a user message of the model's chat template.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl4agents.envs.host import base
from rl4agents.envs.host import pool as pool_lib
from rl4agents.models import policy as policy_lib
from rl4agents.models import sampling
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.rollout.rollout import _Ctx, _write
from rl4agents.types import Trajectory


class TurnStatic(NamedTuple):
    """What `prefill_prompt` and `sample_turn` compile for (hashable; one compilation each)."""

    graphdef: Any  # nnx.GraphDef of the policy
    layout: rollout_lib.Layout
    temperature: float
    top_k: int
    top_p: float
    pad_id: int
    eoa_id: int


class TurnSample(NamedTuple):
    """The action tokens of one turn for all episodes."""

    tokens: jax.Array  # int32[B, A] sampled tokens, PAD where not active
    active: jax.Array  # bool[B, A] slots that were sampled (a prefix ending at EOA or budget)
    logp: jax.Array  # f32[B, A] behaviour log-prob of each sampled token, 0 elsewhere
    entropy: jax.Array  # f32[B, A] entropy of the sampling distribution, 0 elsewhere


@functools.partial(jax.jit, static_argnames=("static",))
def prefill_prompt(params: Any, tokens: jax.Array, valid: jax.Array, *, static: TurnStatic) -> _Ctx:
    """A fresh KV cache of T slots holding the prompt block.

    Args:
      params: the policy's state.
      tokens: int32[B, P] BOS and the reset observation, PAD-padded.
      valid: bool[B, P] real tokens.
      static: compile-time settings.

    Returns:
      The decoding context: cache k/v [B, KV, T, hd], key_valid bool[B, T], count int32[B],
      logits f32[B, V] predicting the first action token.
    """
    model = nnx.merge(static.graphdef, params)
    b, length = tokens.shape[0], static.layout.length
    ctx = _Ctx(
        cache=policy_lib.init_cache(model.cfg, b, length),
        key_valid=jnp.zeros((b, length), bool),
        count=jnp.zeros((b,), jnp.int32),
        logits=jnp.zeros((b, model.cfg.vocab_size), jnp.float32),
    )
    return _write(model, ctx, tokens, valid, 0)


@functools.partial(jax.jit, static_argnames=("static",), donate_argnames=("ctx",))
def sample_turn(
    params: Any,
    ctx: _Ctx,
    obs_tokens: jax.Array,
    obs_valid: jax.Array,
    turn: jax.Array,
    alive: jax.Array,
    left: jax.Array,
    key_sample: jax.Array,
    greedy: jax.Array,
    *,
    static: TurnStatic,
) -> tuple[_Ctx, TurnSample]:
    """Prefill turn k-1's observation into the cache, then sample turn k's action tokens.

    Args:
      params: the policy's state.
      ctx: the decoding context (donated); its cache holds everything before turn k-1's
        observation block.
      obs_tokens: int32[B, O] the observation of turn k-1 (ignored at turn 0), PAD-padded.
      obs_valid: bool[B, O] its real tokens (all False at turn 0).
      turn: int32[] k (traced: one compilation serves every turn).
      alive: bool[B] episodes that act this turn; the others get no tokens.
      left: int32[B] action tokens each episode may still sample (the episode budget).
      key_sample: the rollout's sampling key; turn k uses `fold_in(key_sample, k)`.
      greedy: bool[] take the argmax instead of sampling (traced: greedy and sampled
        rollouts share the program).
      static: compile-time settings.

    Returns:
      The context after the action tokens, and the turn's `TurnSample` ([B, A] arrays).
    """
    model = nnx.merge(static.graphdef, params)
    lay = static.layout
    blk = lay.action + lay.obs
    # At turn 0 the (all-invalid) write lands on unused slots that later writes overwrite.
    obs_start = jnp.where(turn > 0, lay.prompt + (turn - 1) * blk + lay.action, lay.prompt)
    ctx = _write(model, ctx, obs_tokens, obs_valid, obs_start)
    start = lay.prompt + turn * blk
    key_turn = jax.random.fold_in(key_sample, turn)

    def _token_step(carry, i):
        ctx, stopped = carry
        logits = ctx.logits
        token = sampling.sample(
            jax.random.fold_in(key_turn, i),
            logits,
            temperature=static.temperature,
            top_k=static.top_k,
            top_p=static.top_p,
            greedy=greedy,
        )
        active = alive & ~stopped & (i < left)
        logp_all = sampling.scaled_log_probs(logits, static.temperature)
        logp = jnp.take_along_axis(logp_all, token[:, None], axis=1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        token = jnp.where(active, token, static.pad_id)
        ctx = _write(model, ctx, token[:, None], active[:, None], start + i)
        stopped = stopped | (token == static.eoa_id)
        out = TurnSample(
            token, active, jnp.where(active, logp, 0.0), jnp.where(active, entropy, 0.0)
        )
        return (ctx, stopped), out

    b = obs_tokens.shape[0]
    (ctx, _), out = jax.lax.scan(_token_step, (ctx, jnp.zeros((b,), bool)), jnp.arange(lay.action))
    return ctx, jax.tree.map(lambda x: x.T, out)  # [A, B] -> [B, A]


@dataclasses.dataclass
class HostInfo:
    """What a host rollout recorded besides the `Trajectory` (host values; not a pytree)."""

    seeds: np.ndarray  # int64[num_tasks] reset seed of each task
    failed: np.ndarray  # bool[B] the episode ended by an environment exception or timeout
    failures: list[pool_lib.Failure]  # one per failed episode, with its turn and message
    prompt_clipped: np.ndarray  # bool[B] the reset observation had more than P - 1 tokens
    obs_clipped: np.ndarray  # bool[B, K] the turn's observation had more than O tokens
    actions: list[list[str]]  # per episode, the decoded action text of each turn taken
    observations: list[list[str]]  # per episode, the reset text then each turn's observation
    env_seconds: float  # wall time in the environments (factory, reset, steps)
    policy_seconds: float  # wall time of prefill and sampling (incl. transfers)

    def metrics(self) -> dict[str, float]:
        """Scalar summaries (f32-compatible floats) under a `host/` prefix."""
        return {
            "host/failed": float(self.failed.mean()),
            "host/prompt_clipped": float(self.prompt_clipped.mean()),
            "host/obs_clipped": float(self.obs_clipped.any(axis=1).mean()),
            "host/env_seconds": self.env_seconds,
            "host/policy_seconds": self.policy_seconds,
        }


def task_seeds(key: jax.Array, num_tasks: int) -> np.ndarray:
    """The reset seeds `host_rollout(key, ...)` draws when none are given: int64[num_tasks]."""
    key_task = jax.random.split(key)[0]
    return np.asarray(jax.random.randint(key_task, (num_tasks,), 0, 2**31 - 1), np.int64)


def host_rollout(
    key: jax.Array,
    graphdef: nnx.GraphDef,
    params: Any,
    pool: pool_lib.HostPool,
    tokenizer,
    cfg: rollout_lib.RolloutConfig,
    seeds: np.ndarray | None = None,
) -> Trajectory:
    """Run B = num_tasks x G episodes of host text environments for up to K turns.

    Args:
      key: PRNG key for the reset seeds (unless given) and for sampling.
      graphdef: static graph of the `Policy` module (from `nnx.split`).
      params: the policy's state.
      pool: the environments (`HostPool`); its `spec` sizes the prompt and observation blocks.
      tokenizer: the run's tokenizer (`rl4agents.text.Tokenizer`).
      cfg: rollout settings; only context="full" is supported.
      seeds: optional int[num_tasks] reset seeds; by default drawn from `key` (`task_seeds`).

    Returns:
      A `Trajectory` of B rows in the slot layout of `rollout.rollout` (tokens int32[B, T],
      masks bool[B, T], per-turn arrays [B, K]), group ids 0..num_tasks-1 each repeated G
      times; the G episodes of a task share its reset seed. See `host_rollout_info` for the
      failures, clipping flags and texts.
    """
    return host_rollout_info(key, graphdef, params, pool, tokenizer, cfg, seeds)[0]


def host_rollout_info(
    key: jax.Array,
    graphdef: nnx.GraphDef,
    params: Any,
    pool: pool_lib.HostPool,
    tokenizer,
    cfg: rollout_lib.RolloutConfig,
    seeds: np.ndarray | None = None,
) -> tuple[Trajectory, HostInfo]:
    """`host_rollout`, also returning the `HostInfo` of the batch.

    An episode whose environment raised or timed out ends there: that transition has an empty
    observation and reward `pool.failure_reward`, `done` is set and later turns are absent; a
    failed factory or reset gives an episode with no turns. `HostInfo.failed` flags them.

    Returns:
      (Trajectory of B rows as in `host_rollout`, HostInfo).
    """
    if cfg.context != "full":
        raise ValueError(f"rollout.context={cfg.context!r}; host rollouts allow only 'full'")
    lay = rollout_lib.make_layout(pool.spec, cfg)
    seeds = task_seeds(key, cfg.num_tasks) if seeds is None else np.asarray(seeds, np.int64)
    if seeds.shape != (cfg.num_tasks,):
        raise ValueError(f"seeds has shape {seeds.shape}; expected ({cfg.num_tasks},)")
    key_sample = jax.random.split(key)[1]
    pad = tokenizer.pad_id
    static = TurnStatic(graphdef, lay, cfg.temperature, cfg.top_k, cfg.top_p, pad, tokenizer.eoa_id)
    budget = cfg.max_episode_tokens or lay.turns * lay.action
    group_ids = np.arange(cfg.batch_size, dtype=np.int32) // cfg.group_size
    rec = _Record.empty(cfg.batch_size, lay, pad)

    t0 = time.perf_counter()
    _reset(rec, pool, tokenizer, lay, group_ids, seeds)
    rec.env_seconds += time.perf_counter() - t0
    t0 = time.perf_counter()
    ctx = prefill_prompt(params, rec.prompt_tokens, rec.prompt_valid, static=static)
    rec.policy_seconds += time.perf_counter() - t0
    obs_tok = np.full((cfg.batch_size, lay.obs), pad, np.int32)
    obs_valid = np.zeros((cfg.batch_size, lay.obs), bool)
    for k in range(lay.turns):
        rec.anchors[:, k] = rec.anchor  # the state each turn acts from (kept once ended)
        alive = ~rec.done & (rec.used < budget)
        if not alive.any():
            continue  # every episode has ended: the remaining turns are absent
        t0 = time.perf_counter()
        left = (budget - rec.used).astype(np.int32)
        ctx, sample = sample_turn(
            params,
            ctx,
            obs_tok,
            obs_valid,
            np.int32(k),
            alive,
            left,
            key_sample,
            np.bool_(cfg.greedy),
            static=static,
        )
        sample = jax.device_get(sample)
        rec.policy_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        obs_tok, obs_valid = _step(rec, pool, tokenizer, lay, k, alive, sample)
        rec.env_seconds += time.perf_counter() - t0
    del ctx
    return _trajectory(rec, lay, group_ids), rec.info(seeds)


@dataclasses.dataclass
class _Record:
    """Host-side buffers of a batch (NumPy), filled turn by turn."""

    prompt_tokens: np.ndarray  # int32[B, P]
    prompt_valid: np.ndarray  # bool[B, P]
    prompt_clipped: np.ndarray  # bool[B]
    tokens: np.ndarray  # int32[B, K, A+O] each turn's action then observation slots
    valid: np.ndarray  # bool[B, K, A+O]
    logp: np.ndarray  # f32[B, K, A+O]
    entropy: np.ndarray  # f32[B, K, A+O]
    turn_end: np.ndarray  # int32[B, K]
    rewards: np.ndarray  # f32[B, K]
    turn_valid: np.ndarray  # bool[B, K]
    action_valid: np.ndarray  # bool[B, K]
    anchors: np.ndarray  # uint32[B, K]
    obs_clipped: np.ndarray  # bool[B, K]
    anchor: np.ndarray  # uint32[B] anchor of the latest observation
    used: np.ndarray  # int32[B] action tokens sampled so far
    done: np.ndarray  # bool[B]
    success: np.ndarray  # bool[B]
    failed: np.ndarray  # bool[B]
    failures: list[pool_lib.Failure]
    actions: list[list[str]]
    observations: list[list[str]]
    env_seconds: float = 0.0
    policy_seconds: float = 0.0

    @classmethod
    def empty(cls, b: int, lay: rollout_lib.Layout, pad: int) -> _Record:
        turns, blk = (b, lay.turns), (b, lay.turns, lay.action + lay.obs)
        return cls(
            prompt_tokens=np.full((b, lay.prompt), pad, np.int32),
            prompt_valid=np.zeros((b, lay.prompt), bool),
            prompt_clipped=np.zeros(b, bool),
            tokens=np.full(blk, pad, np.int32),
            valid=np.zeros(blk, bool),
            logp=np.zeros(blk, np.float32),
            entropy=np.zeros(blk, np.float32),
            turn_end=np.full(turns, -1, np.int32),
            rewards=np.zeros(turns, np.float32),
            turn_valid=np.zeros(turns, bool),
            action_valid=np.zeros(turns, bool),
            anchors=np.zeros(turns, np.uint32),
            obs_clipped=np.zeros(turns, bool),
            anchor=np.zeros(b, np.uint32),
            used=np.zeros(b, np.int32),
            done=np.zeros(b, bool),
            success=np.zeros(b, bool),
            failed=np.zeros(b, bool),
            failures=[],
            actions=[[] for _ in range(b)],
            observations=[[] for _ in range(b)],
        )

    def observe(self, i: int, outcome: pool_lib.Outcome):
        """Record an outcome's observation text, anchor and failure for episode i."""
        self.anchor[i] = base.text_anchor(outcome.result.obs)
        self.observations[i].append(outcome.result.obs)
        if outcome.failure is not None:
            self.failed[i] = True
            self.failures.append(outcome.failure)

    def info(self, seeds: np.ndarray) -> HostInfo:
        return HostInfo(
            seeds=seeds,
            failed=self.failed,
            failures=self.failures,
            prompt_clipped=self.prompt_clipped,
            obs_clipped=self.obs_clipped,
            actions=self.actions,
            observations=self.observations,
            env_seconds=self.env_seconds,
            policy_seconds=self.policy_seconds,
        )


def _obs_ids(tokenizer, text: str, first: bool) -> list[int]:
    """The ids an observation adds to the context: its text's, or with a chat tokenizer
    (`rl4agents.models.chat.ChatTokenizer`) the observation as a user message followed by the
    assistant header (the first observation after the chat's first token, the slot-0 BOS)."""
    fmt = getattr(tokenizer, "chat", None)
    if fmt is None:
        return list(tokenizer.encode(text))
    return fmt.prompt_ids(text)[1:] if first else fmt.turn_ids(text)


def _encode(tokenizer, text: str, limit: int, first: bool = False) -> tuple[list[int], bool]:
    ids = _obs_ids(tokenizer, text, first)
    return ids[:limit], len(ids) > limit


def _reset(rec: _Record, pool, tokenizer, lay, group_ids, seeds):
    """Reset every episode; the prompt is BOS + the reset observation (clipped to P - 1)."""
    rec.prompt_tokens[:, 0], rec.prompt_valid[:, 0] = tokenizer.bos_id, True
    for i, oc in enumerate(pool.reset(group_ids, seeds[group_ids])):
        ids, rec.prompt_clipped[i] = _encode(tokenizer, oc.result.obs, lay.prompt - 1, True)
        rec.prompt_tokens[i, 1 : 1 + len(ids)], rec.prompt_valid[i, 1 : 1 + len(ids)] = ids, True
        rec.observe(i, oc)
    rec.done |= rec.failed  # a failed reset: an episode with no turns


def _step(rec: _Record, pool, tokenizer, lay, k: int, alive: np.ndarray, sample: TurnSample):
    """Record turn k's actions, step the alive episodes' environments, encode their replies.

    Returns:
      The observation block of turn k: tokens int32[B, O] and valid bool[B, O].
    """
    a_len = lay.action
    act_tok, act_on = np.asarray(sample.tokens), np.asarray(sample.active)
    rec.tokens[:, k, :a_len], rec.valid[:, k, :a_len] = act_tok, act_on
    rec.logp[:, k, :a_len], rec.entropy[:, k, :a_len] = sample.logp, sample.entropy
    n_act = act_on.sum(axis=1).astype(np.int32)
    content = act_on & (act_tok != tokenizer.eoa_id)
    texts = {
        int(i): tokenizer.decode(act_tok[i][content[i]].tolist()) for i in np.flatnonzero(alive)
    }
    obs_tok = np.full((len(alive), lay.obs), tokenizer.pad_id, np.int32)
    obs_valid = np.zeros((len(alive), lay.obs), bool)
    for i, oc in pool.step(texts, k).items():
        r = oc.result
        ids, rec.obs_clipped[i, k] = _encode(tokenizer, r.obs, lay.obs)
        obs_tok[i, : len(ids)], obs_valid[i, : len(ids)] = ids, True
        rec.rewards[i, k], rec.action_valid[i, k] = r.reward, r.valid_action
        rec.success[i] |= r.success
        rec.done[i] |= r.done
        rec.actions[i].append(texts[i])
        rec.observe(i, oc)
    rec.turn_valid[:, k] = alive
    start = lay.prompt + k * (lay.action + lay.obs)
    rec.turn_end[:, k] = np.where(alive & (n_act > 0), start + n_act - 1, -1)
    rec.tokens[:, k, a_len:], rec.valid[:, k, a_len:] = obs_tok, obs_valid
    rec.used += n_act
    return obs_tok, obs_valid


def _trajectory(rec: _Record, lay: rollout_lib.Layout, group_ids: np.ndarray) -> Trajectory:
    """The slot-layout `Trajectory` (device arrays) of the recorded batch."""
    b, a_len = len(group_ids), lay.action
    is_action = np.arange(lay.action + lay.obs) < a_len  # [A+O] action slots of a block
    turn_idx = np.arange(lay.turns, dtype=np.int32)[None, :, None]
    zeros_prompt = np.zeros((b, lay.prompt), np.float32)

    def slots(prompt, turns):  # prompt [B, P] + turns [B, K, A+O] -> [B, T]
        return np.concatenate([prompt, turns.reshape(b, -1)], axis=1)

    traj = Trajectory(
        tokens=slots(rec.prompt_tokens, rec.tokens),
        valid_mask=slots(rec.prompt_valid, rec.valid),
        action_mask=slots(np.zeros_like(rec.prompt_valid), rec.valid & is_action),
        obs_mask=slots(rec.prompt_valid, rec.valid & ~is_action),
        turn_ids=slots(np.full((b, lay.prompt), -1, np.int32), np.where(rec.valid, turn_idx, -1)),
        turn_end=rec.turn_end,
        logp_behavior=slots(zeros_prompt, rec.logp),
        turn_rewards=rec.rewards,
        turn_valid=rec.turn_valid,
        turn_action_valid=rec.turn_valid & rec.action_valid,
        anchors=rec.anchors,
        outcome_reward=rec.rewards.sum(axis=1),
        success=rec.success,
        done=rec.done,
        truncated=~rec.done,
        group_ids=group_ids,
        num_turns=rec.turn_valid.sum(axis=1).astype(np.int32),
        entropy_behavior=slots(zeros_prompt, rec.entropy),
    )
    return jax.tree.map(jnp.asarray, traj)
