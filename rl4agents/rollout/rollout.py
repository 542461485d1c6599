"""The jitted multi-turn rollout: sampling with a KV cache and environment steps in one program.

`rollout` runs B episodes (num_tasks tasks x G samples, the samples of a task sharing its
initial state) for up to K turns as one `lax.scan` over turns, each turn an inner scan over up
to A action tokens. There is no host round trip per token or per turn. Trajectories use the
slot layout of `rl4agents.types`: a prompt block of P slots, then per turn A action slots and
O observation slots; RoPE positions and attention masks come from the running count of valid
tokens, so the model sees exactly the packed sequence and a teacher-forced pass over the final
tokens (`score`) reproduces the recorded log-probs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl4agents.models import policy as policy_lib
from rl4agents.models import roles, sampling
from rl4agents.types import Trajectory


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    num_tasks: int  # distinct tasks per batch
    group_size: int  # G samples per task
    max_turns: int  # K
    max_action_len: int  # A, action slots per turn (an action ends at end-of-action or A)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    max_context_len: int = 0  # 0 = as long as K turns need; else K is cut to fit
    context: str = "full"  # "full" history | "window" of the last `window_turns` turns
    window_turns: int = 2  # k for context="window"
    max_episode_tokens: int = 0  # action tokens per episode at most (0 = no budget)
    # context="full": the K turns run in this many consecutive groups, each with a KV cache
    # just long enough for its turns, so early turns do not attend over empty slots (the cache
    # grows between groups; each group compiles its own copy of the turn).
    turn_groups: int = 1
    # R >= 2: the policy's parameters are R role sets stacked on a leading axis
    # (`models.roles`); turn k samples with set k mod R. 0 or 1: one set plays every turn.
    role_params: int = 0

    @property
    def batch_size(self) -> int:
        return self.num_tasks * self.group_size


class Layout(NamedTuple):
    """Static slot sizes of a rollout."""

    prompt: int  # P
    action: int  # A
    obs: int  # O
    turns: int  # K actually run (after fitting the context)
    length: int  # T = P + K * (A + O)


def make_layout(env, cfg: RolloutConfig) -> Layout:
    """Slot sizes for `env` under `cfg`; raises if not even one turn fits."""
    prompt, obs, action = 1 + env.max_prompt_len, env.max_obs_len, cfg.max_action_len
    if action < env.max_action_len:
        raise ValueError(
            f"rollout.max_action_len={action} is shorter than the environment's longest "
            f"action ({env.max_action_len} tokens); allowed: >= {env.max_action_len}"
        )
    turns = cfg.max_turns
    if cfg.context == "window":
        row = window_row_length(env, cfg)
        if cfg.max_context_len and cfg.max_context_len < row:
            raise ValueError(
                f"rollout.max_context_len={cfg.max_context_len} is too short for a step row "
                f"of context='window' (prompt {prompt} + {cfg.window_turns} turns x "
                f"{action + obs} + action {action} = {row} tokens); allowed: >= {row} or 0"
            )
        return Layout(prompt, action, obs, turns, prompt + turns * (action + obs))
    if cfg.max_context_len:
        need = prompt + action + obs
        if cfg.max_context_len < need:
            raise ValueError(
                f"rollout.max_context_len={cfg.max_context_len} is too short for one turn: "
                f"the prompt ({prompt}) + one action ({action}) + one observation ({obs}) "
                f"need {need} tokens; allowed: >= {need} or 0 (fit all turns)"
            )
        turns = min(turns, (cfg.max_context_len - prompt) // (action + obs))
    return Layout(prompt, action, obs, turns, prompt + turns * (action + obs))


def action_slots(lay: Layout) -> np.ndarray:
    """int32[K * A]: the slots of the K action blocks in the full-history layout (every slot
    an action token can occupy: slot `P + k (A + O) + a`)."""
    k, a = np.meshgrid(np.arange(lay.turns), np.arange(lay.action), indexing="ij")
    return (lay.prompt + k * (lay.action + lay.obs) + a).reshape(-1).astype(np.int32)


def turn_group_bounds(lay: Layout, groups: int) -> list[tuple[int, int, int]]:
    """(first turn, end turn, cache length) of each turn group of a context="full" rollout.

    The turns are split as evenly as possible into min(groups, K) groups; a group's cache
    holds the prompt and every slot up to the end of its last turn's observation.
    """
    n = max(1, min(groups, lay.turns))
    ends = [round(lay.turns * (i + 1) / n) for i in range(n)]
    starts = [0, *ends[:-1]]
    return [(k0, k1, lay.prompt + k1 * (lay.action + lay.obs)) for k0, k1 in zip(starts, ends)]


def window_row_length(env, cfg: RolloutConfig) -> int:
    """L, the slots of one step row under context="window": prompt + k turns + one action."""
    prompt, obs, action = 1 + env.max_prompt_len, env.max_obs_len, cfg.max_action_len
    return prompt + cfg.window_turns * (action + obs) + action


class StepRows(NamedTuple):
    """Step rows of a context="window" rollout: what the policy saw at each turn.

    docs/methods.md, "The slot layout and step rows". Row (b, k) is the prompt, the last
    `window_turns` turn blocks before turn k (action and observation slots, oldest first) and
    turn k's A action slots; L = `window_row_length`.
    """

    tokens: jax.Array  # int32[B, K, L]
    valid: jax.Array  # bool[B, K, L]
    action_mask: jax.Array  # bool[B, K, L] the A action slots of turn k that were sampled
    obs_target: jax.Array  # bool[B, K, L] the newest observation (of turn k-1) in the row
    logp: jax.Array  # f32[B, K, L] behaviour log-probs on action slots


def rows_to_slots(x: jax.Array, lay: Layout) -> jax.Array:
    """Move per-row action-slot values f32[B, K, L] to the full-history slots f32[B, T].

    Action slot a of row (b, k) (its last A slots) is slot `P + k (A + O) + a` of the episode;
    every other slot gets 0.
    """
    b, k, _ = x.shape
    act = x[:, :, -lay.action :]
    blocks = jnp.concatenate([act, jnp.zeros((b, k, lay.obs), x.dtype)], axis=2)
    return jnp.concatenate([jnp.zeros((b, lay.prompt), x.dtype), blocks.reshape(b, -1)], axis=1)


def slots_to_rows(x: jax.Array, lay: Layout, row_len: int) -> jax.Array:
    """Inverse of `rows_to_slots` on action slots: f32[B, T] -> f32[B, K, L] (0 elsewhere)."""
    b = x.shape[0]
    act = x[:, lay.prompt :].reshape(b, lay.turns, lay.action + lay.obs)[:, :, : lay.action]
    pad = jnp.zeros((b, lay.turns, row_len - lay.action), x.dtype)
    return jnp.concatenate([pad, act], axis=2)


class _Ctx(NamedTuple):
    cache: Any
    key_valid: jax.Array  # bool[B, T] slots written so far that are real tokens
    count: jax.Array  # int32[B] valid tokens so far (next RoPE position)
    logits: jax.Array  # f32[B, V] prediction for the next token


def _write(model, ctx: _Ctx, tokens, valid, start, shard=None) -> _Ctx:
    """Feed a chunk of S slots starting at slot `start`; keep logits of its last valid token.
    `shard`: the model's hidden-state constraint (`Policy(..., shard=)`), for the full batch."""
    b, s = tokens.shape
    length = ctx.key_valid.shape[1]
    key_valid = jax.lax.dynamic_update_slice(ctx.key_valid, valid, (0, start))
    positions = ctx.count[:, None] + jnp.cumsum(valid, axis=1) - 1
    positions = jnp.maximum(positions, 0)
    slots = start + jnp.arange(s)
    mask = key_valid[:, None, :] & (jnp.arange(length)[None, None, :] <= slots[None, :, None])
    if isinstance(start, int):  # a static start: keys after the chunk are not read at all
        mask = mask[:, :, : start + s]
    n_valid = valid.sum(axis=1)
    last = jnp.maximum(jnp.max(jnp.where(valid, jnp.arange(s), -1), axis=1), 0)
    # Only the last valid token's logits are needed: a prefill computes the last layer there.
    rows = last[:, None] if s > 1 else None
    out = model(tokens, positions, mask, ctx.cache, start, rows=rows, shard=shard)
    last_logits = out.logits[:, 0]
    logits = jnp.where((n_valid > 0)[:, None], last_logits, ctx.logits)
    return _Ctx(out.cache, key_valid, ctx.count + n_valid.astype(jnp.int32), logits)


class _TurnOut(NamedTuple):
    tokens: jax.Array  # int32[B, A+O]
    valid: jax.Array  # bool[B, A+O]
    action: jax.Array  # bool[B, A+O]
    obs: jax.Array  # bool[B, A+O]
    logp: jax.Array  # f32[B, A+O]
    entropy: jax.Array  # f32[B, A+O] entropy of the sampling distribution at action slots
    turn_end: jax.Array  # int32[B]
    reward: jax.Array  # f32[B]
    turn_valid: jax.Array  # bool[B]
    action_valid: jax.Array  # bool[B]
    anchor: jax.Array  # uint32[B]


def default_task_keys(key: jax.Array, num_tasks: int) -> jax.Array:
    """The task keys `rollout(key, ...)` draws when none are given: key[num_tasks]."""
    return jax.random.split(jax.random.split(key, 3)[0], num_tasks)


def rollout(
    key: jax.Array,
    graphdef: nnx.GraphDef,
    params: Any,
    env,
    env_params: Any,
    cfg: RolloutConfig,
    task_keys: jax.Array | None = None,
    shard_fn=None,
    greedy: jax.Array | None = None,
) -> Trajectory:
    """Run B = num_tasks x G episodes of up to K turns; pure and jittable.

    Args:
      key: PRNG key for tasks, sampling and environment noise.
      graphdef: static graph of the `Policy` module (from `nnx.split`).
      params: the policy's state (any `nnx.State` mergeable with graphdef).
      env: an environment (static).
      env_params: its params (pytree).
      cfg: static rollout settings.
      task_keys: optional key[num_tasks] that fix the tasks (e.g. evaluation seeds); by default
        tasks are drawn from `key`.
      shard_fn: optional function constraining per-episode pytrees to the batch sharding.
      greedy: optional traced bool[] or bool[B]: take the argmax (per row) instead of
        sampling, overriding `cfg.greedy`; one program then serves greedy and sampled runs.

    Returns:
      A `Trajectory` of B rows, group ids 0..num_tasks-1, each repeated G times. Under
      context="window" its tokens are the full history of what happened (for credit
      assignment), while the policy saw the step rows of `rollout_rows`.
    """
    return rollout_rows(key, graphdef, params, env, env_params, cfg, task_keys, shard_fn, greedy)[0]


class Carry(NamedTuple):
    """What the turn loop carries from one turn to the next (one row per episode).

    A value of this type is a moment of B episodes: forking an episode is copying its rows
    (`rl4agents.rollout.branch`). `ctx` is None under context="window" (each turn rebuilds its
    context from `hist_tok`) and a KV cache of the history so far under "full".
    """

    ctx: _Ctx | None
    hist_tok: jax.Array  # int32[B, W, A+O] the last W turn blocks (W = window_turns or 0)
    hist_valid: jax.Array  # bool[B, W, A+O]
    env_state: Any
    done: jax.Array  # bool[B]
    success: jax.Array  # bool[B]
    anchor: jax.Array  # uint32[B] anchor of the current state
    used: jax.Array  # int32[B] action tokens sampled so far


class Episodes(NamedTuple):
    """Per-episode constants of a turn loop: the prompt, the group ids and the loop's keys."""

    prompt_tokens: jax.Array  # int32[B, P]
    prompt_valid: jax.Array  # bool[B, P]
    group_ids: jax.Array  # int32[B]
    key_sample: jax.Array  # key for the policy's samples (folded with the turn index)
    key_env: jax.Array  # key for the environment's steps (folded with the turn index)


class TurnLoop(NamedTuple):
    """The pieces of `rollout_rows`, for callers that run the turn loop themselves.

    `start(key, task_keys)` -> (Episodes, Carry) at turn 0; `step(episodes, carry, k)` ->
    (Carry, (_TurnOut, StepRows | None)) runs turn k (traced k) for every row of `carry`, any
    batch size; `assemble(episodes, turns, rows, carry)` -> (Trajectory, StepRows | None) from
    the per-turn outputs stacked on a leading K axis; `groups` are the (first turn, end turn,
    cache length) of the turn groups and `grow(carry, length)` pads the cache to `length`.
    """

    lay: Layout
    start: Any
    step: Any
    assemble: Any
    groups: list
    grow: Any


def turn_loop(
    graphdef: nnx.GraphDef,
    params: Any,
    env,
    env_params: Any,
    cfg: RolloutConfig,
    shard_fn=None,
    greedy: jax.Array | None = None,
) -> TurnLoop:
    """Build the turn loop of `rollout_rows` (arguments as there); see `TurnLoop`."""
    if cfg.context not in ("full", "window"):
        raise ValueError(f"rollout.context={cfg.context!r}; allowed: ['full', 'window']")
    window = cfg.context == "window"
    if window and cfg.window_turns < 1:
        raise ValueError(f"rollout.window_turns={cfg.window_turns}; allowed: >= 1")
    if cfg.turn_groups < 1:
        raise ValueError(f"rollout.turn_groups={cfg.turn_groups}; allowed: >= 1")
    num_roles = cfg.role_params if roles.active(cfg.role_params) else 0
    shard = shard_fn or (lambda tree: tree)
    if num_roles:
        # R role sets: every set reads every token into its own cache (a leading R axis on
        # each leaf of `_Ctx`); a turn samples from its acting set's logits.
        model = nnx.merge(graphdef, roles.unstack(params, 0))  # its config only

        def write(ctx, tokens, valid, start, shard_model=None):
            def one(p, c):
                return _write(nnx.merge(graphdef, p), c, tokens, valid, start, shard_model)

            return jax.vmap(one)(params, ctx)

        def shard_ctx(ctx):
            return jax.vmap(shard)(ctx)

        def acting_logits(ctx, k):
            return ctx.logits[roles.role_of_turn(k, num_roles)]
    else:
        model = nnx.merge(graphdef, params)

        def write(ctx, tokens, valid, start, shard_model=None):
            return _write(model, ctx, tokens, valid, start, shard_model)

        shard_ctx = shard

        def acting_logits(ctx, k):
            del k
            return ctx.logits

    lay = make_layout(env, cfg)
    g = cfg.group_size
    blk = lay.action + lay.obs
    pad, bos, eoa = env.tokenizer.pad_id, env.tokenizer.bos_id, env.tokenizer.eoa_id
    budget = cfg.max_episode_tokens or lay.turns * lay.action
    row_len = window_row_length(env, cfg) if window else lay.length
    ctx_len = row_len - lay.action  # window: slots before the action slots of a row
    groups = [(0, lay.turns, row_len)] if window else turn_group_bounds(lay, cfg.turn_groups)

    def fresh_ctx(rows, length=row_len, sharded=True):
        ctx = _Ctx(
            cache=policy_lib.init_cache(model.cfg, rows, length),
            key_valid=jnp.zeros((rows, length), bool),
            count=jnp.zeros((rows,), jnp.int32),
            logits=jnp.zeros((rows, model.cfg.vocab_size), jnp.float32),
        )
        if num_roles:
            ctx = jax.tree.map(lambda x: jnp.stack([x] * num_roles), ctx)
        return shard_ctx(ctx) if sharded else ctx

    def grow(carry: Carry, length: int) -> Carry:  # pad the cache's slot axis to `length`
        extra = length - carry.ctx.key_valid.shape[-1]
        if extra == 0:
            return carry
        pad_ctx = functools.partial(_grow_ctx, extra=extra)
        ctx = jax.vmap(pad_ctx)(carry.ctx) if num_roles else pad_ctx(carry.ctx)
        return carry._replace(ctx=shard_ctx(ctx))

    def _grow_ctx(ctx, extra):
        cache = tuple(
            policy_lib.LayerCache(
                jnp.pad(c.k, ((0, 0), (0, 0), (0, 0), (0, extra))),
                jnp.pad(c.v, ((0, 0), (0, 0), (0, extra), (0, 0))),
            )
            for c in ctx.cache
        )
        key_valid = jnp.pad(ctx.key_valid, ((0, 0), (0, extra)))
        return ctx._replace(cache=cache, key_valid=key_valid)

    def start(key, task_keys=None) -> tuple[Episodes, Carry]:
        b = cfg.batch_size
        _, key_sample, key_env = jax.random.split(key, 3)
        if task_keys is None:
            task_keys = default_task_keys(key, cfg.num_tasks)
        group_ids = jnp.arange(b, dtype=jnp.int32) // g
        env_state, ts = jax.vmap(env.reset, in_axes=(0, None))(task_keys[group_ids], env_params)
        env_state, ts = shard((env_state, ts))
        # Prompt: BOS + the reset observation.
        prompt_tokens = jnp.concatenate([jnp.full((b, 1), bos, jnp.int32), ts.obs_tokens], axis=1)
        prompt_valid = jnp.concatenate(
            [jnp.ones((b, 1), bool), jnp.arange(lay.prompt - 1)[None, :] < ts.obs_len[:, None]],
            axis=1,
        )
        prompt_tokens = jnp.where(prompt_valid, prompt_tokens, pad)
        ctx = None
        if not window:  # the G samples of a task share its prompt: prefill it once per task
            first = jnp.arange(cfg.num_tasks) * g
            ctx = fresh_ctx(cfg.num_tasks, groups[0][2], sharded=g == 1)
            ctx = write(ctx, prompt_tokens[first], prompt_valid[first], 0)
            axis = 1 if num_roles else 0  # the batch axis (after the role axis)
            ctx = shard_ctx(jax.tree.map(lambda x: jnp.repeat(x, g, axis=axis), ctx))
        hist_shape = (b, cfg.window_turns if window else 0, blk)
        carry = Carry(
            ctx=ctx,
            hist_tok=jnp.full(hist_shape, pad, jnp.int32),
            hist_valid=jnp.zeros(hist_shape, bool),
            env_state=env_state,
            done=jnp.zeros((b,), bool),
            success=jnp.zeros((b,), bool),
            anchor=ts.anchor,
            used=jnp.zeros((b,), jnp.int32),
        )
        return Episodes(prompt_tokens, prompt_valid, group_ids, key_sample, key_env), carry

    sample_fn = functools.partial(
        sampling.sample,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        greedy=cfg.greedy if greedy is None else greedy,
    )

    def _token_step(carry, i, *, alive, start, key_turn, left, turn):
        ctx, stopped = carry
        logits = acting_logits(ctx, turn)
        token = sample_fn(jax.random.fold_in(key_turn, i), logits)
        active = alive & ~stopped & (i < left)
        logp_all = sampling.scaled_log_probs(logits, cfg.temperature)
        logp = jnp.take_along_axis(logp_all, token[:, None], axis=1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        token = jnp.where(active, token, pad)
        ctx = write(ctx, token[:, None], active[:, None], start + i, shard_fn)
        stopped = stopped | (token == eoa)
        out = (token, active, jnp.where(active, logp, 0.0), jnp.where(active, entropy, 0.0))
        return (ctx, stopped), out

    def step(eps: Episodes, carry: Carry, k):
        ctx, hist_tok, hist_valid, env_state, done, success, anchor, used = carry
        prompt_tokens, prompt_valid = eps.prompt_tokens, eps.prompt_valid
        b = prompt_tokens.shape[0]
        alive = ~done & (used < budget)
        if window:  # rebuild the context: prompt + the last window_turns blocks
            row_tok = jnp.concatenate([prompt_tokens, hist_tok.reshape(b, -1)], axis=1)
            row_valid = jnp.concatenate([prompt_valid, hist_valid.reshape(b, -1)], axis=1)
            ctx = write(fresh_ctx(b), row_tok, row_valid, 0, shard_fn)
            start = ctx_len
        else:
            start = lay.prompt + k * blk
        body = functools.partial(
            _token_step,
            alive=alive,
            start=start,
            key_turn=jax.random.fold_in(eps.key_sample, k),
            left=budget - used,
            turn=k,
        )
        (ctx, _), (act_tok, act_on, act_logp, act_ent) = jax.lax.scan(
            body, (ctx, jnp.zeros((b,), bool)), jnp.arange(lay.action)
        )
        act_tok, act_on, act_logp, act_ent = act_tok.T, act_on.T, act_logp.T, act_ent.T  # [B, A]
        content = act_on & (act_tok != eoa)
        action_len = content.sum(axis=1).astype(jnp.int32)
        env_keys = jax.random.split(jax.random.fold_in(eps.key_env, k), b)
        env_state, ts = jax.vmap(env.step, in_axes=(0, 0, 0, 0, None))(
            env_keys, env_state, jnp.where(content, act_tok, pad), action_len, env_params
        )
        obs_valid = (jnp.arange(lay.obs)[None, :] < ts.obs_len[:, None]) & alive[:, None]
        obs_tok = jnp.where(obs_valid, ts.obs_tokens, pad)
        n_act = act_on.sum(axis=1).astype(jnp.int32)
        zeros_obs = jnp.zeros(obs_valid.shape, jnp.float32)
        out = _TurnOut(
            tokens=jnp.concatenate([act_tok, obs_tok], axis=1),
            valid=jnp.concatenate([act_on, obs_valid], axis=1),
            action=jnp.concatenate([act_on, jnp.zeros_like(obs_valid)], axis=1),
            obs=jnp.concatenate([jnp.zeros_like(act_on), obs_valid], axis=1),
            logp=jnp.concatenate([act_logp, zeros_obs], axis=1),
            entropy=jnp.concatenate([act_ent, zeros_obs], axis=1),
            turn_end=jnp.where(alive & (n_act > 0), lay.prompt + k * blk + n_act - 1, -1),
            reward=jnp.where(alive, ts.reward, 0.0),
            turn_valid=alive,
            action_valid=alive & ts.valid_action,
            anchor=anchor,
        )
        rows = None
        if window:
            newest_obs = (
                jnp.concatenate(
                    [jnp.zeros((b, ctx_len - lay.obs), bool), hist_valid[:, -1, lay.action :]], 1
                )
                & alive[:, None]
            )  # rows of finished episodes train on nothing
            no_act = jnp.zeros((b, ctx_len), bool)
            rows = StepRows(
                tokens=jnp.concatenate([row_tok, act_tok], axis=1),
                valid=jnp.concatenate([row_valid, act_on], axis=1),
                action_mask=jnp.concatenate([no_act, act_on], axis=1),
                obs_target=jnp.concatenate([newest_obs, jnp.zeros_like(act_on)], axis=1),
                logp=jnp.concatenate([jnp.zeros((b, ctx_len)), act_logp], axis=1),
            )
            hist_tok = jnp.concatenate([hist_tok[:, 1:], out.tokens[:, None]], axis=1)
            hist_valid = jnp.concatenate([hist_valid[:, 1:], out.valid[:, None]], axis=1)
            ctx = None  # rebuilt next turn
        else:
            ctx = write(ctx, obs_tok, obs_valid, start + lay.action, shard_fn)
        success = success | (alive & ts.success)
        anchor = jnp.where(alive, ts.anchor, anchor)
        done = done | (alive & ts.done)
        carry = Carry(ctx, hist_tok, hist_valid, env_state, done, success, anchor, used + n_act)
        return carry, (out, rows)

    def assemble(eps: Episodes, turns: _TurnOut, rows, final: Carry):
        prompt_tokens, prompt_valid = eps.prompt_tokens, eps.prompt_valid
        b = prompt_tokens.shape[0]

        def _flat(x):  # [K, B, A+O] -> [B, K*(A+O)]
            return jnp.swapaxes(x, 0, 1).reshape(b, -1)

        turn_idx = jnp.repeat(jnp.arange(lay.turns, dtype=jnp.int32), blk)
        valid = jnp.concatenate([prompt_valid, _flat(turns.valid)], axis=1)
        tokens = jnp.concatenate([prompt_tokens, _flat(turns.tokens)], axis=1)
        turn_ids = jnp.concatenate(
            [
                jnp.full((b, lay.prompt), -1, jnp.int32),
                jnp.where(_flat(turns.valid), turn_idx, -1),
            ],
            axis=1,
        )
        rewards = turns.reward.T
        zeros_prompt = jnp.zeros(prompt_valid.shape, jnp.float32)
        traj = Trajectory(
            tokens=tokens,
            valid_mask=valid,
            action_mask=jnp.concatenate([jnp.zeros_like(prompt_valid), _flat(turns.action)], 1),
            obs_mask=jnp.concatenate([prompt_valid, _flat(turns.obs)], axis=1),
            turn_ids=turn_ids,
            turn_end=turns.turn_end.T,
            logp_behavior=jnp.concatenate([zeros_prompt, _flat(turns.logp)], axis=1),
            turn_rewards=rewards,
            turn_valid=turns.turn_valid.T,
            turn_action_valid=turns.action_valid.T,
            anchors=turns.anchor.T,
            outcome_reward=rewards.sum(axis=1),
            success=final.success,
            done=final.done,
            truncated=~final.done,
            group_ids=eps.group_ids,
            num_turns=turns.turn_valid.sum(axis=0).astype(jnp.int32),
            entropy_behavior=jnp.concatenate([zeros_prompt, _flat(turns.entropy)], axis=1),
        )
        if rows is not None:
            rows = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), rows)  # [B, K, L]
        return traj, rows

    return TurnLoop(lay, start, step, assemble, groups, grow)


def rollout_rows(
    key: jax.Array,
    graphdef: nnx.GraphDef,
    params: Any,
    env,
    env_params: Any,
    cfg: RolloutConfig,
    task_keys: jax.Array | None = None,
    shard_fn=None,
    greedy: jax.Array | None = None,
) -> tuple[Trajectory, StepRows | None]:
    """`rollout`, also returning the step rows the policy saw under context="window".

    context="full": one KV cache holds the whole history; each turn samples after it and the
    observation is prefilled into it. The G samples of a task share its reset, so the prompt is
    prefilled once per task and the cache copied to its G rows. context="window" (step rows:
    docs/methods.md, "The slot layout and step rows"): each turn's context is rebuilt from the
    prompt, the last `window_turns` turn blocks and nothing else, and prefilled into a fresh
    cache of L slots (`window_row_length`); the turn's actions are sampled after it.
    `max_episode_tokens` caps the action tokens of an episode in both modes: a turn stops
    sampling at the budget and an episode with no budget left ends, truncated.

    Returns:
      (Trajectory, StepRows) under context="window"; (Trajectory, None) under "full".
    """
    loop = turn_loop(graphdef, params, env, env_params, cfg, shard_fn, greedy)
    eps, carry = loop.start(key, task_keys)
    parts = []
    for k0, k1, length in loop.groups:
        if carry.ctx is not None:
            carry = loop.grow(carry, length)
        carry, part = jax.lax.scan(lambda c, k: loop.step(eps, c, k), carry, jnp.arange(k0, k1))
        parts.append(part)
    turns, rows = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)
    return loop.assemble(eps, turns, rows, carry)


class Scores(NamedTuple):
    logp: jax.Array  # f32[B, T] log-prob of each token given the valid tokens before it
    entropy: jax.Array  # f32[B, T] entropy of the distribution that predicted each token
    values: jax.Array | None  # f32[B, T] value of the state before each token, or None


def neighbour_slots(valid_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Previous and next valid slot of every slot.

    Args:
      valid_mask: bool[B, T].

    Returns:
      prev int32[B, T] (-1 if none) and next int32[B, T] (T if none).
    """
    t = valid_mask.shape[1]
    idx = jnp.arange(t, dtype=jnp.int32)
    prev_incl = jax.lax.cummax(jnp.where(valid_mask, idx, -1), axis=1)
    prev = jnp.concatenate([jnp.full_like(prev_incl[:, :1], -1), prev_incl[:, :-1]], axis=1)
    next_incl = jax.lax.cummin(jnp.where(valid_mask, idx, t), axis=1, reverse=True)
    nxt = jnp.concatenate([next_incl[:, 1:], jnp.full_like(next_incl[:, :1], t)], axis=1)
    return prev, nxt


def score(
    model: policy_lib.Policy,
    tokens: jax.Array,
    valid_mask: jax.Array,
    temperature: float = 1.0,
    with_values: bool = False,
    slots: jax.Array | None = None,
    prefix: int = 0,
    group: int = 1,
    shard=None,
    forks: policy_lib.ForkPrefix | None = None,
) -> Scores:
    """Teacher-forced pass over final trajectories in the slot layout.

    Args:
      model: the policy (merged).
      tokens: int32[B, T].
      valid_mask: bool[B, T].
      temperature: the sampling temperature (log-probs use logits / temperature).
      with_values: also evaluate the value head.
      slots: optional int32[B, R], distinct slots per row: score these slots only (e.g. the
        action slots a loss reads). The last layer then computes its queries, attention
        output and MLP, and the LM head and log-softmax run, at the R slots that predict them
        only; every slot still enters the keys and values. The other slots get 0. With
        `model.cfg.logit_chunk` > 0 the LM head, log-softmax and entropy run that many slots
        at a time (`Policy.log_probs`), never holding all [B, R, V] (or [B, T, V]) logits.
      prefix, group: static; the first `prefix` slots of each run of `group` consecutive rows
        are equal (the prompt a task's G samples share): computed once per run (see
        `policy.Decoder`). 0 = no sharing. Equal to the unshared pass (up to float summation
        order) when the prefixes are equal; wrong otherwise, so only for rows in group order.
      shard: optional constraint on the model's [B, S, D] hidden states (`Policy(...,
        shard=)`), e.g. the trainer's batch sharding; values are unchanged.
      forks: static `policy.ForkPrefix` of a branching batch (roots, then their branch rows):
        each branch row takes its root's keys, values and hidden states of the slots it shares
        with the root and computes the others (`policy.Decoder`); None = no sharing. Equal to
        the unshared pass (up to float summation order) on rows `branch.branch_rollout` makes;
        not with `prefix`.

    Returns:
      Scores: per-slot log-prob of the slot's token, entropy of its predicting distribution and
      the value of the state before it, all read at the previous valid slot; 0 where a slot has
      no previous valid slot (or is not in `slots`). With `slots`, the scored slots equal those
      of the full pass (up to float summation order).
    """
    b, t = tokens.shape
    positions = jnp.maximum(jnp.cumsum(valid_mask, axis=1) - 1, 0)
    causal = jnp.tril(jnp.ones((t, t), bool))
    mask = valid_mask[:, None, :] & causal[None]
    prev, nxt = neighbour_slots(valid_mask)
    if slots is not None:
        chex.assert_shape(slots, (b, None))
        src = jnp.take_along_axis(prev, slots, axis=1)  # [B, R] the predicting slots
        has_prev = src >= 0
        src = jnp.maximum(src, 0)
        out = model.features(
            tokens,
            positions,
            mask,
            with_values=with_values,
            rows=src,
            prefix=prefix,
            group=group,
            shard=shard,
            forks=forks,
        )
        # the token each predicting slot predicts: its next valid slot's (as the full pass)
        target = jnp.take_along_axis(
            tokens, jnp.minimum(jnp.take_along_axis(nxt, src, axis=1), t - 1), axis=1
        )
        logp, ent = model.log_probs(out.hidden, target, temperature)  # [B, R] each

        # a scatter per row (vmapped): row-local under a batch-sharded mesh, where a scatter
        # indexed by (row, slot) pairs made the partitioner gather the batch on every device
        def put(x):
            def one(s, v):
                return jnp.zeros((t,), v.dtype).at[s].set(v)

            return jax.vmap(one)(slots, jnp.where(has_prev, x, 0.0))

        values = None if out.values is None else put(out.values)
        return Scores(put(logp), put(ent), values)
    out = model.features(
        tokens,
        positions,
        mask,
        with_values=with_values,
        prefix=prefix,
        group=group,
        shard=shard,
        forks=forks,
    )
    target = jnp.take_along_axis(tokens, jnp.minimum(nxt, t - 1), axis=1)
    logp_src, ent_src = model.log_probs(out.hidden, target, temperature)  # [B, T] each
    has_prev = prev >= 0
    src = jnp.maximum(prev, 0)

    def at_prev(x):
        return jnp.where(has_prev, jnp.take_along_axis(x, src, axis=1), 0.0)

    values = None if out.values is None else at_prev(out.values)
    return Scores(at_prev(logp_src), at_prev(ent_src), values)


def score_params(
    graphdef: nnx.GraphDef,
    params: Any,
    tokens: jax.Array,
    valid_mask: jax.Array,
    temperature: float = 1.0,
    with_values: bool = False,
    slots: jax.Array | None = None,
    prefix: int = 0,
    group: int = 1,
    shard=None,
    *,
    role_params: int = 0,
    turn_ids: jax.Array | None = None,
    forks: policy_lib.ForkPrefix | None = None,
) -> Scores:
    """`score` of the policy with state `params` (merged with `graphdef`), one set or R.

    With `role_params` = R >= 2, `params` holds R role sets stacked on a leading axis
    (`models.roles`): every set scores every slot (R teacher-forced passes, vmapped) and each
    slot keeps the log-prob and entropy of the set that generated its token, set
    `turn_ids mod R` (`roles.role_of_slot`); the gradient of set r then comes from the slots of
    role r only. 0 or 1: `score(nnx.merge(graphdef, params), ...)`.

    Args:
      graphdef, params: the policy (params: one set, or R stacked).
      tokens, valid_mask, temperature, with_values, slots, prefix, group, shard, forks: as
        `score`.
      role_params: R (0 or 1: one set).
      turn_ids: int32[B, T] each slot's turn index, -1 for prompt and padding; needed with
        R >= 2.

    Returns:
      Scores with f32[B, T] log-probs and entropies (values None with R >= 2).
    """
    if not roles.active(role_params):
        model = nnx.merge(graphdef, params)
        return score(
            model, tokens, valid_mask, temperature, with_values, slots, prefix, group, shard, forks
        )
    if with_values or turn_ids is None:
        raise ValueError(
            f"score_params with role_params={role_params} needs turn_ids and no values "
            f"(with_values={with_values}, turn_ids given: {turn_ids is not None}); allowed: "
            "turn_ids int32[B, T] and with_values=False"
        )
    chex.assert_equal_shape((tokens, turn_ids))

    def one(p):
        sc = score(
            nnx.merge(graphdef, p),
            tokens,
            valid_mask,
            temperature,
            False,
            slots,
            prefix,
            group,
            shard,
            forks,
        )
        return sc.logp, sc.entropy

    logp, entropy = jax.vmap(one)(params)  # [R, B, T] each
    role = roles.role_of_slot(turn_ids, role_params)
    return Scores(roles.pick(logp, role), roles.pick(entropy, role), None)
