"""Train-step options: overlong shaping, dynamic sampling, ReMax, ECHO, TIS, KL in the reward,
their config checks, and one step of every registered credit function.

Every jitted program costs seconds to compile, so the tests share one tiny experiment (3x3
compact FrozenLake, a one-layer model, 4 tasks x 2 samples, 3 turns of one action token) built
on a one-device mesh, one jitted rollout per rollout config, and derive option variants of its
`StepConfig` with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from rl4agents import credit, sharding
from rl4agents.credit import tree as credit_tree
from rl4agents.losses import aggregate as agg_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import microbatch as microbatch_lib
from rl4agents.train import objective as objective_lib
from rl4agents.train import sampling as sampling_lib
from rl4agents.train import step as step_lib
from rl4agents.train import views as views_lib
from rl4agents.types import Trajectory

# --------------------------------------------------------------------------------------------
# Shared tiny experiment.


def tiny_config(**overrides):
    """A locked base config small enough to compile fast; `overrides` as {"section.field": v}."""
    c = base.get_config()
    c.unlock()
    c.env.name = "frozen_lake"
    c.env.vocab = "minimal"
    c.env.frozen_lake.size = 3
    c.env.frozen_lake.compact = True
    c.model.d_model = 16
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 8
    c.model.d_ff = 32
    c.rollout.num_tasks = 4
    c.rollout.group_size = 2
    c.rollout.max_turns = 3
    c.rollout.max_action_len = 1
    c.loss.entropy_coef = 0.01
    c.log.progress = False
    for key, value in overrides.items():
        *path, field = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[field] = value
    c.lock()
    return c


@functools.cache
def one_device_mesh():
    """A (1, 1, 1) mesh on the first device: no batch divisibility constraint, fast compiles."""
    return sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])


def build(**overrides) -> experiment.Experiment:
    """`experiment.build` of `tiny_config(**overrides)` on the one-device mesh."""
    return experiment.build(tiny_config(**overrides), mesh=one_device_mesh())


@functools.cache
def base_exp() -> experiment.Experiment:
    """The shared experiment (grpo, no KL, no options); its env and graphdef are reused."""
    return build()


def base_state():
    """A fresh initial state of the shared experiment (seed 0)."""
    return base_exp().init_state(jax.random.key(0))


def variant(**loss_fields) -> step_lib.StepConfig:
    """The shared step config with `LossConfig` fields replaced."""
    cfg = base_exp().step_cfg
    return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, **loss_fields))


@functools.cache
def rollout_fn(rc: rollout_lib.RolloutConfig | None = None):
    """jit `(key, params, task_keys) -> Trajectory` with the shared env and graphdef."""
    cfg = base_exp().step_cfg
    rc = rc or cfg.rollout

    def run(key, params, task_keys=None):
        return rollout_lib.rollout(
            key, cfg.graphdef, params, cfg.env, cfg.env_params, rc, task_keys=task_keys
        )

    return jax.jit(run)


def prepare_fn(cfg: step_lib.StepConfig):
    """jit `(state, traj) -> (Batch, adv metrics)` for `cfg`."""
    return jax.jit(lambda state, traj: objective_lib.prepare_batch(state, traj, cfg))


def loss_fn(cfg: step_lib.StepConfig):
    """jit `(params, batch) -> (loss, metrics)` for `cfg`."""
    return jax.jit(lambda params, batch: objective_lib.loss_fn(params, batch, cfg))


@jax.jit
def score_logp(params, tokens, valid_mask):
    """Teacher-forced log-probs of `tokens` under `params` (shared graphdef, temperature 1)."""
    model = nnx.merge(base_exp().step_cfg.graphdef, params)
    return rollout_lib.score(model, tokens, valid_mask).logp


def scaled(params, factor: float):
    """`params` with every float leaf times `factor` (a sharper policy than at init)."""
    return jax.tree.map(
        lambda x: x * factor if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )


def step_rollout_key(exp: experiment.Experiment, step: int = 0) -> jax.Array:
    """The rollout key `train_step` uses at `step` (see `step_lib.train_step`)."""
    return jax.random.split(jax.random.fold_in(exp.root_key(), step))[0]


def assert_finite(metrics):
    """Every metric is a finite scalar."""
    for key, value in jax.device_get(metrics).items():
        assert np.ndim(value) == 0 and np.isfinite(value), (key, value)


# --------------------------------------------------------------------------------------------
# 1. Overlong shaping on hand-built episodes.

A, K = 4, 3  # action slots per turn, turns (hand-built trajectories)


def hand_traj(lengths, rewards) -> Trajectory:
    """Episodes in the slot layout: 1 prompt slot, then K x (A action + 1 obs) slots.

    Episode b takes `len(lengths[b])` turns; turn k uses the first `lengths[b][k]` action slots
    and its obs slot, and earns `rewards[b][k]`. `outcome_reward` is a deliberately wrong
    placeholder (-99), so a test sees that shaping recomputes it.
    """
    batch, slots = len(lengths), 1 + K * (A + 1)
    valid = np.zeros((batch, slots), bool)
    action = np.zeros((batch, slots), bool)
    obs = np.zeros((batch, slots), bool)
    turn_ids = -np.ones((batch, slots), np.int32)
    turn_end = -np.ones((batch, K), np.int32)
    turn_valid = np.zeros((batch, K), bool)
    turn_rewards = np.zeros((batch, K), np.float32)
    valid[:, 0] = obs[:, 0] = True
    for b, (lens, rs) in enumerate(zip(lengths, rewards, strict=True)):
        for k, (n, r) in enumerate(zip(lens, rs, strict=True)):
            start = 1 + k * (A + 1)
            valid[b, start : start + n] = action[b, start : start + n] = True
            valid[b, start + A] = obs[b, start + A] = True
            turn_ids[b, start : start + n] = turn_ids[b, start + A] = k
            turn_end[b, k] = start + n - 1
            turn_valid[b, k] = True
            turn_rewards[b, k] = r
    num_turns = turn_valid.sum(1).astype(np.int32)
    return Trajectory(
        tokens=jnp.asarray(np.where(valid, 5, 0), jnp.int32),
        valid_mask=jnp.asarray(valid),
        action_mask=jnp.asarray(action),
        obs_mask=jnp.asarray(obs),
        turn_ids=jnp.asarray(turn_ids),
        turn_end=jnp.asarray(turn_end),
        logp_behavior=jnp.asarray(np.where(action, -1.0, 0.0), jnp.float32),
        turn_rewards=jnp.asarray(turn_rewards),
        turn_valid=jnp.asarray(turn_valid),
        turn_action_valid=jnp.asarray(turn_valid),
        anchors=jnp.zeros((batch, K), jnp.uint32),
        outcome_reward=jnp.full((batch,), -99.0, jnp.float32),
        success=jnp.zeros((batch,), bool),
        done=jnp.asarray(num_turns < K),
        truncated=jnp.asarray(num_turns == K),
        group_ids=jnp.arange(batch, dtype=jnp.int32),
        num_turns=jnp.asarray(num_turns),
    )


def shaping_cfg(**shaping):
    """The two attributes `shape_rewards` reads: shaping and the slot layout."""
    env = types.SimpleNamespace(max_prompt_len=0, max_obs_len=1, max_action_len=1)
    rc = rollout_lib.RolloutConfig(num_tasks=1, group_size=1, max_turns=K, max_action_len=A)
    return types.SimpleNamespace(
        shaping=step_lib.ShapingConfig(**shaping), layout=rollout_lib.make_layout(env, rc)
    )


LENGTHS = [[1, 3, 4], [4], [], [4, 4]]
REWARDS = [[0.1, 0.2, 0.3], [0.1], [], [0.0, 1.0]]


def test_shape_rewards__per_turn_penalises_each_long_turn():
    # limit A = 4, buffer 2, factor 0.5: pen(L) = min(-(L - 2) / 2 * 0.5, 0)
    #   = 0, 0, -0.25, -0.5 for L = 1..4.
    cfg = shaping_cfg(overlong_buffer=2, overlong_factor=0.5, overlong_per="turn")
    out = sampling_lib.shape_rewards(hand_traj(LENGTHS, REWARDS), cfg)
    expected = [[0.1, -0.05, -0.2], [-0.4, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.5, 0.5, 0.0]]
    np.testing.assert_allclose(out.turn_rewards, expected, atol=1e-6)
    np.testing.assert_allclose(out.outcome_reward, [-0.15, -0.4, 0.0, 0.0], atol=1e-6)


def test_shape_rewards__per_episode_penalises_the_last_turn():
    # limit K * A = 12, buffer 6, factor 1: pen(total) = min(-(total - 6) / 6, 0) on the last
    # turn taken. Totals 8, 4, 0, 8 -> -1/3, 0, 0, -1/3.
    cfg = shaping_cfg(overlong_buffer=6, overlong_factor=1.0, overlong_per="episode")
    out = sampling_lib.shape_rewards(hand_traj(LENGTHS, REWARDS), cfg)
    third = 1.0 / 3.0
    expected = [[0.1, 0.2, 0.3 - third], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0 - third, 0.0]]
    np.testing.assert_allclose(out.turn_rewards, expected, atol=1e-6)
    np.testing.assert_allclose(out.outcome_reward, np.sum(expected, axis=1), atol=1e-6)


def test_shape_rewards__buffer_zero_is_identity():
    traj = hand_traj(LENGTHS, REWARDS)
    for per in ("turn", "episode"):
        cfg = shaping_cfg(overlong_buffer=0, overlong_per=per)
        assert sampling_lib.shape_rewards(traj, cfg) is traj


# --------------------------------------------------------------------------------------------
# 2. Dynamic sampling.


def test_informative_groups__marks_groups_whose_rewards_differ():
    traj = hand_traj([[1]] * 8, [[0.0]] * 8).replace(
        outcome_reward=jnp.asarray([1.0, 1.0, 0.0, 1.0, -0.5, -0.5, 0.0, 0.0])
    )
    informative = sampling_lib.informative_groups
    np.testing.assert_array_equal(informative(traj, 2), [False, True, False, False])
    np.testing.assert_array_equal(informative(traj, 4), [True, True])
    # A group of one sample never differs from itself.
    assert not np.asarray(sampling_lib.informative_groups(traj, 1)).any()


def _expected_dynamic(batches, n, g, max_gen):
    """Reference DAPO fill in NumPy: the informative groups of `batches` in order.

    Returns (list of (batch index, group index) per filled slot, batches used, informative
    groups seen).
    """
    picked, used, seen = [], 0, 0
    while len(picked) < n and used < max_gen:
        rewards = np.asarray(batches[used].outcome_reward).reshape(-1, g)
        ok = ~np.all(rewards == rewards[:, :1], axis=1)
        picked += [(used, j) for j in np.flatnonzero(ok)]
        seen += int(ok.sum())
        used += 1
    return picked[:n], used, seen


MAX_GEN = 2  # sampling.max_gen_batches in the dynamic-sampling tests


@functools.cache
def dynamic_fn():
    """jit `(key, params) -> (Trajectory, metrics)` of `dynamic_rollout`, max 2 batches."""
    sampling = step_lib.SamplingConfig(dynamic=True, max_gen_batches=MAX_GEN)
    cfg = dataclasses.replace(base_exp().step_cfg, sampling=sampling)
    return jax.jit(lambda key, params: sampling_lib.dynamic_rollout(key, params, cfg, None))


def test_dynamic_rollout__fills_groups_in_order_and_leaves_empty_slots():
    rc, max_gen = base_exp().step_cfg.rollout, MAX_GEN
    n, g = rc.num_tasks, rc.group_size
    # Sharper than at init, so that both samples of a task often agree (uninformative groups).
    params = scaled(base_state().params, 4.0)
    dyn, roll = dynamic_fn(), rollout_fn()
    outcomes = set()
    for seed in range(16):
        key = jax.random.key(100 + seed)
        traj, metrics = jax.device_get(dyn(key, params))
        batches = [jax.device_get(roll(jax.random.fold_in(key, i), params)) for i in (0, 1)]
        picked, used, seen = _expected_dynamic(batches, n, g, max_gen)
        filled = len(picked)
        outcomes.add((used, filled == n))
        np.testing.assert_array_equal(traj.group_ids, np.arange(n * g) // g)
        assert metrics["ds/gen_batches"] == used <= max_gen
        assert 0.0 <= metrics["ds/filled_frac"] <= 1.0
        np.testing.assert_allclose(metrics["ds/filled_frac"], filled / n)
        np.testing.assert_allclose(metrics["ds/informative_frac"], seen / (used * n))
        all_rewards = np.concatenate([b.outcome_reward for b in batches[:used]])
        np.testing.assert_allclose(metrics["reward_all"], all_rewards.mean(), rtol=1e-5)
        rewards = traj.outcome_reward.reshape(n, g)
        for slot in range(n):
            rows = slice(slot * g, (slot + 1) * g)
            if slot < filled:  # the picked group, verbatim
                assert np.unique(rewards[slot]).size > 1
                src, j = picked[slot]
                src_rows = slice(j * g, (j + 1) * g)
                for field in ("tokens", "action_mask", "valid_mask", "turn_rewards"):
                    np.testing.assert_array_equal(
                        getattr(traj, field)[rows], getattr(batches[src], field)[src_rows]
                    )
                np.testing.assert_allclose(
                    traj.logp_behavior[rows], batches[src].logp_behavior[src_rows], atol=1e-5
                )
            else:  # an empty episode: nothing to train on
                assert not traj.action_mask[rows].any() and not traj.valid_mask[rows].any()
                assert (traj.turn_end[rows] == -1).all() and (traj.num_turns[rows] == 0).all()
                assert (rewards[slot] == 0).all()
    # The seeds cover a refill from a second batch and a batch left partly empty.
    assert {(1, True), (2, True), (2, False)} <= outcomes, outcomes


@functools.cache
def partly_filled_dynamic_batch():
    """(Trajectory, number of filled groups) of a dynamic rollout that left slots empty."""
    params = scaled(base_state().params, 4.0)
    n = base_exp().step_cfg.rollout.num_tasks
    for seed in range(100, 116):
        traj, metrics = jax.device_get(dynamic_fn()(jax.random.key(seed), params))
        filled = round(float(metrics["ds/filled_frac"]) * n)
        if 0 < filled < n:
            return traj, filled
    raise AssertionError("no seed left the batch partly filled")


def rows(tree, stop: int):
    """The first `stop` episodes of every per-episode leaf of a Trajectory."""
    return jax.tree.map(lambda x: x[:stop], tree)


@pytest.mark.parametrize("name", [n for n in credit.names() if not credit.requires_greedy(n)])
def test_dynamic_rollout__empty_slots_change_no_advantage(name):
    """Credit on a partly filled batch: 0 on the empty episodes, and on the filled ones the
    same advantages as on the filled groups alone."""
    traj, filled = partly_filled_dynamic_batch()
    g = base_exp().step_cfg.rollout.group_size
    keep = filled * g
    fn = jax.jit(functools.partial(credit.get(name), **credit.defaults(name)))
    values = None
    if credit.requires_values(name):
        values = np.asarray(jax.random.normal(jax.random.key(0), traj.tokens.shape), np.float32)
    out = jax.device_get(fn(traj, values))
    alone = jax.device_get(fn(rows(traj, keep), None if values is None else values[:keep]))
    adv = np.asarray(out.advantages)
    assert np.isfinite(adv).all()
    np.testing.assert_array_equal(adv[keep:], 0.0)
    np.testing.assert_allclose(adv[:keep], alone.advantages, rtol=1e-5, atol=1e-6)
    if out.returns is not None:
        np.testing.assert_allclose(out.returns[:keep], alone.returns, rtol=1e-5, atol=1e-6)


def test_train_step__dynamic_sampling_runs_and_is_finite():
    exp = build(**{"sampling.dynamic": True, "sampling.max_gen_batches": MAX_GEN})
    assert exp.step_cfg.sampling == step_lib.SamplingConfig(True, MAX_GEN)
    state = exp.init_state(jax.random.key(0))
    params = jax.tree.map(jnp.copy, state.params)  # the step donates its state
    state, metrics = exp.train_step(state, exp.root_key())
    assert int(state.step) == 1
    assert_finite(metrics)
    m = jax.device_get(metrics)
    assert 1 <= m["ds/gen_batches"] <= MAX_GEN and 0.0 <= m["ds/filled_frac"] <= 1.0
    # The step trained on `dynamic_rollout` of its rollout key.
    traj, ref = jax.device_get(dynamic_fn()(step_rollout_key(exp), params))
    for key in ("ds/gen_batches", "ds/filled_frac", "ds/informative_frac", "reward_all"):
        np.testing.assert_allclose(m[key], ref[key], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(m["reward"], traj.outcome_reward.mean(), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------
# 3. ReMax: the greedy baseline.


def test_greedy_baseline__is_the_greedy_score_of_each_episodes_task():
    cfg = dataclasses.replace(base_exp().step_cfg, needs_greedy=True)
    n, g = cfg.rollout.num_tasks, cfg.rollout.group_size
    greedy_rc = dataclasses.replace(cfg.rollout, group_size=1, greedy=True)
    baseline = jax.jit(
        lambda key, params, traj: sampling_lib.greedy_baseline(key, params, traj, cfg, None)
    )
    params = scaled(base_state().params, 4.0)
    distinct = set()
    for seed in range(3):
        key = jax.random.key(seed)
        traj = rollout_fn()(key, params)
        out = jax.device_get(baseline(key, params, traj))
        # A separate greedy rollout (another key) on the same task keys.
        task_keys = rollout_lib.default_task_keys(key, n)
        greedy = jax.device_get(rollout_fn(greedy_rc)(jax.random.key(99), params, task_keys))
        ids = np.arange(n * g) // g
        np.testing.assert_array_equal(out.baseline_reward, greedy.outcome_reward[ids])
        # Same tasks: the sampled episodes start from the greedy episodes' prompts.
        p = rollout_lib.make_layout(cfg.env, cfg.rollout).prompt
        np.testing.assert_array_equal(np.asarray(traj.tokens)[:, :p], greedy.tokens[ids, :p])
        distinct.update(np.round(greedy.outcome_reward, 4).tolist())
    assert len(distinct) > 1, distinct  # the baseline depends on the task


def test_train_step__remax_baseline_is_the_greedy_score_of_the_steps_tasks():
    exp = build(**{"credit.name": "remax"})
    assert exp.step_cfg.needs_greedy
    n = exp.step_cfg.rollout.num_tasks
    state = exp.init_state(jax.random.key(0))
    params = scaled(state.params, 4.0)  # greedy episodes that differ between tasks
    state = state.replace(params=jax.tree.map(jnp.copy, params))  # the step donates its state
    _, metrics = exp.train_step(state, exp.root_key())
    assert_finite(metrics)
    greedy_rc = dataclasses.replace(exp.step_cfg.rollout, group_size=1, greedy=True)
    task_keys = rollout_lib.default_task_keys(step_rollout_key(exp), n)
    greedy = rollout_fn(greedy_rc)(jax.random.key(7), params, task_keys).outcome_reward
    assert np.unique(np.round(greedy, 4)).size > 1, greedy
    np.testing.assert_allclose(metrics["baseline_mean"], greedy.mean(), rtol=1e-6)


# --------------------------------------------------------------------------------------------
# 4. ECHO.


@functools.cache
def echo_batches():
    """(trajectory, ECHO batch with coef 0.5, no-ECHO batch, state) on one shared rollout."""
    state = base_state()
    traj = rollout_fn()(jax.random.key(3), state.params)
    on, _ = prepare_fn(variant(echo_coef=0.5))(state, traj)
    off, _ = prepare_fn(variant())(state, traj)
    return jax.device_get(traj), on, off, state


def test_echo__train_length_is_the_full_trajectory():
    cfg = base_exp().step_cfg
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    assert views_lib.train_length(variant(echo_coef=0.5)) == lay.length
    assert views_lib.train_length(cfg) == lay.length - lay.obs
    traj, on, off, _ = echo_batches()
    assert traj.tokens.shape[1] == lay.length
    assert on.tokens.shape[1] == lay.length and off.tokens.shape[1] == lay.length - lay.obs


def test_echo__targets_are_exactly_the_observations_after_actions():
    cfg = base_exp().step_cfg
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    traj, on, _, _ = echo_batches()
    target = np.asarray(on.obs_target)
    slot = np.arange(lay.length)
    in_obs_block = (slot >= lay.prompt) & (
        (slot - lay.prompt) % (lay.action + lay.obs) >= lay.action
    )
    expected = np.asarray(traj.valid_mask) & in_obs_block[None, :]
    np.testing.assert_array_equal(target, expected)
    assert not target[:, : lay.prompt].any()
    assert not (target & np.asarray(traj.action_mask)).any()
    assert not (target & ~np.asarray(traj.valid_mask)).any()
    # Per turn: the grid (9 cells + end-of-observation) plus "invalid" after an unparsed action.
    env = cfg.env
    per_turn = np.zeros(traj.turn_valid.shape, int)
    for k in range(lay.turns):
        start = lay.prompt + k * (lay.action + lay.obs) + lay.action
        per_turn[:, k] = target[:, start : start + lay.obs].sum(axis=1)
    grid = env.max_prompt_len
    expected_counts = np.where(traj.turn_valid, grid + ~np.asarray(traj.turn_action_valid), 0)
    np.testing.assert_array_equal(per_turn, expected_counts)
    assert grid == 10 and target.sum() > 0


def test_echo__loss_adds_coef_times_observation_cross_entropy():
    traj, on, off, state = echo_batches()
    cfg_on, cfg_zero = variant(echo_coef=0.5), variant(echo_coef=0.0)
    loss_on, m_on = loss_fn(cfg_on)(state.params, on)
    loss_zero, m_zero = loss_fn(cfg_zero)(state.params, on)
    loss_off, m_off = loss_fn(cfg_zero)(state.params, off)
    # echo_coef 0: the full-length batch gives the no-ECHO (trimmed) loss, no echo metric.
    assert "echo_ce" not in m_zero and "echo_ce" not in m_off
    np.testing.assert_allclose(loss_zero, loss_off, rtol=1e-5, atol=1e-7)
    # echo on: + 0.5 * mean NLL of the target tokens under the policy.
    logp = score_logp(state.params, on.tokens, on.valid_mask)
    target = np.asarray(on.obs_target)
    nll = -np.asarray(logp)[target].mean()
    np.testing.assert_allclose(m_on["echo_ce"], nll, rtol=1e-5)
    np.testing.assert_allclose(loss_on - loss_zero, 0.5 * m_on["echo_ce"], rtol=1e-5, atol=1e-6)
    assert m_on["echo_ce"] > 0.1


# --------------------------------------------------------------------------------------------
# 5. Truncated importance sampling.


def test_tis__weights_are_one_when_sampler_and_learner_agree():
    state = base_state()
    traj = rollout_fn()(jax.random.key(4), state.params)
    batch, _ = jax.device_get(prepare_fn(variant(tis_cap=2.0))(state, traj))
    mask = np.asarray(batch.action_mask)
    assert mask.any()
    np.testing.assert_allclose(batch.weights[mask], 1.0, atol=1e-5)
    np.testing.assert_array_equal(batch.weights[~mask], 0.0)
    # The PPO anchor is the learner's log-prob, equal to the sampler's here.
    np.testing.assert_array_equal(batch.logp_old[~mask], 0.0)
    t = batch.tokens.shape[1]
    np.testing.assert_allclose(batch.logp_old, np.asarray(traj.logp_behavior)[:, :t], atol=1e-5)


def test_train_step__tis_loss_matches_the_no_tis_loss():
    exp = build(**{"loss.tis_cap": 2.0})
    assert exp.step_cfg.loss.tis_cap == 2.0
    state = exp.init_state(jax.random.key(0))
    params = jax.tree.map(jnp.copy, state.params)
    _, metrics = exp.train_step(state, exp.root_key())
    assert_finite(metrics)
    # The same step without TIS, by hand: same rollout key, same initial parameters.
    ref_state = base_state().replace(params=params)
    traj = rollout_fn()(step_rollout_key(exp), params)
    cfg = base_exp().step_cfg
    batch, _ = prepare_fn(cfg)(ref_state, traj)
    grads, m = jax.jit(jax.grad(lambda p, b: objective_lib.loss_fn(p, b, cfg), has_aux=True))(
        params, batch
    )
    np.testing.assert_allclose(metrics["loss"], m["loss"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["entropy"], m["entropy"], rtol=1e-5)
    grad_norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))))
    np.testing.assert_allclose(metrics["grad_norm"], grad_norm, rtol=1e-3)


# --------------------------------------------------------------------------------------------
# 6. KL in the reward.


def with_penalty_metric(credit_fn):
    """Wrap a credit function so its metrics also return the `token_penalty` it was given
    (NaN everywhere when it got none)."""

    def spy(traj, values):
        out = credit_fn(traj, values)
        pen = traj.token_penalty
        pen = jnp.full(traj.tokens.shape, jnp.nan) if pen is None else pen
        return out._replace(metrics={**out.metrics, "token_penalty": pen})

    return spy


def test_kl_in_reward__token_penalty_in_credit_and_no_kl_term_in_loss():
    beta = 0.1
    state0 = base_state()
    ref = scaled(state0.params, 1.5)  # a reference that differs from the policy
    state = state0.replace(ref_params=ref)
    traj = rollout_fn()(jax.random.key(5), state.params)
    cfg_reward = variant(kl_coef=beta, kl_in_reward=True, kl_reward_estimator="k3")
    cfg_reward = dataclasses.replace(
        cfg_reward, credit_fn=with_penalty_metric(cfg_reward.credit_fn)
    )
    cfg_loss = variant(kl_coef=beta, kl_in_reward=False)
    batch_r, adv_r = prepare_fn(cfg_reward)(state, traj)
    batch_l, _ = prepare_fn(cfg_loss)(state, traj)
    # The penalty: beta * k3(logp_behavior, logp_ref) on action tokens, 0 elsewhere.
    t = batch_r.tokens.shape[1]
    logp_ref = score_logp(ref, batch_r.tokens, batch_r.valid_mask)
    d = np.asarray(logp_ref) - np.asarray(traj.logp_behavior)[:, :t]
    k3 = np.exp(d) - d - 1.0
    mask = np.asarray(batch_r.action_mask)
    expected = np.zeros(traj.tokens.shape, np.float32)
    expected[:, :t] = np.where(mask, beta * k3, 0.0)
    penalty = np.asarray(adv_r["token_penalty"])
    np.testing.assert_allclose(penalty, expected, rtol=1e-4, atol=1e-7)
    on_actions = penalty[:, :t][mask]
    assert on_actions.min() >= 0 and on_actions.max() > 1e-4
    # the reference pass scores the action slots alone (0 elsewhere)
    np.testing.assert_allclose(
        np.asarray(batch_r.logp_ref)[mask], np.asarray(logp_ref)[mask], atol=1e-6
    )
    # Loss: no kl_ref term in reward mode (equal to the KL-free loss); present in loss mode.
    loss_r, m_r = loss_fn(cfg_reward)(state.params, batch_r)
    loss_free, _ = loss_fn(variant())(state.params, batch_r)
    loss_l, m_l = loss_fn(cfg_loss)(state.params, batch_l)
    loss_l_free, _ = loss_fn(variant())(state.params, batch_l)
    assert "kl_ref" not in m_r and "kl_ref" in m_l
    np.testing.assert_allclose(loss_r, loss_free, rtol=1e-6)
    np.testing.assert_allclose(loss_l - loss_l_free, beta * m_l["kl_ref"], rtol=1e-4)
    assert m_l["kl_ref"] > 1e-4
    # The reward's default estimator is k1 (verl `algorithm.kl_penalty="kl"`), independent of
    # the loss's k3: beta * (logp_behavior - logp_ref), which takes both signs.
    cfg_k1 = variant(kl_coef=beta, kl_in_reward=True)
    assert cfg_k1.loss.kl_estimator == "k3" and cfg_k1.loss.kl_reward_estimator == "k1"
    cfg_k1 = dataclasses.replace(cfg_k1, credit_fn=with_penalty_metric(cfg_k1.credit_fn))
    _, adv_k1 = prepare_fn(cfg_k1)(state, traj)
    expected[:, :t] = np.where(mask, -beta * d, 0.0)
    np.testing.assert_allclose(np.asarray(adv_k1["token_penalty"]), expected, atol=1e-6)


def test_kl_in_reward__uses_the_learners_log_probs_under_a_sampler_mismatch():
    """With TIS on, the update scores the episodes with the learner, and the KL in the reward
    is the learner's to the reference (verl: old_log_probs, recomputed by the actor), not the
    sampler's: a sampler off by 0.3 nats per token leaves the penalty unchanged."""
    beta = 0.1
    state = base_state().replace(ref_params=scaled(base_state().params, 1.5))
    traj = rollout_fn()(jax.random.key(5), state.params)
    skewed = traj.replace(logp_behavior=traj.logp_behavior + 0.3 * traj.action_mask)
    penalty = {}
    for tis in (0.0, 2.0):
        cfg = variant(kl_coef=beta, kl_in_reward=True, tis_cap=tis)
        cfg = dataclasses.replace(cfg, credit_fn=with_penalty_metric(cfg.credit_fn))
        for name, episodes in (("true", traj), ("skewed", skewed)):
            penalty[tis, name] = np.asarray(prepare_fn(cfg)(state, episodes)[1]["token_penalty"])
    mask = np.asarray(traj.action_mask)
    # Without TIS the sampler's log-probs are the old policy's: k1 moves by 0.3 per token.
    np.testing.assert_allclose(
        (penalty[0.0, "skewed"] - penalty[0.0, "true"])[mask], beta * 0.3, rtol=1e-4
    )
    # With TIS the learner's are: the same penalty as the unskewed episodes'.
    np.testing.assert_allclose(penalty[2.0, "skewed"], penalty[2.0, "true"], atol=1e-6)
    np.testing.assert_allclose(penalty[2.0, "true"], penalty[0.0, "true"], atol=1e-5)


def test_adaptive_kl__beta_follows_verls_rule_from_the_batch_kl():
    beta0, target, horizon = 0.1, 0.01, 100.0
    state0 = base_state()
    state0 = state0.replace(ref_params=scaled(state0.params, 1.5), kl_coef=jnp.float32(beta0))
    traj = rollout_fn()(jax.random.key(5), state0.params)
    key = jax.random.key(6)
    cfg = variant(
        kl_coef=beta0, kl_in_reward=True, kl_ctrl="adaptive", kl_target=target, kl_horizon=horizon
    )
    upd = jax.jit(lambda state, traj, key: step_lib.update(state, traj, key, cfg))
    state1, m1 = upd(state0, traj, key)
    # The batch KL, recomputed here: k1 = logp_behavior - logp_ref per action token, the mean
    # of each row, then of the rows (each of these rows holds action tokens).
    batch, _ = prepare_fn(cfg)(state0, traj)
    mask = np.asarray(batch.action_mask)
    logp_ref = np.asarray(score_logp(state0.ref_params, batch.tokens, batch.valid_mask))
    k1 = np.where(mask, np.asarray(batch.logp_old) - logp_ref, 0.0)
    rows = k1.sum(-1) / (mask.sum(-1) + 1e-8)
    assert mask.any(-1).all()
    kl = rows.mean()
    np.testing.assert_allclose(float(m1["kl_reward"]), kl, rtol=1e-4, atol=1e-7)
    # beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon), n = 8 episodes.
    error = np.clip(kl / target - 1.0, -0.2, 0.2)
    assert abs(error) > 0
    expected = beta0 * (1.0 + error * mask.shape[0] / horizon)
    np.testing.assert_allclose(float(state1.kl_coef), expected, rtol=1e-5)
    # This batch's rewards used the old beta: the update equals the fixed controller's.
    assert float(m1["kl_coef"]) == np.float32(beta0)
    fixed, _ = jax.jit(
        lambda state, traj, key: step_lib.update(
            state, traj, key, variant(kl_coef=beta0, kl_in_reward=True)
        )
    )(state0.replace(kl_coef=None), traj, key)
    for a, b in zip(jax.tree.leaves(fixed.params), jax.tree.leaves(state1.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The next step's penalty uses the updated beta.
    _, m2 = upd(state1, traj, key)
    assert float(m2["kl_coef"]) == float(state1.kl_coef)


def test_adaptive_kl__slots_dynamic_sampling_left_empty_are_not_counted():
    """Dynamic sampling with one generation batch fills some groups' slots only; the empty
    episodes there hold no action tokens, and the controller reads the filled ones alone."""
    beta0, target, horizon = 0.05, 0.01, 100.0
    exp = build(
        **{
            "loss.kl_coef": beta0,
            "loss.kl_in_reward": True,
            "loss.kl_ctrl": "adaptive",
            "loss.kl_target": target,
            "loss.kl_horizon": horizon,
            "sampling.dynamic": True,
            "sampling.max_gen_batches": 1,
        }
    )
    state = exp.init_state(jax.random.key(0))
    batch = exp.config.rollout.num_tasks * exp.config.rollout.group_size
    state1, m = exp.train_step(state, exp.root_key())
    filled = float(m["ds/filled_frac"])
    assert 0 < filled < 1, filled  # this seed leaves slots empty
    assert float(m["kl_rows"]) == filled * batch
    error = np.clip(float(m["kl_reward"]) / target - 1.0, -0.2, 0.2)
    expected = beta0 * (1.0 + error * filled * batch / horizon)
    np.testing.assert_allclose(float(state1.kl_coef), expected, rtol=1e-5)


def test_adaptive_kl__beta_is_in_the_state_and_resumes_exactly(tmp_path):
    from rl4agents import checkpoint as checkpoint_lib

    exp = build(**{"loss.kl_coef": 0.05, "loss.kl_in_reward": True, "loss.kl_ctrl": "adaptive"})
    assert exp.abstract_state().kl_coef.shape == ()
    state = exp.init_state(jax.random.key(0))
    assert float(state.kl_coef) == np.float32(0.05)
    root = exp.root_key()
    state1, _ = exp.train_step(state, root)
    with checkpoint_lib.Checkpointer(
        tmp_path, config_json=exp.config_json, compat_keys=experiment.COMPAT_KEYS
    ) as ckpt:
        ckpt.save(1, state1)
        restored = ckpt.restore(1, exp.abstract_state())
    beta1 = float(state1.kl_coef)
    assert float(restored.kl_coef) == beta1 != np.float32(0.05)
    direct, m_direct = exp.train_step(state1, root)  # donates its state: read before
    resumed, m_resumed = exp.train_step(restored, root)
    assert float(direct.kl_coef) == float(resumed.kl_coef) != beta1
    assert float(m_direct["kl_coef"]) == float(m_resumed["kl_coef"]) == beta1
    for a, b in zip(jax.tree.leaves(direct.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # three train-step compiles; the default suite resumes the default config
@pytest.mark.parametrize(
    "overrides",
    [
        # a value head (its parameters and Adam moments) and the KL reference
        {"credit.name": "ppo_gae", "model.value_head": "shared", "loss.kl_coef": 0.05},
        # dynamic sampling's refills, the adaptive beta and the learner's TIS pass
        {
            "sampling.dynamic": True,
            "loss.kl_coef": 0.05,
            "loss.kl_in_reward": True,
            "loss.kl_ctrl": "adaptive",
            "loss.tis_cap": 2.0,
        },
        # step rows of a windowed context, grouped by anchors
        {"credit.name": "gigpo", "rollout.context": "window"},
        # the sampler's ring of stale parameter copies
        {"train.staleness": 2},
    ],
    ids=["ppo_gae", "dynamic_adaptive_tis", "gigpo_window", "staleness"],
)
def test_resume__a_restored_state_takes_the_same_next_step(tmp_path, overrides):
    """The whole training state goes through a checkpoint, and the step's randomness comes
    from (root key, step): the step after a restore equals the uninterrupted one, bit for bit,
    in metrics and in every state leaf."""
    from rl4agents import checkpoint as checkpoint_lib

    exp = build(**overrides)
    root = exp.root_key()
    state1, _ = exp.train_step(exp.init_state(jax.random.key(0)), root)
    with checkpoint_lib.Checkpointer(
        tmp_path,
        config_json=exp.config_json,
        compat_keys=experiment.COMPAT_KEYS,
        compat_defaults=experiment.COMPAT_DEFAULTS,
    ) as ckpt:
        ckpt.save(1, state1)
        restored = ckpt.restore(1, exp.abstract_state())
    direct, m_direct = jax.device_get(exp.train_step(state1, root))  # donates state1
    resumed, m_resumed = jax.device_get(exp.train_step(restored, root))
    assert m_direct.keys() == m_resumed.keys()
    for key in m_direct:
        np.testing.assert_array_equal(m_direct[key], m_resumed[key], err_msg=key)
    paths = [sharding.path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(direct)]
    for path, a, b in zip(paths, jax.tree.leaves(direct), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    assert int(direct.step) == 2


def test_loss__agg_scale_divides_every_term():
    """ "seq-mean-token-sum-norm" with a constant C: the policy, entropy and KL terms are all
    sums over action tokens divided by C (verl applies one `agg_loss` to every term); without
    C, by the padded length T."""
    beta, mode, c = 0.1, "seq-mean-token-sum-norm", 4.0
    state = base_state().replace(ref_params=scaled(base_state().params, 1.5))
    traj = rollout_fn()(jax.random.key(5), state.params)

    def cfg(scale):
        pf = functools.partial(base_exp().step_cfg.loss.policy_fn, agg=mode, agg_scale=scale)
        return variant(agg=mode, agg_scale=scale, policy_fn=pf, kl_coef=beta, entropy_coef=0.01)

    batch, _ = prepare_fn(cfg(c))(state, traj)
    _, with_c = loss_fn(cfg(c))(state.params, batch)
    _, with_t = loss_fn(cfg(None))(state.params, batch)
    t = batch.tokens.shape[1]
    for key in ("pg_loss", "entropy", "kl_ref"):
        assert abs(float(with_c[key])) > 1e-6, key
        np.testing.assert_allclose(float(with_c[key]) * c, float(with_t[key]) * t, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# 7. Config errors.


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"shaping.overlong_per": "token"}, r"shaping\.overlong_per='token'.*allowed: \['turn'"),
        ({"loss.echo_coef": -0.1}, r"loss\.echo_coef=-0\.1; allowed: >= 0"),
        ({"loss.tis_cap": 0.5}, r"loss\.tis_cap=0\.5; allowed: 0 \(off\) or >= 1"),
        (
            {"sampling.dynamic": True, "credit.name": "remax"},
            r"sampling\.dynamic=True.*credit\.name='remax'.*allowed: sampling\.dynamic=False",
        ),
        (
            {"shaping.overlong_buffer": 2},  # A = 1 action token per turn
            r"shaping\.overlong_buffer=2 exceeds.*turn length of 1.*allowed: 0 \(off\) or 1\.\.1",
        ),
        (
            {"shaping.overlong_buffer": 4, "shaping.overlong_per": "episode"},  # K * A = 3
            r"shaping\.overlong_buffer=4 .*episode length of 3.*allowed: 0 \(off\) or 1\.\.3",
        ),
        ({"shaping.overlong_buffer": -1}, r"shaping\.overlong_buffer=-1; allowed: >= 0"),
        ({"sampling.max_gen_batches": 0}, r"sampling\.max_gen_batches=0; allowed: >= 1"),
        (
            {"loss.tis_mode": "batch"},
            r"loss\.tis_mode='batch' is not allowed; allowed: \['token', 'sequence'\]",
        ),
        ({"loss.kl_ctrl": "pid"}, r"loss\.kl_ctrl='pid' is not allowed; allowed: \['fixed'"),
        (
            {"loss.kl_ctrl": "adaptive", "loss.kl_coef": 0.1},
            r"kl_ctrl='adaptive' adapts the KL in the reward, but loss.kl_in_reward=False",
        ),
        (
            {"loss.kl_ctrl": "adaptive", "loss.kl_in_reward": True, "loss.kl_target": 0.0},
            r"loss\.kl_target=0\.0; allowed: > 0",
        ),
    ],
    ids=[
        "overlong_per",
        "echo_coef",
        "tis_cap",
        "dynamic_remax",
        "buffer_turn",
        "buffer_episode",
        "buffer_negative",
        "max_gen_batches",
        "tis_mode",
        "kl_ctrl",
        "kl_ctrl_needs_reward",
        "kl_target",
    ],
)
def test_build__rejects_bad_option(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        build(**overrides)


# Estimators that compare the samples of a task: the listed ones and whatever build() names.
GROUP_NAMES = sorted({"grpo", "rloo", "gigpo", *experiment.GROUP_ESTIMATORS} & set(credit.names()))


@pytest.mark.parametrize("name", GROUP_NAMES)
def test_build__group_estimators_need_two_samples(name):
    with pytest.raises(
        ValueError, match=rf"rollout\.group_size=1 .*credit\.name='{name}'.*allowed: >= 2"
    ):
        build(**{"credit.name": name, "rollout.group_size": 1})


def test_build__dynamic_sampling_needs_two_samples():
    with pytest.raises(ValueError, match=r"sampling\.dynamic.*rollout\.group_size.*allowed"):
        build(**{"sampling.dynamic": True, "rollout.group_size": 1, "credit.name": "reinforce_pp"})


def test_build__accepts_buffer_at_the_limit():
    exp = build(**{"shaping.overlong_buffer": 3, "shaping.overlong_per": "episode"})
    assert exp.step_cfg.shaping == step_lib.ShapingConfig(3, 1.0, "episode")


# --------------------------------------------------------------------------------------------
# 8. Every credit function runs one step.


@pytest.mark.slow
@pytest.mark.parametrize("name", credit.names())
def test_train_step__every_credit_function_runs(name):
    overrides = {"credit.name": name}
    if credit.requires_values(name):
        overrides["model.value_head"] = "shared"
    if credit_tree.requires_tree(name):
        overrides["rollout.branch.rule"] = "every"
    exp = build(**overrides)
    state = exp.init_state(jax.random.key(0))
    state, metrics = exp.train_step(state, exp.root_key())
    assert int(state.step) == 1
    assert_finite(metrics)
    if credit.requires_values(name):
        assert "value_loss" in metrics


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@pytest.mark.parametrize("agg", AGG_MODES)
def test_grad_accum__microbatches_give_the_minibatch_update(agg):
    """Four microbatches of 2 episodes, accumulated: the update of one batch of 8, for every
    aggregation mode, with one episode's action tokens removed (an empty row) and unequal
    token counts per microbatch."""
    exp = base_exp()
    state = base_state()
    traj = rollout_fn()(step_rollout_key(exp), state.params)
    traj = traj.replace(action_mask=traj.action_mask.at[1].set(False))
    policy_fn = functools.partial(exp.step_cfg.loss.policy_fn, agg=agg)
    cfg = variant(agg=agg, policy_fn=policy_fn, entropy_coef=0.01)
    key = jax.random.key(7)

    def update(k):
        c = dataclasses.replace(cfg, grad_accum=k)
        return jax.jit(functools.partial(step_lib.update, cfg=c))(base_state(), traj, key)

    (one, m1), (four, m4) = update(1), update(4)
    for name in ("loss", "grad_norm", "entropy"):
        np.testing.assert_allclose(m4[name], m1[name], rtol=1e-5, atol=1e-7, err_msg=name)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), one.params, four.params
    )


def test_microbatch_weights__hand():
    mask = np.zeros((2, 2, 4), bool)
    mask[0, 0, :3] = True  # microbatch 0: 3 tokens in one row, one empty row
    mask[1, 0, :1] = mask[1, 1, :1] = True  # microbatch 1: 1 token in each of two rows
    w = lambda agg: np.asarray(agg_lib.microbatch_weights(jnp.asarray(mask), agg))  # noqa: E731
    np.testing.assert_allclose(w("token-mean"), [0.6, 0.4])
    np.testing.assert_allclose(w("seq-mean-token-mean"), [1 / 3, 2 / 3])
    np.testing.assert_allclose(w("seq-mean-token-sum"), [1 / 3, 2 / 3])
    np.testing.assert_allclose(w("seq-mean-token-sum-norm"), [1.0, 1.0])
    np.testing.assert_allclose(
        np.asarray(agg_lib.microbatch_weights(jnp.zeros((2, 2, 4), bool), "token-mean")), 0.5
    )


def test_microbatch_weights__every_builtin_mode_declares_its_weighting():
    from rl4agents.losses.registry import AGGREGATIONS

    declared = {name: AGGREGATIONS.attr(name, "microbatch_weighting") for name in AGG_MODES}
    assert declared == {
        "token-mean": "tokens",
        "seq-mean-token-sum": "rows",
        "seq-mean-token-mean": "rows",
        "seq-mean-token-sum-norm": "sum",
    }
    with pytest.raises(KeyError, match="no-such-mode"):
        agg_lib.microbatch_weights(jnp.zeros((2, 2, 4), bool), "no-such-mode")


def test_step_config__layout_is_the_rollout_layout_computed_once():
    cfg = base_exp().step_cfg
    assert cfg.layout == rollout_lib.make_layout(cfg.env, cfg.rollout)
    assert cfg.layout is cfg.layout
    window = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, context="window"))
    assert window.layout == rollout_lib.make_layout(window.env, window.rollout)


def test_accumulated_grads__loss_metrics_follow_the_gradient_and_means_stay_means():
    """Under "seq-mean-token-sum-norm" the microbatch losses add up (weights 1), while a
    token-mean metric such as a clip fraction is weighted by each microbatch's token share."""
    mask = np.zeros((4, 5), bool)
    mask[0, :3] = True  # microbatch 0: 3 action tokens
    mask[2, :1] = True  # microbatch 1: 1 action token
    batch = jax.tree.map(jnp.asarray, base_batch_like(mask))

    def grad_fn(params, mb, cfg):
        n = jnp.sum(mb.action_mask).astype(jnp.float32)
        return {"w": n}, {"loss": n / 5.0, "pg_clipfrac": n / jnp.maximum(n, 1.0) * 0.5}

    cfg = variant(agg="seq-mean-token-sum-norm")
    cfg = dataclasses.replace(cfg, grad_accum=2, mesh=None)
    grads, metrics = microbatch_lib.accumulated_grads(grad_fn, None, batch, cfg)
    np.testing.assert_allclose(grads["w"], 4.0)  # 3 + 1: the sums add up
    np.testing.assert_allclose(metrics["loss"], 0.8)  # the minibatch's sum / C
    np.testing.assert_allclose(metrics["pg_clipfrac"], 0.5)  # a mean stays a mean


def base_batch_like(mask: np.ndarray) -> objective_lib.Batch:
    """A Batch of zeros with `mask` as its action mask (for accumulation tests)."""
    b, t = mask.shape
    f = np.zeros((b, t), np.float32)
    return objective_lib.Batch(
        tokens=np.zeros((b, t), np.int32),
        valid_mask=mask,
        action_mask=mask,
        logp_old=f,
        advantages=f,
        returns=f,
        values_old=f,
        logp_ref=f,
        weights=np.ones((b, t), np.float32),
        obs_target=np.zeros((b, t), bool),
        turn_ids=np.zeros((b, t), np.int32),
    )


def test_grad_accum__bad_split():
    with pytest.raises(ValueError, match=r"train.grad_accum=3 does not divide the minibatch"):
        build(**{"train.grad_accum": 3})
