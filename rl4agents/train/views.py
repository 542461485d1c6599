"""Context views: the rows the update trains on, and how they map to the episodes' slots.

Credit is assigned on the episodes (full-history slots, `Trajectory`); the update trains on
`View` rows: the episodes cut to `train_length` slots (context="full", `full_view`) or the
step rows the policy saw (context="window", `window_view`). Also here: which rows share their
prompt in the teacher-forced passes (`shared_prefix`), which prefix a branch row shares with
its root (`fork_prefix`), and the credit of estimators that
bootstrap truncated rows (`tail_credit`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.credit import token as credit_token
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.types import Trajectory

if TYPE_CHECKING:
    from rl4agents.train.step import StepConfig


def shared_prefix(cfg: StepConfig, full_batch: bool) -> tuple[int, int]:
    """(prefix, group) for `rollout.score` on the update's rows: the prompt is shared by each
    run of G rows under context="full" when the rows are the whole batch in group order (every
    pass of `prepare_batch`; the loss's pass with one minibatch and no microbatches) of a
    rollout without branching. Else (0, 1): no sharing."""
    whole = full_batch or (cfg.minibatches == 1 and cfg.grad_accum == 1)
    g = cfg.rollout.group_size
    plain = cfg.branch is None
    if cfg.shared_prompt and g > 1 and cfg.rollout.context == "full" and whole and plain:
        return cfg.shared_prompt, g
    return 0, 1


def fork_prefix(cfg: StepConfig, full_batch: bool) -> policy_lib.ForkPrefix | None:
    """The branching plan for `rollout.score` on the update's rows (`policy.ForkPrefix`), or None.

    Under `cfg.branch`, `cfg.shared_prompt` > 0 and context="full", with the rows the whole
    batch in rollout order (as `shared_prefix`), each branch row shares with its root the slots
    before the earliest turn its fork slot can fork at, a static turn k_m: the slots
    [0, P + k_m (A + O)) (the prompt and k_m turn blocks). k_m is the slot's fixed turn for
    rules "every" (turn m) and "turns" (`turns[m]`); the fork turns of rules "entropy" and
    "arpo" are drawn in the rollout, so their rows share the turns no fork can precede: the
    prompt ("entropy", k = 0) or the prompt and turn 0 ("arpo" forks at turns >= 1), and
    compute the rest as their own (one fork slot of M x N branches in the plan, as when M = 1).
    A fork slot that the rule leaves unused holds the prompt
    only, which its root's prefix starts with (the pass is exact on every valid slot).
    Otherwise None: every row computes every slot (under context="window" too, where a branch's
    step rows before its fork are whole copies of its root's, and for nested forks,
    `levels` > 1, whose rows share prefixes with branches as well as roots).
    """
    bc = cfg.branch
    whole = full_batch or (cfg.minibatches == 1 and cfg.grad_accum == 1)
    if bc is None or not cfg.shared_prompt or cfg.rollout.context != "full" or not whole:
        return None
    if bc.levels > 1:  # a plan reads each row's prefix from a root: one level of branches
        return None
    lay = cfg.layout
    if bc.rule == "every":
        turns = tuple(range(lay.turns))
    elif bc.rule == "turns":
        turns = tuple(bc.turns)
    else:
        turns = (1 if bc.rule == "arpo" else 0,) * bc.max_forks
    prefix = tuple(lay.prompt + k * (lay.action + lay.obs) for k in turns)
    if len(set(prefix)) == 1:  # one pass over a root's M x N contiguous branch rows
        return policy_lib.ForkPrefix(
            cfg.rollout.batch_size, len(prefix) * bc.num_branches, prefix[:1]
        )
    return policy_lib.ForkPrefix(cfg.rollout.batch_size, bc.num_branches, prefix)


def train_length(cfg: StepConfig) -> int:
    """Slots the update needs: everything up to the last action block (the final observation
    block is never trained on by the policy loss, so it is left out of the forward pass),
    or every slot when ECHO trains on observation tokens."""
    lay = cfg.layout
    return lay.length if cfg.loss.echo_coef > 0 else lay.length - lay.obs


class View(NamedTuple):
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


def full_view(traj: Trajectory, cfg: StepConfig) -> View:
    """The B episodes of `traj` cut to `train_length(cfg)` slots (context="full")."""
    t_full, t_train = traj.tokens.shape[1], train_length(cfg)

    def cut(x):
        return x[:, :t_train]

    return View(
        tokens=cut(traj.tokens),
        valid=cut(traj.valid_mask),
        action_mask=cut(traj.action_mask),
        logp_behavior=cut(traj.logp_behavior),
        obs_target=cut(traj.obs_mask & traj.valid_mask & (traj.turn_ids >= 0)),
        turn_ids=cut(traj.turn_ids),
        action_slots=rollout_lib.action_slots(cfg.layout),
        # the cut slots hold no action tokens
        to_slots=lambda x: jnp.pad(x, ((0, 0), (0, t_full - t_train))),
        from_slots=cut,
    )


def window_view(rows: rollout_lib.StepRows, cfg: StepConfig) -> View:
    """The B x K step rows the policy saw under context="window", one row per turn."""
    lay = cfg.layout
    b, k, row_len = rows.tokens.shape

    def flat(x):
        return x.reshape(b * k, row_len)

    turn = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :, None], rows.tokens.shape)
    return View(
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


def tail_credit(
    model, traj: Trajectory, cfg: StepConfig, window: bool, prefix, group, shard, forks=None
):
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
        forks=forks,
    ).values
    out = cfg.credit_fn(padded, values)
    t = traj.tokens.shape[1]
    returns = None if out.returns is None else out.returns[:, :t]
    return out._replace(advantages=out.advantages[:, :t], returns=returns)
