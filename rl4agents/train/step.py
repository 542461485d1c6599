"""The pure train step: rollout, rewards, advantages and E x M optax updates in one program.

This module holds the step (`train_step`, its learning half `update`, `evaluate`), the
guard against non-finite updates and the static configuration a step closes over
(`StepConfig` and its parts). The pieces live beside it: `objective` (the batch and the loss),
`sampling` (reward shaping, DAPO dynamic sampling, ReMax's greedy baseline), `views` (the rows
the update trains on) and `microbatch` (minibatches and gradient accumulation).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rl4agents import sharding
from rl4agents.losses import regularizers
from rl4agents.models import roles
from rl4agents.rollout import branch as branch_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import microbatch, objective, sampling, views
from rl4agents.train.state import TrainState
from rl4agents.types import Trajectory

# `loss_fn` metrics that are (parts of) the aggregated loss (`objective.LOSS_METRICS`).
LOSS_METRICS = objective.LOSS_METRICS


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The loss's terms and their coefficients (`objective.loss_fn`, `objective.prepare_batch`)."""

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
    # A masking correction of `losses.mismatch` bound to its hyperparameters (config
    # `mismatch.name`), or None: tokens outside its ratio band leave the loss
    mismatch_fn: Callable[..., Any] | None = None
    policy_takes_segments: bool = False  # the policy loss accepts `segment_ids` (turn ids)
    # EPO entropy smoothing: coef * (distance of the batch entropy from the band
    # [epo_low, epo_high] x its running average, an EMA with decay epo_decay held in
    # TrainState.entropy_avg); 0 = off
    epo_coef: float = 0.0
    epo_decay: float = 0.9
    epo_low: float = 0.8
    epo_high: float = 1.2


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
    """Reward shaping applied to the episodes before credit assignment."""

    overlong_buffer: int = 0  # DAPO overlong penalty buffer in tokens (0 = off)
    overlong_factor: float = 1.0
    overlong_per: str = "turn"  # "turn" (max length A) | "episode" (max length K * A)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Batch-level sampling: DAPO dynamic sampling and an episode filter."""

    dynamic: bool = False  # keep only groups whose rewards differ, refilling the batch
    max_gen_batches: int = 4  # rollouts per step at most while refilling
    # An episode filter of `sampling.EPISODE_FILTERS` bound to its hyperparameters
    # (`(traj, group_size) -> bool[B]` kept), or None: every episode trains
    filter_fn: Callable[..., Any] | None = None


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
    # teacher-forced passes (0 = off); see `views.shared_prefix`. Only for episodes in group order
    # whose first `shared_prompt` slots (tokens and validity) are equal within each group, as
    # `rollout` makes them; the passes read each group's first row there. Under `branch`
    # (with `train.share_fork_prefix`) the branch rows instead share their root's prefix
    # (`views.fork_prefix`).
    shared_prompt: int = 0
    # Log `reward_std` and `reward_group_std` (`reward_spread`). Off by default: any op added
    # to the step's program can change how XLA compiles the update, and with it the last bits
    # of the parameters.
    collapse_metrics: bool = False
    # Log `mi/*`, the prompt-swap mutual-information proxy (`prompt_mi_gap`): one more
    # teacher-forced pass over 2B rows per step
    mi_proxy: bool = False
    # Staleness k: the step samples its episodes with the parameters of k updates ago, kept in
    # `TrainState.stale_params` (`sampler_params`, `advance_stale`); 0 = the current ones.
    # The sampler's log-probs stay the behaviour policy of every ratio (PPO, TIS, the
    # corrections of `losses.mismatch`), so asynchronous RL runs as one deterministic program.
    staleness: int = 0
    # Branching rollouts (`rollout.branch`): the step samples with `branch.branch_rollout`,
    # B (1 + M N) episodes whose tree metadata reaches the credit function; None = off (the
    # plain rollout of B episodes).
    branch: branch_lib.BranchConfig | None = None
    # With `branch`: the loss reads the B roots' tokens only and the branches serve the credit
    # function alone (VinePPO's value rollouts: a credit hyperparameter train_on="roots").
    train_roots_only: bool = False

    @functools.cached_property
    def layout(self) -> rollout_lib.Layout:
        """The episodes' slot layout, `rollout.make_layout(env, rollout)`, computed once."""
        return rollout_lib.make_layout(self.env, self.rollout)

    @property
    def num_rows(self) -> int:
        """Episodes per step: B = num_tasks x group_size, or B (1 + M N) when branching."""
        b = self.rollout.batch_size
        return b if self.branch is None else self.branch.num_rows(b, self.layout.turns)


def initial_kl_coef(lc: LossConfig) -> jax.Array | None:
    """`TrainState.kl_coef` of a fresh run: f32[] beta under the adaptive controller, else None."""
    return jnp.asarray(lc.kl_coef, jnp.float32) if lc.kl_ctrl == "adaptive" else None


def initial_entropy_avg(lc: LossConfig) -> jax.Array | None:
    """`TrainState.entropy_avg` of a fresh run: f32[2] zeros (no step seen) under EPO
    (`lc.epo_coef > 0`), else None."""
    return jnp.zeros((2,), jnp.float32) if lc.epo_coef > 0 else None


def initial_stale_params(params, staleness: int) -> tuple | None:
    """`TrainState.stale_params` of a fresh run: `staleness` separate copies of `params` (the
    step donates its state, and a buffer cannot be donated twice), or None for 0."""
    if staleness == 0:
        return None
    return tuple(jax.tree.map(jnp.copy, params) for _ in range(staleness))


def sampler_params(state: TrainState, cfg: StepConfig):
    """The parameters the step samples with: `state.params`, or under `cfg.staleness` = k > 0
    the oldest entry of `state.stale_params`, the parameters before update `step - k` (the
    initial ones while `step < k`)."""
    if cfg.staleness == 0:
        return state.params
    if state.stale_params is None or len(state.stale_params) != cfg.staleness:
        have = None if state.stale_params is None else len(state.stale_params)
        raise ValueError(
            f"train.staleness={cfg.staleness} needs TrainState.stale_params with that many "
            f"parameter copies, got {have}; build the state with "
            "stale_params=step.initial_stale_params(params, staleness)"
        )
    return state.stale_params[0]


def advance_stale(old: TrainState, new: TrainState, cfg: StepConfig) -> TrainState:
    """`new` with the sampler ring moved on by one update: the oldest entry leaves and the
    parameters `old.params` the update started from join at the end. Identity for k = 0."""
    if cfg.staleness == 0:
        return new
    return new.replace(stale_params=(*old.stale_params[1:], old.params))


def rollout_metrics(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
    """Scalar summaries of a batch of episodes (`zero_std_groups`: the share of task groups
    whose rewards are all equal)."""
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


def roots(traj: Trajectory, cfg: StepConfig) -> Trajectory:
    """The B = num_tasks x group_size root episodes of a step's batch: all of it without
    branching, else its first B rows (a branching rollout puts its roots first, in group
    order, then the branches)."""
    if cfg.branch is None:
        return traj
    return jax.tree.map(lambda x: x[: cfg.rollout.batch_size], traj)


def branch_metrics(traj: Trajectory, cfg: StepConfig) -> dict[str, jax.Array]:
    """Scalar summaries of a branching rollout's branch rows (after the B roots).

    Returns:
      f32[] `branch/forks` (fork points per root: the fork slots the rule used),
      `branch/reward` and `branch/success` (means over the branches of used slots; 0 when
      none was used).
    """
    b, n = cfg.rollout.batch_size, cfg.branch.num_branches
    used = traj.fork_turn[b:] < traj.max_turns  # an unused slot's rows have fork turn K
    count = jnp.maximum(used.sum(), 1)
    return {
        "branch/forks": used.sum() / (b * n),
        "branch/reward": jnp.sum(jnp.where(used, traj.outcome_reward[b:], 0.0)) / count,
        "branch/success": jnp.sum(used & traj.success[b:]) / count,
    }


def reward_spread(traj: Trajectory, group_size: int) -> dict[str, jax.Array]:
    """RAGEN-2's reward-spread collapse signals (docs/methods.md, "Collapse metrics"), beside
    `rollout_metrics`' `zero_std_groups` and the loss's `entropy`.

    Returns:
      f32[] `reward_std` (the std of the B outcome rewards) and `reward_group_std` (the mean
      over task groups of the std of the group's rewards); both population stds.
    """
    rewards = traj.outcome_reward.reshape(-1, group_size)
    return {
        "reward_std": jnp.std(traj.outcome_reward),
        "reward_group_std": jnp.mean(jnp.std(rewards, axis=1)),
    }


def prompt_mi_gap(params, traj: Trajectory, cfg: StepConfig) -> dict[str, jax.Array]:
    """A mutual-information proxy between prompts and responses (RAGEN-2's collapse check).

    Each episode's action tokens are scored twice by the policy `params` (teacher-forced,
    full history): under its own prompt, and with the prompt slots (tokens and validity)
    replaced by those of episode `(b + G) mod B`, the same sample of the next task. With
    `lo_b` and `lx_b` the mean log-prob of episode b's action tokens in the two passes,
      `mi/gap = mean_b (lo_b - lx_b)`
    over the episodes with an action token. A policy whose responses no longer depend on the
    prompt (template collapse) has a gap near 0 even at high entropy; a prompt-conditioned
    one a positive gap. The history after the prompt (earlier actions and observations) is
    kept, so the gap measures what the prompt adds beyond it. One pass over 2B rows (the
    action slots alone go through the LM head).

    Returns:
      f32[] `mi/gap`, `mi/logp_own` (mean_b lo_b) and `mi/logp_swapped` (mean_b lx_b).
    """
    view = views.full_view(traj, cfg)
    b, p, g = view.tokens.shape[0], cfg.layout.prompt, cfg.rollout.group_size
    other = (jnp.arange(b) + g) % b
    swap_tokens = view.tokens.at[:, :p].set(view.tokens[other, :p])
    swap_valid = view.valid.at[:, :p].set(view.valid[other, :p])
    tokens = jnp.concatenate([view.tokens, swap_tokens])
    valid = jnp.concatenate([view.valid, swap_valid])
    slots = jnp.broadcast_to(jnp.asarray(view.action_slots), (2 * b, len(view.action_slots)))
    num_roles = cfg.rollout.role_params
    turn_ids = jnp.concatenate([view.turn_ids] * 2) if roles.active(num_roles) else None
    logp = rollout_lib.score_params(
        cfg.graphdef,
        params,
        tokens,
        valid,
        cfg.rollout.temperature,
        slots=slots,
        shard=sharding.batch_constraint(cfg.mesh),
        role_params=num_roles,
        turn_ids=turn_ids,
    ).logp
    mask = view.action_mask
    n = jnp.sum(mask, axis=1).astype(jnp.float32)
    rows = (n > 0).astype(jnp.float32)

    def row_mean(x):
        per_row = jnp.sum(jnp.where(mask, x, 0.0), axis=1) / jnp.maximum(n, 1.0)
        return jnp.sum(per_row * rows) / jnp.maximum(jnp.sum(rows), 1.0)

    own, swapped = row_mean(logp[:b]), row_mean(logp[b:])
    return jax.lax.stop_gradient(
        {"mi/gap": own - swapped, "mi/logp_own": own, "mi/logp_swapped": swapped}
    )


def train_step(
    state: TrainState, key_root: jax.Array, cfg: StepConfig
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL iteration; pure. The step's key is `fold_in(key_root, state.step)`.

    The episodes are sampled with `sampler_params(state, cfg)`: the current parameters, or
    those of `cfg.staleness` updates ago; with `cfg.branch` by `branch.branch_rollout` (B roots
    and their B M N branches, a `credit.tree.TreeTrajectory` that the credit function reads),
    else by `rollout.rollout_rows`.

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
    sampler = sampler_params(state, cfg)
    if cfg.sampling.dynamic:
        traj, ds_metrics = sampling.dynamic_rollout(key_rollout, sampler, cfg, shard_fn)
    elif cfg.branch is not None:
        traj, rows = branch_lib.branch_rollout(
            key_rollout,
            cfg.graphdef,
            sampler,
            cfg.env,
            cfg.env_params,
            cfg.rollout,
            cfg.branch,
            shard_fn=shard_fn,
        )
        traj = sampling.shape_rewards(traj, cfg)
    else:
        traj, rows = rollout_lib.rollout_rows(
            key_rollout,
            cfg.graphdef,
            sampler,
            cfg.env,
            cfg.env_params,
            cfg.rollout,
            shard_fn=shard_fn,
        )
        traj = sampling.shape_rewards(traj, cfg)
    if cfg.needs_greedy:
        traj = sampling.greedy_baseline(key_rollout, sampler, traj, cfg, shard_fn)
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
      traj: `cfg.num_rows` episodes in the slot layout of `cfg.rollout`: B = num_tasks x
        group_size, or with `cfg.branch` the B roots then their branches (`TreeTrajectory`;
        the rollout metrics read the roots, `branch_metrics` the branches).
      key_perm: key for the minibatch permutation.
      cfg: static step configuration.
      rows: the step rows the policy saw under context="window", else None.

    Returns:
      The updated state (step + 1) and a flat dict of f32[] metrics. When a reward, the loss,
      the gradient norm or the updated state is not finite, the returned state is `state`
      itself (step not advanced) and the metrics say so (`nonfinite_metrics`).
    """
    traj = sharding.shard_batch(traj, cfg.mesh)
    sampled = traj  # every episode, for the rollout metrics and the guard
    extra = {}
    if cfg.sampling.filter_fn is not None:
        traj, extra = sampling.filter_episodes(traj, cfg)
    if cfg.collapse_metrics:
        extra = {**extra, **reward_spread(roots(sampled, cfg), cfg.rollout.group_size)}
    if cfg.branch is not None:
        extra = {**extra, **branch_metrics(sampled, cfg)}
    if cfg.mi_proxy:
        extra = {**extra, **prompt_mi_gap(state.params, traj, cfg)}
    batch, adv_metrics = objective.prepare_batch(state, traj, cfg, rows)
    params, opt_state, metrics = microbatch.minibatch_updates(
        state.params, state.opt_state, batch, key_perm, cfg
    )
    metrics = {
        **metrics,
        **adv_metrics,
        **rollout_metrics(roots(sampled, cfg), cfg.rollout.group_size),
        **extra,
    }
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    new_state = advance_stale(state, new_state, cfg)
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
    if lc.epo_coef > 0:  # after this batch's loss read the old average, as the KL controller
        new_state = new_state.replace(
            entropy_avg=regularizers.running_entropy_avg(
                state.entropy_avg, metrics["entropy"], lc.epo_decay
            )
        )
        metrics["epo_entropy_avg"] = new_state.entropy_avg[0]
    guard = nonfinite_metrics(sampled, metrics, new_state)
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
    or controller state (KL coefficient, EPO entropy average) hold a non-finite value;
    `nonfinite`: 1.0 when any of these, the loss or the gradient norm (`metrics["loss"]`,
    `metrics["grad_norm"]`) is not finite: the update is then rejected (`keep_if`).
    """
    bad_rows = ~jnp.isfinite(traj.outcome_reward) | ~jnp.all(
        jnp.isfinite(traj.turn_rewards), axis=1
    )
    if traj.baseline_reward is not None:
        bad_rows = bad_rows | ~jnp.isfinite(traj.baseline_reward)
    state_ok = all_finite(
        (new_state.params, new_state.opt_state, new_state.kl_coef, new_state.entropy_avg)
    )
    ok = ~jnp.any(bad_rows) & jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    ok = ok & state_ok
    return {
        "nonfinite": (~ok).astype(jnp.float32),
        "nonfinite_rewards": bad_rows.sum().astype(jnp.float32),
        "nonfinite_state": (~state_ok).astype(jnp.float32),
    }


def keep_if(bad: jax.Array, old: TrainState, new: TrainState) -> TrainState:
    """`old` where the traced bool[] `bad` is set, else `new`, bit for bit.

    A select per leaf, on a flag that a conditional returns: XLA otherwise copies the cheap
    reduction behind `bad` (an AND over every leaf of the state) into each leaf's select, and
    the program grows with the square of the number of leaves (a 30-layer model with LoRA
    took minutes longer to compile). A conditional's result is computed once.
    """
    bad = jax.lax.cond(bad, lambda: jnp.bool_(True), lambda: jnp.bool_(False))
    return jax.tree.map(lambda o, n: jnp.where(bad, o, n), old, new)


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
    swap_roles: bool = False,
) -> dict[str, jax.Array]:
    """Run the policy on fixed tasks and summarise (greedy or sampled per `rollout_cfg`, or
    per the traced bool[] `greedy` when given).

    `swap_roles` (static): the swapped-roles control of role-specific sets
    (`rollout_cfg.role_params` = R >= 2): role r plays with set (r + 1) mod R
    (`models.roles.swap`; AT-GRPO's "w/ swapped policies", arXiv 2510.11062).
    """
    if swap_roles:
        if not roles.active(rollout_cfg.role_params):
            raise ValueError(
                f"swap_roles=True with role_params={rollout_cfg.role_params}: one shared "
                "parameter set has no roles to swap; allowed: role_params >= 2"
            )
        params = roles.swap(params)
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
