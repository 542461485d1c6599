"""The update computes the prefix a branch row shares with its root once per root.

`rollout.score(..., forks=views.fork_prefix(cfg, ...))` runs the roots' whole pass and lets
each branch row of fork slot m attend its root's keys and values of the first p_m slots
(`policy.ForkPrefix`); the train step does so under a branching rollout with
`StepConfig.shared_prompt` > 0 and context="full". Log-probs, entropies, values, the loss, its
metrics and the updated parameters must equal today's pass, under fixed-turn and entropy rules.
Uses the tiny FrozenLake experiment of tests/train/test_step_options.py.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rl4agents.models import policy as policy_lib
from rl4agents.rollout import branch as branch_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import step as step_lib
from rl4agents.train import views as views_lib
from tests.train.test_step_options import build

RULES = {
    "every": {"rollout.branch.rule": "every"},
    "turns": {"rollout.branch.rule": "turns", "rollout.branch.turns": (1, 2)},
    "entropy": {
        "rollout.branch.rule": "entropy",
        "rollout.branch.max_forks": 2,
        "rollout.branch.entropy_threshold": -1.0,  # every turn a candidate
    },
    "arpo": {"rollout.branch.rule": "arpo", "rollout.branch.max_forks": 2},
}


@functools.cache
def _exp(rule: str, context: str = "full"):
    over = {
        "credit.name": "tree_grpo",
        "optim.lr": 0.05,
        "model.num_layers": 2,
        "rollout.max_action_len": 2,
        "rollout.branch.num_branches": 2,
        "rollout.context": context,
        "rollout.window_turns": 3,
        **RULES[rule],
    }
    return build(**over)


def _on_off(cfg: step_lib.StepConfig):
    """(sharing on, sharing off): the config with `shared_prompt` = the layout's prompt, and 0."""
    on = dataclasses.replace(cfg, shared_prompt=cfg.layout.prompt)
    return on, dataclasses.replace(cfg, shared_prompt=0)


def _copy(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def test_fork_prefix__static_prefixes_by_rule():
    """p_m = P + k_m (A + O), hand-derived from the layout: k_m = m for "every", the fixed
    turns for "turns", 0 for "entropy" and 1 for "arpo"; None without sharing, branching,
    context="full" or the whole batch in rollout order."""
    cfg = _exp("every").step_cfg
    lay = cfg.layout
    p, blk, b = lay.prompt, lay.action + lay.obs, cfg.rollout.batch_size
    assert (lay.action, lay.turns, b) == (2, 3, 8)
    # (branches per fork slot, prefixes): the M = 2 slots of "entropy" and "arpo" share one
    # prefix, so the plan runs their rows as one slot of M x N = 4 branches
    expect = {
        "every": (2, (p, p + blk, p + 2 * blk)),
        "turns": (2, (p + blk, p + 2 * blk)),
        "entropy": (4, (p,)),
        "arpo": (4, (p + blk,)),
    }
    for rule, (n, prefix) in expect.items():
        on, off = _on_off(dataclasses.replace(cfg, branch=_exp(rule).step_cfg.branch))
        assert views_lib.fork_prefix(on, full_batch=False) == policy_lib.ForkPrefix(b, n, prefix)
        assert views_lib.fork_prefix(off, full_batch=True) is None
    on, _ = _on_off(cfg)
    assert views_lib.fork_prefix(dataclasses.replace(on, branch=None), True) is None
    split = dataclasses.replace(on, minibatches=2)
    assert views_lib.fork_prefix(split, full_batch=False) is None
    assert views_lib.fork_prefix(split, full_batch=True) is not None
    window, _ = _on_off(_exp("every", "window").step_cfg)
    assert views_lib.fork_prefix(window, full_batch=True) is None
    assert views_lib.shared_prefix(on, full_batch=True) == (0, 1)  # no group prompt sharing


@functools.cache
def _scorer(rule: str, value_head: str, slots: bool):
    """Jitted key -> (tokens, valid, action mask, fork turns, shared scores, unshared scores)
    on a branching rollout of rule `rule` cut to the update's slots, with a 2-layer model of
    value head `value_head`; `slots`: score the action slots only (the losses' passes)."""
    cfg, _ = _on_off(_exp(rule).step_cfg)
    model_cfg = dataclasses.replace(_exp(rule).model_cfg, value_head=value_head)
    graphdef, params = nnx.split(policy_lib.Policy(model_cfg, nnx.Rngs(3)))
    # a non-zero value projection, so that values differ between slots
    params = jax.tree.map(lambda x: x + 0.05 if x.ndim == 2 and x.shape[1] == 1 else x, params)
    forks = views_lib.fork_prefix(cfg, full_batch=True)
    t = views_lib.train_length(cfg)
    with_values = value_head != "none"

    @jax.jit
    def run(key, tokens=None):
        tree, _ = branch_lib.branch_rollout(
            key, graphdef, params, cfg.env, cfg.env_params, cfg.rollout, cfg.branch
        )
        tok = tree.tokens[:, :t] if tokens is None else tokens
        valid = tree.valid_mask[:, :t]
        rows = None
        if slots:
            act = rollout_lib.action_slots(cfg.layout)
            rows = jnp.asarray(np.broadcast_to(act, (tok.shape[0], len(act))))
        out = [
            rollout_lib.score_params(graphdef, params, tok, valid, 1.0, with_values, rows, forks=f)
            for f in (forks, None)
        ]
        return tree.tokens[:, :t], valid, tree.action_mask[:, :t], tree.fork_turn, *out

    return run, cfg


def _assert_scores_equal(shared, unshared, err=""):
    for name in ("logp", "entropy", "values"):
        a, b = getattr(shared, name), getattr(unshared, name)
        if b is None:
            assert a is None
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=err + name)


@pytest.mark.parametrize(
    "rule, value_head, slots",
    [
        ("every", "separate", True),
        ("turns", "shared", False),
        ("entropy", "separate", True),
        ("arpo", "shared", True),
    ],
)
def test_score__forked_prefix_equals_the_unshared_pass(rule, value_head, slots):
    """Every row's log-probs, entropies and values from the shared pass equal today's pass
    (1e-5), on rollouts whose branch rows sample tokens after forking."""
    run, cfg = _scorer(rule, value_head, slots)
    b, k = cfg.rollout.batch_size, cfg.layout.turns
    _, _, mask, fork_turn, shared, unshared = jax.device_get(run(jax.random.key(5)))
    assert mask[b:].sum() > 4 and (fork_turn[b:] < k).any()  # branches sampled after forking
    assert np.abs(unshared.logp).sum() > 0
    _assert_scores_equal(shared, unshared)


def test_score__the_prefix_really_is_read_from_the_root():
    """Change the first action token of a branch row forked at turn 2 (a copy of its root's):
    the shared pass ignores it (it reads the root's keys and values), so its scores equal
    the unshared pass on the unchanged tokens, and the unshared pass on the changed ones
    differs."""
    run, cfg = _scorer("every", "separate", True)
    key = jax.random.key(5)
    tokens, valid, _, fork_turn, _, _ = jax.device_get(run(key))
    lay, b = cfg.layout, cfg.rollout.batch_size
    row = b + int(np.flatnonzero(np.asarray(fork_turn[b:]) == 2)[0])
    slot = lay.prompt  # turn 0's first action slot, inside the row's shared prefix
    assert valid[row, slot]
    changed = tokens.copy()
    changed[row, slot] = (changed[row, slot] + 1) % cfg.env.tokenizer.vocab_size
    _, _, _, _, shared_changed, unshared_changed = jax.device_get(run(key, jnp.asarray(changed)))
    _, _, _, _, _, unshared = jax.device_get(run(key, jnp.asarray(tokens)))
    after = slice(slot + 1, None)  # slots scored from a state at or after the change
    np.testing.assert_allclose(
        shared_changed.entropy[row, after], unshared.entropy[row, after], atol=1e-5
    )
    assert not np.allclose(
        unshared_changed.entropy[row, after], unshared.entropy[row, after], atol=1e-4
    )


def test_decoder__rejects_a_fork_plan_that_does_not_fit():
    model = policy_lib.Policy(policy_lib.make_config("tiny", 16), nnx.Rngs(0))
    t = 6
    tokens = jnp.ones((6, t), jnp.int32)  # 2 roots x (1 + 2 fork slots x 1 branch)
    mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(6, 0)
    positions = jnp.broadcast_to(jnp.arange(t), (6, t))
    with pytest.raises(ValueError, match="does not fit 6 rows of 6 slots"):
        model(tokens, positions, mask, forks=policy_lib.ForkPrefix(2, 2, (2, 3)))
    with pytest.raises(ValueError, match="does not fit 6 rows of 6 slots"):
        model(tokens, positions, mask, forks=policy_lib.ForkPrefix(2, 1, (2, 6)))
    with pytest.raises(ValueError, match="without a shared prompt"):
        model(tokens, positions, mask, prefix=2, forks=policy_lib.ForkPrefix(2, 1, (2, 3)))


@pytest.mark.parametrize("rule", ["turns", "entropy"])
def test_train_step__forked_prefix_gives_the_same_update(rule):
    """One jitted `train_step` of tree_grpo (which trains the branch rows) under context="full"
    gives the same loss, metrics and updated parameters (1e-5) with sharing on and off.

    The step updates with plain SGD, so that the parameters move by the gradient itself: Adam's
    first step moves a parameter by about lr g / (|g| + eps), so a gradient of the size of
    float summation noise (~1e-8) would decide differences of 1e-5 in the parameters.
    """
    exp = _exp(rule)
    sgd = optax.sgd(0.5)
    on, off = _on_off(dataclasses.replace(exp.step_cfg, optimizer=sgd))
    assert views_lib.fork_prefix(on, full_batch=False) is not None
    assert not on.train_roots_only
    state = exp.init_state(jax.random.key(0))
    state = _copy(state.replace(opt_state=sgd.init(state.params)))
    root = exp.root_key()
    out = [
        jax.device_get(jax.jit(functools.partial(step_lib.train_step, cfg=c))(state, root))
        for c in (on, off)
    ]
    (s_on, m_on), (s_off, m_off) = out
    assert m_on.keys() == m_off.keys() and m_on["nonfinite"] == 0
    assert m_on["branch/forks"] > 0 and abs(m_on["pg_loss"]) > 0
    for name in m_on:
        np.testing.assert_allclose(m_on[name], m_off[name], rtol=1e-5, atol=1e-5, err_msg=name)
    moved = 0.0
    for a, b, init in zip(
        jax.tree.leaves(s_on.params), jax.tree.leaves(s_off.params), jax.tree.leaves(state.params)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        moved = max(moved, float(np.abs(np.asarray(b) - np.asarray(init)).max()))
    assert moved > 1e-3  # the step did update the parameters
