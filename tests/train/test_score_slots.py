"""The update scores the action slots alone: same log-probs, entropies, values, losses and
gradients as the full teacher-forced pass.

`rollout.score(..., slots=)` runs the last layer's queries and MLP, the LM head and the
log-softmax only at the slots that predict the given slots; the train step passes every slot
an action token can occupy (`Batch.score_slots`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl4agents import sharding
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment
from rl4agents.train import objective as objective_lib
from tests.toy_env import RepeatDigit
from tests.train.test_train import tiny_config

ENV = RepeatDigit(num_turns=3)
CFG = rollout_lib.RolloutConfig(num_tasks=3, group_size=2, max_turns=4, max_action_len=3)


@functools.cache
def tiny_rollout(env=ENV, cfg=CFG):
    """One jitted rollout of `cfg` on `env` with a freshly initialised tiny policy."""
    model_cfg = policy_lib.make_config("tiny", env.tokenizer.vocab_size)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0)))
    run = jax.jit(
        lambda key, p: rollout_lib.rollout(key, graphdef, p, env, env.default_params(), cfg)
    )
    return run(jax.random.key(0), params)


def _traj():
    return tiny_rollout()


def test_action_slots__are_the_action_blocks_of_the_layout():
    lay = rollout_lib.Layout(prompt=3, action=2, obs=1, turns=2, length=9)
    np.testing.assert_array_equal(rollout_lib.action_slots(lay), [3, 4, 6, 7])


def test_action_slots__hold_every_action_token_of_a_rollout():
    traj = _traj()
    slots = rollout_lib.action_slots(rollout_lib.make_layout(ENV, CFG))
    mask = np.asarray(traj.action_mask)
    assert mask.sum() > 10
    outside = np.ones(mask.shape[1], bool)
    outside[slots] = False
    assert not mask[:, outside].any()


@pytest.mark.parametrize("value_head", ["none", "shared", "separate"])
def test_score__slots_equal_the_full_pass_there_and_zero_elsewhere(value_head):
    traj = _traj()
    model_cfg = policy_lib.make_config("tiny", ENV.tokenizer.vocab_size, value_head=value_head)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(1)))
    # a non-zero value projection (it starts at 0), so that the values differ between slots
    params = jax.tree.map(lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, params)
    model = nnx.merge(graphdef, params)
    with_values = value_head != "none"
    b = traj.tokens.shape[0]
    slots = rollout_lib.action_slots(rollout_lib.make_layout(ENV, CFG))
    # a row-dependent order: the slots need not be sorted, only distinct
    rows = np.stack([np.roll(slots, i) for i in range(b)])
    full = rollout_lib.score(model, traj.tokens, traj.valid_mask, 0.7, with_values)
    part = rollout_lib.score(
        model, traj.tokens, traj.valid_mask, 0.7, with_values, slots=jnp.asarray(rows)
    )
    at = np.zeros(traj.tokens.shape, bool)
    at[:, slots] = True
    fields = ["logp", "entropy"] + (["values"] if with_values else [])
    if with_values:
        assert np.abs(np.asarray(full.values)[at]).max() > 1e-3
    for name in fields:
        f, p = np.asarray(getattr(full, name)), np.asarray(getattr(part, name))
        np.testing.assert_allclose(p[at], f[at], atol=2e-5, err_msg=name)
        assert np.all(p[~at] == 0), name
    assert (part.values is None) == (not with_values)
    # the recorded behaviour log-probs, read from the action slots alone
    mask = np.asarray(traj.action_mask)
    base_model = nnx.merge(*nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(0))))
    if value_head == "none":
        got = rollout_lib.score(
            base_model, traj.tokens, traj.valid_mask, slots=jnp.asarray(rows)
        ).logp
        np.testing.assert_allclose(
            np.asarray(got)[mask], np.asarray(traj.logp_behavior)[mask], atol=2e-5
        )


def _config(**overrides):
    """`tiny_config` with two layers (the last one scores the slots alone), two action tokens,
    a non-unit temperature and a KL term (the reference pass scores the slots too)."""
    return tiny_config(
        **{
            "model.num_layers": 2,
            "rollout.num_tasks": 2,
            "rollout.max_action_len": 2,
            "rollout.temperature": 1.3,
            "loss.kl_coef": 0.05,
            **overrides,
        }
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"credit.name": "ppo_gae", "model.value_head": "shared"},
        # the window's update equals the full-history one (test_window_train.py), which
        # scores action slots as the full-history case above checks: slow only
        pytest.param(
            {"credit.name": "grpo", "rollout.context": "window", "rollout.window_turns": 1},
            marks=pytest.mark.slow,
        ),
    ],
    ids=["ppo_gae_full", "grpo_window"],
)
def test_loss_fn__scored_slots_give_the_full_pass_loss_and_gradients(overrides):
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
    exp = experiment.build(_config(**overrides), mesh=mesh)
    cfg = exp.step_cfg
    state = exp.init_state(jax.random.key(0))
    # a sharper policy than at init, and a reference that differs from it
    state = state.replace(
        params=jax.tree.map(lambda x: x * 3.0, state.params),
        ref_params=jax.tree.map(lambda x: x * 2.0, state.ref_params),
    )

    @jax.jit
    def run(state, key):
        traj, rows = rollout_lib.rollout_rows(
            key, cfg.graphdef, state.params, cfg.env, cfg.env_params, cfg.rollout
        )
        batch, _ = objective_lib.prepare_batch(state, traj, cfg, rows)
        grad = jax.grad(objective_lib.loss_fn, has_aux=True)
        fast = grad(state.params, batch, cfg)
        slow = grad(state.params, batch._replace(score_slots=None), cfg)
        ref = nnx.merge(cfg.graphdef, state.ref_params)
        full_ref = rollout_lib.score(ref, batch.tokens, batch.valid_mask, 1.3).logp
        return batch, fast, slow, full_ref

    batch, (g_fast, m_fast), (g_slow, m_slow), full_ref = run(state, jax.random.key(3))
    # the reference pass scores the action slots alone too
    mask = np.asarray(batch.action_mask)
    np.testing.assert_allclose(
        np.asarray(batch.logp_ref)[mask], np.asarray(full_ref)[mask], atol=2e-5
    )
    assert batch.score_slots is not None
    assert batch.score_slots.shape[1] < batch.tokens.shape[1]
    assert int(batch.action_mask.sum()) > 4
    assert set(m_fast) == set(m_slow)
    for k in m_slow:
        np.testing.assert_allclose(m_fast[k], m_slow[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert abs(float(m_slow["loss"])) > 0
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_fast, g_slow
    )


def test_prepare_batch__echo_scores_every_slot():
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
    exp = experiment.build(_config(**{"loss.echo_coef": 0.1}), mesh=mesh)
    cfg = exp.step_cfg
    state = exp.init_state(jax.random.key(0))
    traj = jax.eval_shape(
        lambda k, p: rollout_lib.rollout(k, cfg.graphdef, p, cfg.env, cfg.env_params, cfg.rollout),
        jax.random.key(0),
        state.params,
    )
    batch, _ = jax.eval_shape(lambda s, t: objective_lib.prepare_batch(s, t, cfg), state, traj)
    assert batch.score_slots is None
    no_echo = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, echo_coef=0.0))
    batch, _ = jax.eval_shape(lambda s, t: objective_lib.prepare_batch(s, t, no_echo), state, traj)
    assert batch.score_slots.shape == (traj.tokens.shape[0], 3 * 2)
