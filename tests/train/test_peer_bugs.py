"""Bug classes found in peer RL frameworks, each pinned by a test that fails if it appears here.

1. A sibling with no trainable token counted in its group's mean or std (OpenRLHF).
2. An unscorable rollout (no valid action, an empty answer) scored as well as an attempt, so
   that doing nothing wins (TRL).
3. Dynamic sampling with a leave-one-out baseline zeroing every advantage (NeMo-RL).
4. A zero-advantage filter dropping a group that still carries KL or ECHO signal (prime-rl).
5. Per-turn-index normalisation over padded turns, biased by variable turn counts (verl).
6. Truncated episodes treated as terminal (`bootstrap_truncated`, here through the train step;
   the estimators' hand-derived values are in `tests/credit/test_critic.py`).
7. A NaN reward hidden by an estimator (e.g. a std of 0 from NaN rewards).

Tiny inputs: hand-built trajectories, and the shared 3x3 FrozenLake experiment of
`test_step_options` for the parts that need the train step.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents import credit
from rl4agents.credit import token as credit_token
from rl4agents.envs import probes
from rl4agents.envs import registry as env_registry
from rl4agents.train import objective as objective_lib
from rl4agents.train import step as step_lib
from rl4agents.train import views as views_lib
from tests.credit.conftest import build_full, episodes_traj, regroup, run_credit
from tests.train.test_step_options import (
    MAX_GEN,
    base_exp,
    base_state,
    build,
    partly_filled_dynamic_batch,
    rollout_fn,
    scaled,
)

NAMES = credit.names()
CRITIC_FREE = [n for n in NAMES if not credit.requires_values(n) and not credit.requires_greedy(n)]


def _values(traj, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=traj.tokens.shape).astype(np.float32))


def _per_episode(traj, adv) -> np.ndarray:
    """f64[B] mean advantage over each episode's action tokens (NaN for none)."""
    adv, mask = np.asarray(adv, np.float64), np.asarray(traj.action_mask)
    return np.array([adv[b][mask[b]].mean() if mask[b].any() else np.nan for b in range(len(adv))])


# --------------------------------------------------------------------------------------------
# 1. Siblings without trainable tokens are in no statistic.


@pytest.mark.parametrize("name", NAMES)
def test_empty_sibling__changes_no_other_advantage(name):
    """Episodes 0 and 6 took no turn (no action token). Moving them to groups of their own,
    or giving them another score, leaves every other advantage as it is: they are in no
    group or batch statistic."""
    traj = regroup(build_full(3, empty=(0, 6)))
    values = _values(traj)
    fn = jax.jit(lambda t, v: credit.get(name)(t, v if credit.requires_values(name) else None))
    base = np.asarray(fn(traj, values).advantages)
    alone = traj.replace(group_ids=traj.group_ids.at[jnp.asarray([0, 6])].set(1000 + 7))
    rescored = traj.replace(outcome_reward=traj.outcome_reward.at[jnp.asarray([0, 6])].set(5.0))
    keep = np.ones(traj.batch_size, bool)
    keep[[0, 6]] = False
    for other in (alone, rescored):
        got = np.asarray(fn(other, values).advantages)
        np.testing.assert_allclose(got[keep], base[keep], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[~keep], 0.0)


# --------------------------------------------------------------------------------------------
# 2. Doing nothing never wins.

STEP_TASKS = 4
MAX_CANDIDATES = 24  # valid actions tried per environment (spread over its action table)


@functools.cache
def _first_turn_rewards(name: str):
    """(reward f32[tasks, C], valid bool[tasks, C]) of one turn from each task's reset state:
    candidate 0 is the empty answer (no token), 1 a junk answer, 2.. valid actions."""
    env, params = env_registry.make(name).make_split("test")
    table, lengths = probes.action_table(env)
    n, width = table.shape
    ids = np.unique(np.linspace(0, n - 1, min(n, MAX_CANDIDATES)).round().astype(int))
    w = width + 1
    pad = env.tokenizer.pad_id
    tokens = np.full((2 + len(ids), w), pad, np.int32)
    tokens[1] = probes.junk_tokens(env, w)
    tokens[2:, :width] = table[ids]
    lens = np.concatenate([[0, w], lengths[ids]]).astype(np.int32)

    def one_task(task_key):
        state, _ = env.reset(task_key, params)

        def one(tok, length):
            _, ts = env.step(jax.random.key(1), state, tok, length, params)
            return ts.reward, ts.valid_action

        return jax.vmap(one)(jnp.asarray(tokens), jnp.asarray(lens))

    keys = jax.random.split(jax.random.key(0), STEP_TASKS)
    return jax.device_get(jax.jit(jax.vmap(one_task))(keys))


@pytest.mark.parametrize("name", env_registry.names())
def test_invalid_action__scores_below_every_valid_action_and_below_the_group_mean(name):
    reward, valid = (np.asarray(x) for x in _first_turn_rewards(name))
    # An empty or junk answer is invalid and charged: strictly below every accepted action
    # (scored 0 like a valid move, doing nothing would tie with an honest miss).
    assert not valid[:, :2].any(), valid
    assert valid[:, 2:].any(axis=1).all(), valid
    worst_valid = np.where(valid, reward, np.inf).min(axis=1)
    assert (reward[:, :2].max(axis=1) < worst_valid).all(), (reward, valid)
    # One-turn group of the first task: [empty, junk, worst valid, best valid]. Under every
    # critic-free estimator, the two invalid episodes get less than the group's mean advantage.
    r = reward[0]
    best_valid = np.where(valid[0], r, -np.inf).max()
    group = [[float(r[0])], [float(r[1])], [float(worst_valid[0])], [float(best_valid)]]
    parsed = [[False], [False], [True], [True]]
    traj = episodes_traj(group, [0] * 4, action_valid=parsed, entropy=[[1.0]] * 4)
    # Four different answers: distinct action tokens (estimators that compare histories, salt,
    # would otherwise see one shared step).
    rows = jnp.arange(4, dtype=traj.tokens.dtype)[:, None] + 1
    traj = traj.replace(tokens=jnp.where(traj.action_mask, rows, traj.tokens))
    for est in CRITIC_FREE:
        adv = _per_episode(traj, run_credit(est, traj).advantages)
        assert (adv[:2] < adv.mean()).all(), (est, group, adv)


# --------------------------------------------------------------------------------------------
# 3. Dynamic sampling + RLOO.


def test_dynamic_sampling_with_rloo__kept_groups_keep_leave_one_out_advantages():
    """DAPO keeps groups whose rewards differ; RLOO's baseline over such a group is the other
    samples' mean, so no kept group's advantages all vanish (and empty slots get 0)."""
    traj, filled = partly_filled_dynamic_batch()
    cfg = base_exp().step_cfg
    cfg = dataclasses.replace(
        cfg,
        credit_fn=functools.partial(credit.get("rloo")),
        sampling=step_lib.SamplingConfig(dynamic=True, max_gen_batches=MAX_GEN),
    )
    batch, _ = jax.jit(lambda s, t: objective_lib.prepare_batch(s, t, cfg))(base_state(), traj)
    g = cfg.rollout.group_size
    adv = _per_episode(traj, _on_slots(batch.advantages, traj))
    scores = np.asarray(traj.outcome_reward, np.float64)
    for j in range(filled):
        s = scores[j * g : (j + 1) * g]
        want = s - (s.sum() - s) / (g - 1)
        np.testing.assert_allclose(adv[j * g : (j + 1) * g], want, rtol=1e-5, atol=1e-6)
        assert np.abs(want).max() > 0, s
    np.testing.assert_array_equal(np.asarray(batch.advantages)[filled * g :], 0.0)


def _on_slots(batch_values, traj):
    """Batch values (the update's `train_length` slots) back on the trajectory's T slots."""
    t = traj.tokens.shape[1]
    x = np.asarray(batch_values)
    return np.pad(x, ((0, 0), (0, t - x.shape[1])))


# --------------------------------------------------------------------------------------------
# 4. A group whose advantages are all 0 still trains its KL and ECHO terms.


@functools.cache
def _tied_batch():
    """(cfg with KL and ECHO, state whose policy differs from its reference, batch of a
    rollout whose every reward is 0: every group tied, every advantage 0)."""
    exp = build(**{"loss.kl_coef": 0.05, "loss.echo_coef": 0.5, "loss.entropy_coef": 0.0})
    state = exp.init_state(jax.random.key(0))
    state = state.replace(params=scaled(state.params, 3.0))
    traj = rollout_fn()(jax.random.key(5), state.params)
    traj = traj.replace(
        turn_rewards=jnp.zeros_like(traj.turn_rewards),
        outcome_reward=jnp.zeros_like(traj.outcome_reward),
    )
    cfg = exp.step_cfg
    batch, _ = jax.jit(lambda s, t: objective_lib.prepare_batch(s, t, cfg))(state, traj)
    return cfg, state, traj, batch


def test_zero_advantage_groups__still_train_their_kl_and_echo_terms():
    cfg, state, traj, batch = _tied_batch()
    np.testing.assert_array_equal(np.asarray(batch.advantages), 0.0)
    # Every row is still in the batch, with its action and observation tokens.
    t = batch.tokens.shape[1]
    np.testing.assert_array_equal(batch.action_mask, np.asarray(traj.action_mask)[:, :t])
    assert np.asarray(batch.obs_target).any(axis=1).all()

    def grads(lc):
        c = dataclasses.replace(cfg, loss=lc)
        grad_fn = jax.grad(objective_lib.loss_fn, has_aux=True)
        g, m = jax.jit(lambda p, b: grad_fn(p, b, c))(state.params, batch)
        return float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(g)))), m

    norm, metrics = grads(cfg.loss)
    assert float(metrics["kl_ref"]) > 0 and float(metrics["echo_ce"]) > 0, metrics
    assert norm > 1e-6
    # The policy term alone gives nothing here: the gradient above is the KL and ECHO signal.
    none, _ = grads(dataclasses.replace(cfg.loss, kl_coef=0.0, echo_coef=0.0))
    assert none == 0.0


# --------------------------------------------------------------------------------------------
# 5. Per-turn-index statistics ignore turns that did not happen.

# One group of three episodes with 2, 1 and 3 turns; turn rewards A [1, 2], B [3], C [0, 4, 5].
VARIABLE_TURNS = [[1.0, 2.0], [3.0], [0.0, 4.0, 5.0]]


def test_turn_return_group_norm__padded_turns_are_in_no_statistic():
    # Returns (gamma 1): A [3, 2], B [3], C [9, 9, 5]. Index 0: {3, 3, 9}: mean 5, std sqrt(12);
    # index 1: {2, 9} (B ended: no padded 0): mean 5.5, std 3.5 sqrt(2); index 2: {5}: 0.
    traj = episodes_traj(VARIABLE_TURNS, [0, 0, 0])
    adv = np.asarray(run_credit("turn_return", traj, norm="group").advantages)
    s0, s1 = math.sqrt(12.0) + 1e-6, 3.5 * math.sqrt(2.0) + 1e-6
    slots = [[1, 2], [4, 5], [7, 8]]  # action slots of turns 0, 1, 2
    want = {(0, 0): -2 / s0, (0, 1): -3.5 / s1, (1, 0): -2 / s0, (2, 0): 4 / s0}
    want.update({(2, 1): 3.5 / s1, (2, 2): 0.0})
    for (b, k), v in want.items():
        np.testing.assert_allclose(adv[b, slots[k]], v, rtol=1e-5, atol=1e-6)


def test_mt_grpo__padded_turns_are_in_no_statistic():
    # R^O = the last turn's reward: A 2, B 3, C 5 -> mean 10/3, std sqrt(7/3).
    # Turn terms (not the last turn): index 0 {A: 1, C: 0} -> +-1/sqrt(2) (std sqrt(1/2));
    # index 1 {C: 4} alone -> 0 (B's and A's index 1 are no padded zeros among them).
    traj = episodes_traj(VARIABLE_TURNS, [0, 0, 0])
    adv = np.asarray(run_credit("mt_grpo", traj).advantages)
    so, st = math.sqrt(7 / 3) + 1e-4, math.sqrt(0.5) + 1e-4
    a_out = {0: (2 - 10 / 3) / so, 1: (3 - 10 / 3) / so, 2: (5 - 10 / 3) / so}
    slots = [[1, 2], [4, 5], [7, 8]]
    want = {
        (0, 0): a_out[0] + 0.5 / st,
        (0, 1): a_out[0],
        (1, 0): a_out[1],
        (2, 0): a_out[2] - 0.5 / st,
        (2, 1): a_out[2],
        (2, 2): a_out[2],
    }
    for (b, k), v in want.items():
        np.testing.assert_allclose(adv[b, slots[k]], v, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# 6. Truncated episodes bootstrapped from the value after the final observation.


@functools.cache
def _critic_setup():
    exp = build(**{"credit.name": "ppo_gae", "model.value_head": "shared"})
    state = exp.init_state(jax.random.key(0))
    # The value head starts at zero: perturb every parameter so that values are not 0.
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [
        x + 0.3 * jax.random.normal(k, x.shape, x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating)
        else x
        for x, k in zip(leaves, keys)
    ]
    state = state.replace(params=jax.tree.unflatten(tree, leaves))
    traj = rollout_fn()(jax.random.key(7), base_state().params)
    return exp, state, traj


def test_bootstrap_truncated__the_step_reads_the_value_after_the_final_observation():
    """ppo_gae with gamma = lam = 1, no whitening: bootstrapping adds the tail value to every
    action token's advantage of a truncated row. The tail is the value head's output at the
    row's last valid token, computed here by a direct forward pass."""
    exp, state, traj = _critic_setup()
    assert bool(np.asarray(traj.truncated).any())
    hp = credit.validate("ppo_gae", {"whiten": False})
    cfg_off = dataclasses.replace(
        exp.step_cfg, credit_fn=functools.partial(credit.get("ppo_gae"), **hp)
    )
    cfg_on = dataclasses.replace(
        cfg_off,
        credit_fn=functools.partial(credit.get("ppo_gae"), **{**hp, "bootstrap_truncated": True}),
    )
    off, _ = jax.jit(lambda s, t: objective_lib.prepare_batch(s, t, cfg_off))(state, traj)
    on, metrics = jax.jit(lambda s, t: objective_lib.prepare_batch(s, t, cfg_on))(state, traj)
    model = nnx.merge(exp.step_cfg.graphdef, state.params)
    valid = traj.valid_mask
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    mask = valid[:, None, :] & jnp.tril(jnp.ones((valid.shape[1],) * 2, bool))[None]
    head = np.asarray(model(traj.tokens, positions, mask, with_values=True).values)
    last = np.asarray(valid).shape[1] - 1 - np.argmax(np.asarray(valid)[:, ::-1], axis=1)
    truncated = np.asarray(traj.truncated) & ~np.asarray(traj.done)
    tail = np.where(truncated, head[np.arange(len(last)), last], 0.0)
    assert np.abs(tail[truncated]).min() > 1e-3, tail
    m = np.asarray(on.action_mask)
    diff = np.asarray(on.advantages) - np.asarray(off.advantages)
    np.testing.assert_allclose(diff, tail[:, None] * m, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(on.returns) - np.asarray(off.returns), tail[:, None] * m, rtol=1e-4, atol=1e-5
    )
    assert float(metrics["frac_bootstrapped"]) == truncated.mean()


def test_bootstrap_truncated__window_context_is_refused():
    exp, state, traj = _critic_setup()
    hp = credit.validate("ppo_gae", {"bootstrap_truncated": True})
    cfg = dataclasses.replace(
        exp.step_cfg, credit_fn=functools.partial(credit.get("ppo_gae"), **hp)
    )
    assert credit_token.bootstraps_truncated(cfg.credit_fn)
    with pytest.raises(ValueError, match=r"bootstrap_truncated=True needs rollout.context='full'"):
        views_lib.tail_credit(None, traj, cfg, True, 0, 1, None)


# --------------------------------------------------------------------------------------------
# 7. A NaN reward reaches the advantages (the train step's guard then rejects the update).


@pytest.mark.parametrize("name", NAMES)
def test_nan_reward__yields_nan_advantages(name):
    """Episode 1 (in a group of four) gets a NaN reward on its first turn and as its outcome:
    no estimator turns it into a finite advantage (no std of 0, no select hides it). Not
    pinned: a group of one under `singleton_policy="zero"` (or a step group of one) gets 0 by
    a select whatever its score; the train step's guard reads the rewards themselves."""
    traj = regroup(build_full(4))
    assert int(np.sum(np.asarray(traj.group_ids) == int(traj.group_ids[1]))) > 1
    nan = traj.replace(
        turn_rewards=traj.turn_rewards.at[1, 0].set(jnp.nan),
        outcome_reward=traj.outcome_reward.at[1].set(jnp.nan),
    )
    values = _values(traj)
    out = credit.get(name)(nan, values if credit.requires_values(name) else None)
    adv = np.asarray(out.advantages)
    mask = np.asarray(traj.action_mask)
    assert np.isnan(adv[1][mask[1]]).any(), adv[1]
