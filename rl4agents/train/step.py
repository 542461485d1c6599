"""The pure train step: rollout, rewards, advantages and E x M optax updates in one program."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl4agents import sharding
from rl4agents.credit import common as credit_common
from rl4agents.credit import token as credit_token
from rl4agents.losses import aggregate as agg_lib
from rl4agents.losses import policy as policy_losses
from rl4agents.losses import regularizers, shaping
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train.state import TrainState
from rl4agents.types import Trajectory


@dataclasses.dataclass(frozen=True)
class LossConfig:
    policy_fn: Callable[..., Any]  # partial of a registered policy loss (hparams bound)
    agg: str = "token-mean"  # aggregation of the entropy / KL / value terms (the policy loss's)
    agg_scale: float | None = None  # the policy loss's C for "seq-mean-token-sum-norm"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # the KL term in the loss (verl `kl_loss_type` low_var_kl)
    kl_in_reward: bool = False  # KL as a per-token reward penalty instead of a loss term
    kl_reward_estimator: str = "k1"  # the KL in the reward (verl `algorithm.kl_penalty` "kl")
    # beta of the KL in the reward: "fixed" (kl_coef) or "adaptive" (starts at kl_coef, then
    # `regularizers.adaptive_kl_coef` each step towards kl_target; held in TrainState.kl_coef)
    kl_ctrl: str = "fixed"
    kl_target: float = 0.1  # verl `kl_ctrl.target_kl`
    kl_horizon: float = 10000.0  # verl `kl_ctrl.horizon`
    value_coef: float = 0.5
    value_clip: float | None = 0.5  # PPO value clipping around V_old (None = off)
    echo_coef: float = 0.0  # ECHO: cross-entropy on environment-observation tokens
    tis_cap: float = 0.0  # truncated importance sampling cap (0 = off)
    tis_mode: str = "token"
    policy_takes_segments: bool = False  # the policy loss accepts `segment_ids` (turn ids)


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
    """Reward shaping applied to the episodes before credit assignment."""

    overlong_buffer: int = 0  # DAPO overlong penalty buffer in tokens (0 = off)
    overlong_factor: float = 1.0
    overlong_per: str = "turn"  # "turn" (max length A) | "episode" (max length K * A)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Batch-level sampling: DAPO dynamic sampling."""

    dynamic: bool = False  # keep only groups whose rewards differ, refilling the batch
    max_gen_batches: int = 4  # rollouts per step at most while refilling


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything static a train step closes over (resolved from the config)."""

    graphdef: Any
    env: Any
    env_params: Any
    rollout: rollout_lib.RolloutConfig
    credit_fn: Callable[..., Any]  # partial of a registered credit function
    needs_values: bool
    loss: LossConfig
    optimizer: optax.GradientTransformation
    epochs: int = 1
    minibatches: int = 1
    mesh: Any = None
    needs_greedy: bool = False  # the credit function needs a greedy episode per task (ReMax)
    shaping: ShapingConfig = ShapingConfig()
    sampling: SamplingConfig = SamplingConfig()
    grad_accum: int = 1  # microbatches per minibatch, gradients summed before one update
    # Prompt slots the G samples of a task share, computed once per group by the update's
    # teacher-forced passes (0 = off); see `shared_prefix`. Only for episodes in group order
    # whose first `shared_prompt` slots (tokens and validity) are equal within each group, as
    # `rollout` makes them; the passes read each group's first row there.
    shared_prompt: int = 0


def shared_prefix(cfg: StepConfig, full_batch: bool) -> tuple[int, int]:
    """(prefix, group) for `rollout.score` on the update's rows: the prompt is shared by each
    run of G rows under context="full" when the rows are the whole batch in group order (every
    pass of `prepare_batch`; the loss's pass with one minibatch and no microbatches). Else
    (0, 1): no sharing."""
    whole = full_batch or (cfg.minibatches == 1 and cfg.grad_accum == 1)
    g = cfg.rollout.group_size
    if cfg.shared_prompt and g > 1 and cfg.rollout.context == "full" and whole:
        return cfg.shared_prompt, g
    return 0, 1


class Batch(NamedTuple):
    tokens: jax.Array  # int32[B, T]
    valid_mask: jax.Array  # bool[B, T]
    action_mask: jax.Array  # bool[B, T]
    logp_old: jax.Array  # f32[B, T]
    advantages: jax.Array  # f32[B, T]
    returns: jax.Array  # f32[B, T] (zeros without a critic)
    values_old: jax.Array  # f32[B, T] (zeros without a critic)
    logp_ref: jax.Array  # f32[B, T] on `score_slots` (0 elsewhere; zeros without KL)
    weights: jax.Array  # f32[B, T] per-token loss weights (TIS; ones otherwise)
    obs_target: jax.Array  # bool[B, T] environment-observation tokens (ECHO targets)
    turn_ids: jax.Array  # int32[B, T] turn index per slot, -1 for prompt/pad
    # int32[B, R] the slots the losses read (every slot an action token can occupy), scored
    # alone by the teacher-forced pass; None: score every slot (ECHO reads observation slots)
    score_slots: jax.Array | None = None


def loss_fn(params, batch: Batch, cfg: StepConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy loss + entropy bonus + KL to the reference (k-estimator, in the loss) + value loss.

    The entropy, KL and value terms use the policy loss's aggregation (`agg`, and `agg_scale`
    for "seq-mean-token-sum-norm"), as verl applies one `agg_loss` mode to every term.
    """
    model = nnx.merge(cfg.graphdef, params)
    lc = cfg.loss
    prefix, group = shared_prefix(cfg, full_batch=False)
    sc = rollout_lib.score(
        model,
        batch.tokens,
        batch.valid_mask,
        cfg.rollout.temperature,
        cfg.needs_values,
        slots=batch.score_slots,
        prefix=prefix,
        group=group,
        shard=sharding.batch_constraint(cfg.mesh),
    )
    mask = batch.action_mask
    extra = {"segment_ids": batch.turn_ids} if lc.policy_takes_segments else {}
    pg_loss, metrics = lc.policy_fn(
        sc.logp, batch.logp_old, batch.advantages, mask, batch.weights, **extra
    )
    entropy = agg_lib.aggregate(sc.entropy, mask, lc.agg, lc.agg_scale)
    loss = pg_loss - lc.entropy_coef * entropy
    metrics = {**metrics, "pg_loss": pg_loss, "entropy": entropy}
    if lc.echo_coef > 0:
        echo = regularizers.echo_loss(sc.logp, batch.obs_target)
        loss = loss + lc.echo_coef * echo
        metrics["echo_ce"] = echo
    if lc.kl_coef > 0 and not lc.kl_in_reward:
        kl = agg_lib.aggregate(
            regularizers.kl_penalty(sc.logp, batch.logp_ref, lc.kl_estimator),
            mask,
            lc.agg,
            lc.agg_scale,
        )
        loss = loss + lc.kl_coef * kl
        metrics["kl_ref"] = kl
    if cfg.needs_values:
        v_loss, v_metrics = policy_losses.value_loss(
            sc.values,
            batch.values_old,
            batch.returns,
            mask,
            clip=lc.value_clip,
            agg=lc.agg,
            agg_scale=lc.agg_scale,
        )
        loss = loss + lc.value_coef * v_loss
        metrics = {**metrics, **v_metrics, "value_loss": v_loss}
    metrics["loss"] = loss
    return loss, jax.lax.stop_gradient(metrics)


def rollout_metrics(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
    """Scalar summaries of a batch of episodes."""
    turns = jnp.maximum(traj.turn_valid.sum(), 1)
    rewards = traj.outcome_reward.reshape(-1, group_size)
    return {
        "reward": traj.outcome_reward.mean(),
        "success": traj.success.mean(),
        "turns": traj.num_turns.mean(),
        "invalid_rate": (traj.turn_valid & ~traj.turn_action_valid).sum() / turns,
        "truncated": traj.truncated.mean(),
        "zero_std_groups": jnp.mean(jnp.all(rewards == rewards[:, :1], axis=1)),
        "action_tokens": traj.action_mask.sum(axis=1).mean(),
        "context_tokens": traj.valid_mask.sum(axis=1).mean(),
    }


def train_length(cfg: StepConfig) -> int:
    """Slots the update needs: everything up to the last action block (the final observation
    block is never trained on by the policy loss, so it is left out of the forward pass),
    or every slot when ECHO trains on observation tokens."""
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    return lay.length if cfg.loss.echo_coef > 0 else lay.length - lay.obs


def shape_rewards(traj: Trajectory, cfg: StepConfig) -> Trajectory:
    """DAPO overlong penalty on each turn's (or each episode's) number of action tokens.

    "turn": `turn_rewards[b, k] += overlong_penalty(len_k, A, buffer, factor)`; "episode": the
    penalty of the episode's total action tokens against `K * A` is added to its last turn.
    `outcome_reward` is recomputed as the sum of turn rewards. Identity when the buffer is 0.
    """
    sh = cfg.shaping
    if sh.overlong_buffer <= 0:
        return traj
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    _, count, _ = credit_common.turn_token_stats(jnp.zeros(traj.tokens.shape), traj)
    if sh.overlong_per == "turn":
        pen = shaping.overlong_penalty(count, lay.action, sh.overlong_buffer, sh.overlong_factor)
        pen = jnp.where(traj.turn_valid, pen, 0.0)
    else:
        total = jnp.sum(count, axis=1)
        pen_ep = shaping.overlong_penalty(
            total, lay.turns * lay.action, sh.overlong_buffer, sh.overlong_factor
        )
        last = jnp.arange(traj.max_turns)[None, :] == (traj.num_turns[:, None] - 1)
        pen = jnp.where(last & traj.turn_valid, pen_ep[:, None], 0.0)
    rewards = traj.turn_rewards + pen
    return traj.replace(turn_rewards=rewards, outcome_reward=rewards.sum(axis=1))


def informative_groups(traj: Trajectory, group_size: int) -> jax.Array:
    """bool[num_tasks]: the group's episode rewards are not all equal (DAPO's filter)."""
    r = traj.outcome_reward.reshape(-1, group_size)
    return ~jnp.all(r == r[:, :1], axis=1)


def _group_scatter(buf, new, dest, group_size):
    """Write the groups of `new` to group slots `dest` of `buf` (out-of-range dest: dropped)."""

    def put(b, n):
        if b is None:
            return None
        shape = (-1, group_size) + b.shape[1:]
        out = b.reshape(shape).at[dest].set(n.reshape(shape), mode="drop")
        return out.reshape(b.shape)

    return jax.tree.map(put, buf, new, is_leaf=lambda x: x is None)


def dynamic_rollout(key, params, cfg: StepConfig, shard_fn):
    """DAPO dynamic sampling: roll out batches until `num_tasks` informative groups are found
    (or `max_gen_batches` batches), keeping only groups whose rewards are not all equal.

    Inside one `lax.while_loop`: batch i uses `fold_in(key, i)`; its informative groups fill
    the next free group slots in order. Slots still free at the end hold empty episodes (no
    action tokens), which add nothing to any loss (DAPO raises instead; a jitted step cannot).
    A group left out (all rewards equal) takes its KL and ECHO terms with it, as in DAPO;
    without dynamic sampling nothing filters on advantages, so a group whose advantages are
    all 0 still trains its KL and ECHO terms.

    Returns:
      (Trajectory with group ids 0..num_tasks-1, metrics: `ds/gen_batches`,
      `ds/filled_frac`, and reward/success over every generated episode).
    """
    rc, g = cfg.rollout, cfg.rollout.group_size
    n = rc.num_tasks

    def gen(i):
        traj = rollout_lib.rollout(
            jax.random.fold_in(key, i),
            cfg.graphdef,
            params,
            cfg.env,
            cfg.env_params,
            rc,
            shard_fn=shard_fn,
        )
        return shape_rewards(traj, cfg)

    shapes = jax.eval_shape(gen, 0)
    empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    empty = empty.replace(
        turn_end=jnp.full(shapes.turn_end.shape, -1, jnp.int32),
        turn_ids=jnp.full(shapes.turn_ids.shape, -1, jnp.int32),
        truncated=jnp.ones(shapes.truncated.shape, bool),
    )

    def cond(carry):
        i, _, filled, _ = carry
        return (filled < n) & (i < cfg.sampling.max_gen_batches)

    def body(carry):
        i, buf, filled, sums = carry
        traj = gen(i)
        ok = informative_groups(traj, g)
        dest = jnp.where(ok, filled + jnp.cumsum(ok) - 1, n)
        buf = _group_scatter(buf, traj, dest, g)
        sums = sums + jnp.stack([traj.outcome_reward.sum(), traj.success.sum(), 1.0 * ok.sum()])
        return i + 1, buf, jnp.minimum(filled + ok.sum(), n), sums

    init = (jnp.zeros((), jnp.int32), empty, jnp.zeros((), jnp.int32), jnp.zeros(3))
    i, traj, filled, sums = jax.lax.while_loop(cond, body, init)
    b = rc.batch_size
    traj = traj.replace(group_ids=jnp.arange(b, dtype=jnp.int32) // g)
    generated = (i * b).astype(jnp.float32)
    metrics = {
        "ds/gen_batches": i.astype(jnp.float32),
        "ds/filled_frac": filled / n,
        "ds/informative_frac": sums[2] / (i * n),
        "reward_all": sums[0] / generated,
        "success_all": sums[1] / generated,
    }
    return traj, metrics


def greedy_baseline(key, params, traj: Trajectory, cfg: StepConfig, shard_fn) -> Trajectory:
    """Add ReMax's baseline: the score of one greedy episode on each episode's task."""
    rc = dataclasses.replace(cfg.rollout, group_size=1, greedy=True)
    greedy = rollout_lib.rollout(
        jax.random.fold_in(key, 1),
        cfg.graphdef,
        params,
        cfg.env,
        cfg.env_params,
        rc,
        task_keys=rollout_lib.default_task_keys(key, cfg.rollout.num_tasks),
        shard_fn=shard_fn,
    )
    greedy = shape_rewards(greedy, cfg)
    return traj.replace(baseline_reward=greedy.outcome_reward[traj.group_ids])


class _View(NamedTuple):
    """What the update trains on, as N rows of L slots, and the map to the episodes' slots.

    context="full": the episodes themselves (N = B, L = `train_length`). context="window":
    the step rows (N = B * K, L = the row length). Credit is always computed on the episodes'
    full-history slots; `to_slots` / `from_slots` move per-slot values between the two (they
    are exact on action slots, where every estimator's inputs and outputs live).
    """

    tokens: jax.Array  # int32[N, L]
    valid: jax.Array  # bool[N, L]
    action_mask: jax.Array  # bool[N, L]
    logp_behavior: jax.Array  # f32[N, L]
    obs_target: jax.Array  # bool[N, L]
    turn_ids: jax.Array  # int32[N, L]
    action_slots: np.ndarray  # int32[R] every slot of a row an action token can occupy
    to_slots: Callable[[jax.Array], jax.Array]  # f32[N, L] -> f32[B, T]
    from_slots: Callable[[jax.Array], jax.Array]  # f32[B, T] -> f32[N, L]


def _full_view(traj: Trajectory, cfg: StepConfig) -> _View:
    t_full, t_train = traj.tokens.shape[1], train_length(cfg)

    def cut(x):
        return x[:, :t_train]

    return _View(
        tokens=cut(traj.tokens),
        valid=cut(traj.valid_mask),
        action_mask=cut(traj.action_mask),
        logp_behavior=cut(traj.logp_behavior),
        obs_target=cut(traj.obs_mask & traj.valid_mask & (traj.turn_ids >= 0)),
        turn_ids=cut(traj.turn_ids),
        action_slots=rollout_lib.action_slots(rollout_lib.make_layout(cfg.env, cfg.rollout)),
        # the cut slots hold no action tokens
        to_slots=lambda x: jnp.pad(x, ((0, 0), (0, t_full - t_train))),
        from_slots=cut,
    )


def _window_view(traj: Trajectory, rows: rollout_lib.StepRows, cfg: StepConfig) -> _View:
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    b, k, row_len = rows.tokens.shape

    def flat(x):
        return x.reshape(b * k, row_len)

    turn = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :, None], rows.tokens.shape)
    return _View(
        tokens=flat(rows.tokens),
        valid=flat(rows.valid),
        action_mask=flat(rows.action_mask),
        logp_behavior=flat(rows.logp),
        obs_target=flat(rows.obs_target),
        turn_ids=flat(jnp.where(rows.action_mask, turn, -1)),
        action_slots=np.arange(row_len - lay.action, row_len, dtype=np.int32),
        to_slots=lambda x: rollout_lib.rows_to_slots(x.reshape(b, k, row_len), lay),
        from_slots=lambda x: flat(rollout_lib.slots_to_rows(x, lay, row_len)),
    )


def tail_credit(model, traj: Trajectory, cfg: StepConfig, window: bool, prefix, group, shard):
    """Credit for an estimator that bootstraps truncated rows (`bootstrap_truncated=True`).

    Its values come from one more teacher-forced pass, over the whole trajectory plus one
    padding slot (`credit.token.with_tail_slot`), so that every row holds the value of the
    state after its final observation; advantages and returns are cut back to T slots.
    """
    if window:
        raise ValueError(
            "credit bootstrap_truncated=True needs rollout.context='full'; got 'window' (a "
            "step row holds no value after the episode's final observation)"
        )
    padded = credit_token.with_tail_slot(traj)
    values = rollout_lib.score(
        model,
        padded.tokens,
        padded.valid_mask,
        cfg.rollout.temperature,
        True,
        prefix=prefix,
        group=group,
        shard=shard,
    ).values
    out = cfg.credit_fn(padded, values)
    t = traj.tokens.shape[1]
    returns = None if out.returns is None else out.returns[:, :t]
    return out._replace(advantages=out.advantages[:, :t], returns=returns)


def initial_kl_coef(lc: LossConfig) -> jax.Array | None:
    """`TrainState.kl_coef` of a fresh run: f32[] beta under the adaptive controller, else None."""
    return jnp.asarray(lc.kl_coef, jnp.float32) if lc.kl_ctrl == "adaptive" else None


def prepare_batch(
    state: TrainState, traj: Trajectory, cfg: StepConfig, rows: rollout_lib.StepRows | None = None
):
    """Old values / reference log-probs (one teacher-forced pass each) and advantages.

    Credit is assigned on the episodes (`traj`, full-history slots); the update trains on the
    episodes cut to `train_length(cfg)` slots, or with `rows` (context="window") on the step
    rows, with values, penalties and advantages moved between the two on action slots.

    Returns a `Batch` of N rows and advantage metrics.
    """
    view = _full_view(traj, cfg) if rows is None else _window_view(traj, rows, cfg)
    tokens, valid, mask = view.tokens, view.valid, view.action_mask
    lc = cfg.loss
    # The losses read log-probs only on action slots (ECHO also on observation slots): score
    # those alone (see `rollout_lib.score`). Old values stay on every slot for the credit.
    slots = None
    if lc.echo_coef <= 0:
        slots = jnp.broadcast_to(
            jnp.asarray(view.action_slots), (tokens.shape[0], len(view.action_slots))
        )
    values_old = logp_ref = logp_learner = None
    kl_metrics = {}
    model = nnx.merge(cfg.graphdef, state.params)
    prefix, group = shared_prefix(cfg, full_batch=True) if rows is None else (0, 1)
    pin = sharding.batch_constraint(cfg.mesh)
    if cfg.needs_values or lc.tis_cap > 0:
        sc = rollout_lib.score(
            model,
            tokens,
            valid,
            cfg.rollout.temperature,
            cfg.needs_values,
            prefix=prefix,
            group=group,
            shard=pin,
        )
        values_old = sc.values
        logp_learner = sc.logp
    logp_behavior = view.logp_behavior
    if lc.kl_coef > 0:
        ref = nnx.merge(cfg.graphdef, state.ref_params)
        logp_ref = rollout_lib.score(
            ref,
            tokens,
            valid,
            cfg.rollout.temperature,
            slots=slots,
            prefix=prefix,
            group=group,
            shard=pin,
        ).logp
        if lc.kl_in_reward:  # methods.md 7.2: r_t -= beta * KL(old, ref) on action tokens
            # "old" is the learner's log-probs where a pass computed them (verl's recomputed
            # old_log_probs), else the sampler's: the same up to numerics without a mismatch.
            logp_kl = logp_behavior if logp_learner is None else logp_learner
            kl = regularizers.kl_penalty(logp_kl, logp_ref, lc.kl_reward_estimator)
            beta = state.kl_coef if lc.kl_ctrl == "adaptive" else lc.kl_coef
            traj = traj.replace(token_penalty=view.to_slots(jnp.where(mask, beta * kl, 0.0)))
            # Rows without action tokens (unfilled or finished) are left out of the KL and n.
            kl_now, kl_rows = regularizers.sequence_mean_kl(kl, mask)
            kl_metrics = {
                "kl_reward": kl_now,
                "kl_rows": kl_rows,
                "kl_coef": jnp.asarray(beta, jnp.float32),
            }
    if credit_token.bootstraps_truncated(cfg.credit_fn):  # needs the value after a row's end
        out = tail_credit(model, traj, cfg, rows is not None, prefix, group, pin)
    else:
        out = cfg.credit_fn(traj, None if values_old is None else view.to_slots(values_old))
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    weights = jnp.ones(tokens.shape, jnp.float32)
    logp_old = logp_behavior
    if lc.tis_cap > 0:  # the learner's log-probs are the PPO anchor; w corrects the sampler
        weights = policy_losses.tis_weights(
            logp_learner, logp_behavior, mask, cap=lc.tis_cap, mode=lc.tis_mode
        )
        logp_old = jnp.where(mask, logp_learner, 0.0)
    batch = Batch(
        tokens=tokens,
        valid_mask=valid,
        action_mask=mask,
        logp_old=logp_old,
        advantages=view.from_slots(out.advantages),
        returns=zeros if out.returns is None else view.from_slots(out.returns),
        values_old=zeros if values_old is None else jnp.where(mask, values_old, 0.0),
        logp_ref=zeros if logp_ref is None else logp_ref,
        weights=weights,
        obs_target=view.obs_target,
        turn_ids=view.turn_ids,
        score_slots=slots,
    )
    adv_metrics = {
        "adv_mean": credit_common.masked_mean(out.advantages, traj.action_mask),
        "adv_abs": credit_common.masked_mean(jnp.abs(out.advantages), traj.action_mask),
        **out.metrics,
        **kl_metrics,
    }
    return batch, adv_metrics


def train_step(
    state: TrainState, key_root: jax.Array, cfg: StepConfig
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL iteration; pure. The step's key is `fold_in(key_root, state.step)`.

    Args:
      state: the training state.
      key_root: the run's root key; per-step randomness derives from it and the step number,
        so a resumed run replays the same randomness.
      cfg: static step configuration.

    Returns:
      The updated state and a flat dict of f32[] metrics.
    """
    key = jax.random.fold_in(key_root, state.step)
    key_rollout, key_perm = jax.random.split(key)

    shard_fn = sharding.batch_constraint(cfg.mesh)
    ds_metrics = {}
    rows = None
    if cfg.sampling.dynamic:
        traj, ds_metrics = dynamic_rollout(key_rollout, state.params, cfg, shard_fn)
    else:
        traj, rows = rollout_lib.rollout_rows(
            key_rollout,
            cfg.graphdef,
            state.params,
            cfg.env,
            cfg.env_params,
            cfg.rollout,
            shard_fn=shard_fn,
        )
        traj = shape_rewards(traj, cfg)
    if cfg.needs_greedy:
        traj = greedy_baseline(key_rollout, state.params, traj, cfg, shard_fn)
    new_state, metrics = update(state, traj, key_perm, cfg, rows)
    if cfg.sampling.dynamic:  # a group of equal non-finite rewards is filtered out of `traj`
        bad = ~jnp.isfinite(ds_metrics["reward_all"])
        new_state = keep_if(bad, state, new_state)
        metrics = {
            **metrics,
            "nonfinite": jnp.maximum(metrics["nonfinite"], bad.astype(jnp.float32)),
            "nonfinite_rewards": jnp.maximum(metrics["nonfinite_rewards"], bad.astype(jnp.float32)),
        }
    return new_state, {**metrics, **ds_metrics}


def update(
    state: TrainState,
    traj: Trajectory,
    key_perm: jax.Array,
    cfg: StepConfig,
    rows: rollout_lib.StepRows | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """The learning half of `train_step`: credit, then `epochs` x `minibatches` updates; pure.

    Used by `train_step` after its jitted rollout, and on its own by trainers whose episodes
    come from elsewhere (host environments, `rl4agents.envs.host`). With
    `cfg.shared_prompt` > 0 the episodes must be in group order with equal prompt slots within
    each group (as `rollout` makes them); else build the config with `shared_prompt=0`.

    Args:
      state: the training state.
      traj: B episodes in the slot layout of `cfg.rollout` (B = num_tasks x group_size).
      key_perm: key for the minibatch permutation.
      cfg: static step configuration.
      rows: the step rows the policy saw under context="window", else None.

    Returns:
      The updated state (step + 1) and a flat dict of f32[] metrics. When a reward, the loss,
      the gradient norm or the updated state is not finite, the returned state is `state`
      itself (step not advanced) and the metrics say so (`nonfinite_metrics`).
    """
    traj = sharding.shard_batch(traj, cfg.mesh)
    batch, adv_metrics = prepare_batch(state, traj, cfg, rows)
    b = batch.tokens.shape[0]
    mb = b // cfg.minibatches
    grad_fn = jax.grad(loss_fn, has_aux=True)

    def _update(carry, idx):
        params, opt_state = carry
        minibatch = jax.tree.map(lambda x: x[idx], batch) if cfg.minibatches > 1 else batch
        minibatch = sharding.shard_batch(minibatch, cfg.mesh)
        if cfg.grad_accum > 1:
            grads, metrics = _accumulated_grads(grad_fn, params, minibatch, cfg)
        else:
            grads, metrics = grad_fn(params, minibatch, cfg)
        updates, opt_state = cfg.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def _epoch(carry, e):
        if cfg.minibatches > 1:
            perm = jax.random.permutation(jax.random.fold_in(key_perm, e), b)
            order = perm.reshape(cfg.minibatches, mb)
        else:
            order = jnp.zeros((1, 1), jnp.int32)  # unused: the full batch is one minibatch
        return jax.lax.scan(_update, carry, order)

    (params, opt_state), metrics = jax.lax.scan(
        _epoch, (state.params, state.opt_state), jnp.arange(cfg.epochs)
    )
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics = {**metrics, **adv_metrics, **rollout_metrics(traj, cfg.rollout.group_size)}
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    lc = cfg.loss
    if lc.kl_ctrl == "adaptive":  # after this batch's rewards used the old beta, as verl
        new_state = new_state.replace(
            kl_coef=regularizers.adaptive_kl_coef(
                state.kl_coef,
                adv_metrics["kl_reward"],
                lc.kl_target,
                adv_metrics["kl_rows"],
                lc.kl_horizon,
            )
        )
    guard = nonfinite_metrics(traj, metrics, new_state)
    return keep_if(guard["nonfinite"] > 0, state, new_state), {**metrics, **guard}


def all_finite(tree) -> jax.Array:
    """bool[]: every floating-point element of `tree` is finite (other leaves are ignored)."""
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def nonfinite_metrics(
    traj: Trajectory, metrics: dict[str, jax.Array], new_state: TrainState
) -> dict[str, jax.Array]:
    """The update's guard against non-finite values, as f32[] metrics.

    `nonfinite_rewards`: episodes with a non-finite turn, outcome or baseline reward (an
    environment's inf/nan); `nonfinite_state`: 1.0 when the updated parameters, optimizer state
    or KL coefficient hold a non-finite value; `nonfinite`: 1.0 when any of these, the loss or
    the gradient norm (`metrics["loss"]`, `metrics["grad_norm"]`) is not finite: the update is
    then rejected (`keep_if`).
    """
    bad_rows = ~jnp.isfinite(traj.outcome_reward) | ~jnp.all(
        jnp.isfinite(traj.turn_rewards), axis=1
    )
    if traj.baseline_reward is not None:
        bad_rows = bad_rows | ~jnp.isfinite(traj.baseline_reward)
    state_ok = all_finite((new_state.params, new_state.opt_state, new_state.kl_coef))
    ok = ~jnp.any(bad_rows) & jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    ok = ok & state_ok
    return {
        "nonfinite": (~ok).astype(jnp.float32),
        "nonfinite_rewards": bad_rows.sum().astype(jnp.float32),
        "nonfinite_state": (~state_ok).astype(jnp.float32),
    }


def keep_if(bad: jax.Array, old: TrainState, new: TrainState) -> TrainState:
    """`old` where the traced bool[] `bad` is set, else `new` (bit for bit: a select)."""
    return jax.tree.map(lambda o, n: jnp.where(bad, o, n), old, new)


def _accumulated_grads(grad_fn, params, minibatch: Batch, cfg: StepConfig):
    """Gradient and metrics of a minibatch over `cfg.grad_accum` equal microbatches, one at a
    time (activation memory is that of one microbatch).

    Each microbatch's loss is aggregated on its own; the k results are summed with the weights
    of `microbatch_weights`, so the gradient is that of the whole minibatch's loss for the
    four aggregation modes, whatever the number of action tokens or empty rows per microbatch
    (verl weights token-mean by the global token count likewise). Exact for the policy,
    entropy, KL and value terms, which share the policy loss's aggregation over action tokens;
    the ECHO term (a mean over observation tokens) gets the same weights, so it is exact only
    when action and observation tokens are spread alike.
    """
    k = cfg.grad_accum
    micro = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), minibatch)
    weights = microbatch_weights(micro.action_mask, cfg.loss.agg)
    # Loss-valued metrics follow the gradient's weights; the others (clip fractions, KL and
    # value means) are means over tokens, so they take the weights normalised to sum to 1
    # (the same unless the mode is "seq-mean-token-sum-norm", whose weights sum to k).
    mean_weights = weights / jnp.sum(weights)

    def body(acc, xs):
        mb, w, w_mean = xs
        grads, metrics = grad_fn(params, sharding.shard_batch(mb, cfg.mesh), cfg)
        metrics = {
            name: value * (w if name in LOSS_METRICS else w_mean) for name, value in metrics.items()
        }
        grads = jax.tree.map(lambda g: w * g, grads)
        return jax.tree.map(jnp.add, acc, (grads, metrics)), None

    zeros = jax.tree.map(
        jnp.zeros_like,
        jax.eval_shape(
            lambda p, b: grad_fn(p, b, cfg), params, jax.tree.map(lambda x: x[0], micro)
        ),
    )
    (grads, metrics), _ = jax.lax.scan(body, zeros, (micro, weights, mean_weights))
    return grads, metrics


# `loss_fn` metrics that are (parts of) the aggregated loss, summed like the gradient when
# microbatches are accumulated.
LOSS_METRICS = ("loss", "pg_loss", "entropy", "kl_ref", "value_loss")


def microbatch_weights(mask: jax.Array, agg: str) -> jax.Array:
    """Weights `w_j` with `sum_j w_j L_j = L` for microbatch losses `L_j` of one minibatch.

    "token-mean": each microbatch's share of the action tokens; "seq-mean-token-sum" and
    "seq-mean-token-mean": its share of the rows with an action token (empty rows leave the
    sequence means); "seq-mean-token-sum-norm": 1 (sums over a constant C add up). Any other
    (user-registered) mode, or a minibatch without action tokens: 1/k.

    Args:
      mask: bool[k, b, T] the microbatches' action masks.
      agg: the loss aggregation mode.

    Returns:
      f32[k] weights.
    """
    chex.assert_rank(mask, 3)
    k = mask.shape[0]
    if agg == "seq-mean-token-sum-norm":
        return jnp.ones((k,), jnp.float32)
    if agg == "token-mean":
        units = mask.sum(axis=(1, 2))
    elif agg in ("seq-mean-token-sum", "seq-mean-token-mean"):
        units = mask.any(axis=2).sum(axis=1)
    else:
        return jnp.full((k,), 1.0 / k, jnp.float32)
    units = units.astype(jnp.float32)
    total = units.sum()
    return jnp.where(total > 0, units / jnp.maximum(total, 1.0), 1.0 / k)


# What `evaluate` reports (per decoding mode, "{mode}_{key}", in `Experiment.eval_fn`).
EVAL_KEYS = ("success", "reward", "turns", "invalid_rate", "truncated")


def evaluate(
    params,
    task_keys: jax.Array,
    key: jax.Array,
    cfg: StepConfig,
    env,
    env_params,
    rollout_cfg: rollout_lib.RolloutConfig,
    greedy: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """Run the policy on fixed tasks and summarise (greedy or sampled per `rollout_cfg`, or
    per the traced bool[] `greedy` when given)."""
    traj = rollout_lib.rollout(
        key,
        cfg.graphdef,
        params,
        env,
        env_params,
        rollout_cfg,
        task_keys=task_keys,
        shard_fn=sharding.batch_constraint(cfg.mesh),
        greedy=greedy,
    )
    m = rollout_metrics(traj, rollout_cfg.group_size)
    return {k: m[k] for k in EVAL_KEYS}
