"""The update computes the prompt a task's G samples share once per group.

`rollout.score(..., prefix=P, group=G)` runs the first P slots of each run of G rows once and
lets the other slots attend the group's keys and values; the train step passes the layout's
prompt (`train.share_prompt`). Log-probs, entropies, values, losses and gradients must equal
the unshared pass.
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
from rl4agents.train import views as views_lib
from tests.toy_env import RepeatDigit
from tests.train.test_score_slots import tiny_rollout
from tests.train.test_train import tiny_config

ENV = RepeatDigit(num_turns=3)
G = 3
CFG = rollout_lib.RolloutConfig(num_tasks=2, group_size=G, max_turns=3, max_action_len=3)
LAY = rollout_lib.make_layout(ENV, CFG)


def _traj():
    return tiny_rollout(ENV, CFG)


@functools.cache
def _scorer(value_head: str, slots: bool, remat: bool = False):
    """Jitted tokens -> (shared, unshared) (gradients, scores) of a weighted sum of the scores,
    on the rollout's valid mask; `remat` recomputes each layer in the backward pass."""
    traj = _traj()
    # attention in query blocks of 4 slots: the shared pass's blocks start after the prompt
    model_cfg = policy_lib.make_config(
        "tiny", ENV.tokenizer.vocab_size, value_head=value_head, attn_chunk=4, remat=remat
    )
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(1)))
    # non-zero value projection, so the value head's gradients are exercised
    params = jax.tree.map(lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, params)
    b, t = traj.tokens.shape
    rows = None
    if slots:
        act = rollout_lib.action_slots(LAY)
        rows = jnp.asarray(np.broadcast_to(act, (b, len(act))))
    weights = jnp.linspace(0.5, 1.5, t)

    @jax.jit
    def run(tokens):
        def f(params, prefix):
            model = nnx.merge(graphdef, params)
            sc = rollout_lib.score(
                model,
                tokens,
                traj.valid_mask,
                0.8,
                value_head != "none",
                slots=rows,
                prefix=prefix,
                group=G,
            )
            total = jnp.sum(sc.logp * weights) + jnp.sum(sc.entropy)
            if sc.values is not None:
                total = total + jnp.sum(sc.values * weights)
            return total, sc

        return [jax.grad(f, has_aux=True)(params, p) for p in (LAY.prompt, 0)]

    return run


@pytest.mark.parametrize(
    "value_head, slots, remat",
    [
        # every slot scored (the echo loss's pass): the same shared prefix, so slow only
        pytest.param("none", False, False, marks=pytest.mark.slow),
        ("separate", True, True),
    ],
    ids=["all_slots", "action_slots_separate_critic_remat"],
)
def test_score__shared_prompt_equals_the_unshared_pass(value_head, slots, remat):
    (g_shared, s_shared), (g_full, s_full) = _scorer(value_head, slots, remat)(_traj().tokens)
    mask = np.asarray(_traj().action_mask)
    assert mask.sum() > 6
    assert (s_shared.values is None) == (value_head == "none")
    for name in ("logp", "entropy", "values"):
        a, b = getattr(s_shared, name), getattr(s_full, name)
        if b is None:
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)
    # the first action token of each turn-1 action is predicted from the last prompt slot,
    # which lies in the shared prefix: it is scored as well
    first = LAY.prompt
    assert np.all(np.asarray(s_shared.logp)[:, first] != 0)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), g_shared, g_full
    )


def test_score__the_prompt_really_is_computed_once_per_group():
    """Give one sample a different prompt: the shared pass ignores it (it reads the group's
    first row), so its scores equal the unshared pass on the first row's prompt."""
    traj = _traj()
    tokens = np.asarray(traj.tokens).copy()
    original = tokens.copy()
    p = LAY.prompt
    tokens[1, : p - 1] = (tokens[1, : p - 1] + 1) % ENV.tokenizer.vocab_size  # sample 1 of task 0
    run = _scorer("separate", True, True)  # the program of the test above: no new compile
    (_, shared), (_, unshared_changed) = run(jnp.asarray(tokens))
    (_, _), (_, unshared_first) = run(jnp.asarray(original))
    a, b = np.asarray(shared.logp), np.asarray(unshared_first.logp)
    np.testing.assert_allclose(a, b, atol=2e-5)
    assert not np.allclose(np.asarray(unshared_changed.logp)[1], b[1], atol=1e-3)


def test_decoder__rejects_a_prefix_that_does_not_fit():
    model = policy_lib.Policy(policy_lib.make_config("tiny", 16), nnx.Rngs(0))
    tokens = jnp.ones((4, 6), jnp.int32)
    mask = jnp.tril(jnp.ones((6, 6), bool))[None].repeat(4, 0)
    positions = jnp.broadcast_to(jnp.arange(6), (4, 6))
    with pytest.raises(ValueError, match="groups of 3 rows"):
        model(tokens, positions, mask, prefix=2, group=3)
    with pytest.raises(ValueError, match="0 < prefix < slots"):
        model(tokens, positions, mask, prefix=6, group=2)


def _config(**overrides):
    return tiny_config(
        **{
            "model.num_layers": 2,
            "rollout.num_tasks": 2,
            "rollout.max_action_len": 2,
            "loss.kl_coef": 0.05,
            **overrides,
        }
    )


def test_shared_prefix__only_on_full_history_rows_in_group_order():
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
    cfg = experiment.build(_config(), mesh=mesh).step_cfg
    lay = rollout_lib.make_layout(cfg.env, cfg.rollout)
    g = cfg.rollout.group_size
    assert cfg.shared_prompt == lay.prompt > 0
    assert views_lib.shared_prefix(cfg, full_batch=False) == (lay.prompt, g)
    # minibatches and microbatches reorder or split the rows: the loss does not share
    for field, value in (("minibatches", 2), ("grad_accum", 2)):
        other = dataclasses.replace(cfg, **{field: value})
        assert views_lib.shared_prefix(other, full_batch=False) == (0, 1)
        assert views_lib.shared_prefix(other, full_batch=True) == (lay.prompt, g)
    window = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, context="window"))
    assert views_lib.shared_prefix(window, full_batch=True) == (0, 1)
    single = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, group_size=1))
    assert views_lib.shared_prefix(single, full_batch=True) == (0, 1)  # nothing to share
    off = experiment.build(_config(**{"train.share_prompt": False}), mesh=mesh).step_cfg
    assert off.shared_prompt == 0
    assert views_lib.shared_prefix(off, full_batch=True) == (0, 1)


# Slow (~20 s): the score-level tests above check that log-probs, entropies, values and
# gradients equal the unshared pass; this adds the step's own passes (old values, reference
# log-probs) and the whole update, end to end (`./scripts/test.sh -m slow`).
@pytest.mark.slow
def test_train_step__shared_prompt_gives_the_same_update():
    """ppo_gae with a shared value head and a KL term: every teacher-forced pass of the step
    (old values, reference log-probs, the loss) shares the prompt."""
    overrides = {"credit.name": "ppo_gae", "model.value_head": "shared", "model.num_layers": 1}
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
    exps = [
        experiment.build(_config(**{**overrides, "train.share_prompt": share}), mesh=mesh)
        for share in (True, False)
    ]
    assert exps[0].step_cfg.shared_prompt > 0 and exps[1].step_cfg.shared_prompt == 0
    out = []
    for exp in exps:
        state = exp.init_state(jax.random.key(0))
        state = state.replace(params=jax.tree.map(lambda x: x * 3.0, state.params))
        state, metrics = exp.train_step(state, jax.random.key(1))
        out.append((state.params, metrics))
    (p_shared, m_shared), (p_full, m_full) = out
    assert abs(float(m_full["loss"])) > 0
    for k in m_full:
        np.testing.assert_allclose(m_shared[k], m_full[k], rtol=1e-4, atol=1e-6, err_msg=k)
    # Adam divides by sqrt(v): float summation-order noise in a near-zero gradient moves its
    # parameter by a small fraction of one step (lr 1e-3), so parameters get atol 3e-5
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5), p_shared, p_full
    )
