"""Branching rollouts inside the train step (`rollout.branch`).

Rule "none" is today's step bit for bit; under a branching rule the step trains on the
B (1 + M N) rows of `branch.branch_rollout` and the loss reads the advantages that the tree
estimator gives on that very tree; bad values and combinations are refused at start-up in one
line. Uses the tiny FrozenLake experiment of tests/train/test_step_options.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4agents import credit, sharding
from rl4agents.credit import tree as credit_tree
from rl4agents.rollout import branch as branch_lib
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, loop
from rl4agents.train import objective as objective_lib
from rl4agents.train import resolve as resolve_lib
from rl4agents.train import sampling as sampling_lib
from rl4agents.train import step as step_lib
from rl4agents.train import views as views_lib
from rl4agents.types import Trajectory
from tests.train.test_step_options import build, one_device_mesh, tiny_config

# Fork every turn a root took, 2 continuations each: M = K = 3 fork slots.
EVERY = {"rollout.branch.rule": "every", "rollout.branch.num_branches": 2}


def _copy(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _step_with_rollout(state, key_root, cfg: step_lib.StepConfig):
    """Today's train step written out: `rollout_rows`, reward shaping, `update`."""
    key = jax.random.fold_in(key_root, state.step)
    key_rollout, key_perm = jax.random.split(key)
    traj, rows = rollout_lib.rollout_rows(
        key_rollout,
        cfg.graphdef,
        state.params,
        cfg.env,
        cfg.env_params,
        cfg.rollout,
        shard_fn=sharding.batch_constraint(cfg.mesh),
    )
    traj = sampling_lib.shape_rewards(traj, cfg)
    return step_lib.update(state, traj, key_perm, cfg, rows)


def test_branch_none__is_todays_step_bit_for_bit():
    """The default rule "none" adds nothing: two steps equal the written-out step of a plain
    rollout in every state leaf and metric, bit for bit, and log no branch metric."""
    exp = build(**{"optim.lr": 0.05})
    cfg = exp.step_cfg
    assert cfg.branch is None and cfg.num_rows == cfg.rollout.batch_size
    root = exp.root_key()
    state = exp.init_state(jax.random.key(0))
    ref_state = _copy(state)
    ref = jax.jit(functools.partial(_step_with_rollout, cfg=cfg))
    for _ in range(2):
        ref_state, m_ref = ref(ref_state, root)
        state, m = exp.train_step(state, root)
        m, m_ref = jax.device_get((m, m_ref))
        assert m.keys() == m_ref.keys()
        assert not any(k.startswith("branch/") for k in m)
        for key in m:
            np.testing.assert_array_equal(m[key], m_ref[key], err_msg=key)
        for x, y in zip(jax.tree.leaves(_copy(state)), jax.tree.leaves(_copy(ref_state))):
            np.testing.assert_array_equal(x, y)
    assert int(state.step) == 2


def _plain(tree) -> Trajectory:
    """`tree` without its tree metadata: every row a tree of its own."""
    return Trajectory(**{f.name: getattr(tree, f.name) for f in dataclasses.fields(Trajectory)})


@functools.cache
def _branch_exp(name: str) -> experiment.Experiment:
    return build(**{"credit.name": name, "optim.lr": 0.05, **EVERY})


def _probe(state, key_root, cfg: step_lib.StepConfig):
    """The first half of the step written out: the branching rollout, the batch the loss
    reads (`prepare_batch`) and the loss on it, before any update."""
    key_rollout, _ = jax.random.split(jax.random.fold_in(key_root, state.step))
    tree, rows = branch_lib.branch_rollout(
        key_rollout,
        cfg.graphdef,
        state.params,
        cfg.env,
        cfg.env_params,
        cfg.rollout,
        cfg.branch,
        shard_fn=sharding.batch_constraint(cfg.mesh),
    )
    tree = sampling_lib.shape_rewards(tree, cfg)
    batch, _ = objective_lib.prepare_batch(state, tree, cfg, rows)
    _, loss_metrics = objective_lib.loss_fn(state.params, batch, cfg)
    return tree, batch, loss_metrics["loss"]


def test_config__share_fork_prefix_reaches_the_step():
    """`train.share_fork_prefix` keeps the prompt sharing under branching, which the update's
    passes then use to read each branch's prefix from its root (`views.fork_prefix`, whose
    exactness `tests/train/test_branch_prefix_scoring.py` checks); off, they share nothing."""
    on = build(**{"credit.name": "tree_grpo", **EVERY, "train.share_fork_prefix": True})
    assert on.step_cfg.shared_prompt == on.step_cfg.layout.prompt > 0
    assert views_lib.fork_prefix(on.step_cfg, full_batch=True) is not None
    off = _branch_exp("tree_grpo").step_cfg
    assert off.shared_prompt == 0 and views_lib.fork_prefix(off, full_batch=True) is None


@pytest.mark.parametrize("name", ["vineppo", "tree_grpo"])
def test_branch_step__loss_reads_the_tree_estimator_of_the_same_tree(name):
    """credit vineppo / tree_grpo under rule "every": the step samples B (1 + K N) rows;
    the advantages its loss reads equal the estimator applied by hand to the same tree (and
    differ from the estimator on the rows without their metadata); vineppo's loss reads the
    roots' tokens only, tree_grpo's every sampled token; the step's loss is the loss of that
    batch; rollout metrics read the B roots; two steps run, finite."""
    exp = _branch_exp(name)
    cfg = exp.step_cfg
    b, k, n = cfg.rollout.batch_size, cfg.rollout.max_turns, 2
    assert cfg.branch == branch_lib.BranchConfig(rule="every", num_branches=n)
    assert cfg.num_rows == b * (1 + k * n) and cfg.shared_prompt == 0
    root = exp.root_key()
    state = exp.init_state(jax.random.key(0))
    tree, batch, loss = jax.device_get(
        jax.jit(functools.partial(_probe, cfg=cfg))(_copy(state), root)
    )
    adv_loss, t = batch.advantages, batch.advantages.shape[1]
    assert isinstance(tree, credit_tree.TreeTrajectory)
    assert tree.tokens.shape[0] == cfg.num_rows
    fn = functools.partial(credit.get(name), **credit.defaults(name))
    tree_j = jax.tree.map(jnp.asarray, tree)
    by_hand = np.asarray(fn(tree_j, None).advantages)[:, :t]
    np.testing.assert_allclose(adv_loss, by_hand, rtol=1e-5, atol=1e-6)
    assert np.abs(by_hand).max() > 0
    without_tree = np.asarray(fn(_plain(tree_j), None).advantages)[:, :t]
    assert not np.allclose(by_hand, without_tree, atol=1e-4)  # the metadata is read
    # vineppo (train_on="roots"): the branches are value rollouts, out of the loss
    roots_only = name == "vineppo"
    assert cfg.train_roots_only == roots_only
    trained = tree.action_mask[:, :t].copy()
    trained[b:] &= not roots_only
    np.testing.assert_array_equal(batch.action_mask, trained)

    metrics = []
    for _ in range(2):
        state, m = exp.train_step(state, root)
        metrics.append(jax.device_get(m))
    first = metrics[0]
    np.testing.assert_allclose(first["loss"], loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(first["reward"], tree.outcome_reward[:b].mean(), rtol=1e-6)
    forks = (tree.fork_turn[b:] < k).sum() / (b * n)
    np.testing.assert_allclose(first["branch/forks"], forks, rtol=1e-6)
    assert int(state.step) == 2
    for m in metrics:
        assert m["nonfinite"] == 0
        assert all(np.isfinite(v) for v in m.values())


def test_branch_step__window_layout_gives_the_full_history_loss():
    """Under context="window" with a window of every turn, the step rows of a branching
    rollout give vineppo's full-history loss (the branches' step rows out of it too), and the
    window step runs."""
    full = _branch_exp("vineppo").step_cfg
    over = {"rollout.context": "window", "rollout.window_turns": 3}
    exp = build(**{"credit.name": "vineppo", "optim.lr": 0.05, **EVERY, **over})
    win = exp.step_cfg
    b, k = win.rollout.batch_size, win.rollout.max_turns

    @jax.jit
    def both(state, key):
        tree, rows = branch_lib.branch_rollout(
            key, win.graphdef, state.params, win.env, win.env_params, win.rollout, win.branch
        )
        out = []
        for cfg, r in ((full, None), (win, rows)):
            batch, _ = objective_lib.prepare_batch(state, tree, cfg, r)
            out.append((batch.action_mask, objective_lib.loss_fn(state.params, batch, cfg)[1]))
        return out

    state = exp.init_state(jax.random.key(0))
    (_, m_full), (mask_win, m_win) = jax.device_get(both(state, jax.random.key(1)))
    assert mask_win.shape[0] == win.num_rows * k and mask_win[: b * k].any()
    assert not mask_win[b * k :].any()
    for key in ("loss", "pg_loss", "entropy"):
        np.testing.assert_allclose(m_win[key], m_full[key], rtol=1e-4, atol=1e-6, err_msg=key)
    state, m = jax.device_get(exp.train_step(state, exp.root_key()))
    assert m["nonfinite"] == 0 and int(state.step) == 1


def test_branch_loop__two_steps_of_train_with_vineppo(tmp_path):
    """`loop.run` (what scripts/train.py calls) trains 2 steps of vineppo under branching
    rule "turns" and logs finite losses and the branch metrics."""
    over = {
        "credit.name": "vineppo",
        "rollout.branch.rule": "turns",
        "rollout.branch.turns": (1,),
        "train.num_steps": 2,
        "train.eval_every": 2,
        "train.eval_tasks": 2,
        "train.eval_ood": False,
        "checkpoint.every": 2,
    }
    summary = loop.run(tiny_config(**over), str(tmp_path), mesh=one_device_mesh(), quiet=True)
    assert summary["steps"] == 2 and summary["finished"]
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert np.isfinite(r["train/loss"]) and "train/branch/forks" in r


# --------------------------------------------------------------------------------------------
# Start-up checks (no compile).


def _refusal(overrides) -> str:
    with pytest.raises(ValueError) as info:
        experiment.build(tiny_config(**overrides), check_only=True)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"rollout.branch.rule": "bogus"}, r"^rollout\.branch\.rule='bogus' is not allowed"),
        ({**EVERY, "rollout.branch.num_branches": 0}, r"^rollout\.branch\.num_branches=0;"),
        ({"rollout.branch.rule": "turns"}, r"^rollout\.branch\.turns=\(\) with rule 'turns'"),
        (
            {"rollout.branch.rule": "turns", "rollout.branch.turns": (3,)},
            r"^rollout\.branch\.turns=\(3,\); allowed: whole turns in \[0, 3\)",
        ),
        (
            {"rollout.branch.rule": "entropy", "rollout.branch.max_forks": 0},
            r"^rollout\.branch\.max_forks=0; allowed: >= 1",
        ),
        ({**EVERY, "rollout.branch.entropy_tokens": 2}, r"^rollout\.branch\.entropy_tokens=2;"),
        (
            {"rollout.branch.rule": "arpo", "rollout.branch.arpo_prob": 1.5},
            r"^rollout\.branch\.arpo_prob=1\.5; allowed: in \[0, 1\]",
        ),
        ({**EVERY, "sampling.dynamic": True}, r"^sampling\.dynamic=True with rollout\.branch"),
        (
            {**EVERY, "sampling.filter": "top_p_variance"},
            r"^sampling\.filter='top_p_variance' with rollout\.branch\.rule='every'",
        ),
        ({**EVERY, "log.mi_proxy": True}, r"^log\.mi_proxy=True with rollout\.branch"),
        # 4 tasks x 2 samples x (1 + 3 x 2) = 56 rows
        ({**EVERY, "train.minibatches": 3}, r"train\.minibatches=3 does not divide .* 56 "),
    ],
)
def test_branch_config__bad_values_are_refused_in_one_line(overrides, pattern):
    assert re.search(pattern, _refusal(overrides))


@pytest.mark.parametrize("name", [n for n in credit.names() if credit_tree.requires_tree(n)])
def test_tree_credit__needs_a_branching_rule(name):
    """vineppo, tree_grpo, arpo and salt refuse to train on a plain rollout, from a config
    and from `step_config`; with a rule they resolve."""
    assert name in ("vineppo", "tree_grpo", "arpo", "salt")
    message = _refusal({"credit.name": name})
    assert message.startswith(f"credit.name={name!r} reads the tree of a branching rollout")
    assert "rollout.branch.rule='none'" in message
    run = resolve_lib.resolve(tiny_config(**{"credit.name": name}, **EVERY), check_only=True)
    with pytest.raises(ValueError, match=rf"^credit\.name='{name}' reads the tree"):
        resolve_lib.step_config(run.env, run.model_cfg, run.rollout_cfg, None, credit_name=name)
    bc = branch_lib.BranchConfig(rule="every")
    cfg = resolve_lib.step_config(
        run.env, run.model_cfg, run.rollout_cfg, None, credit_name=name, branch=bc
    )
    assert cfg.branch == bc and cfg.num_rows == run.rollout_cfg.batch_size * (1 + 3 * 2)


def test_branch_config__resolves_every_field():
    c = tiny_config(
        **{
            "rollout.branch.rule": "entropy",
            "rollout.branch.num_branches": 3,
            "rollout.branch.max_forks": 2,
            "rollout.branch.entropy_threshold": 0.5,
        }
    )
    run = resolve_lib.resolve(c, check_only=True)
    bc = resolve_lib.branch_config(c, run.layout, run.backend)
    assert bc == branch_lib.BranchConfig(
        rule="entropy", num_branches=3, max_forks=2, entropy_threshold=0.5
    )
    assert bc.num_rows(8, 3) == 8 * (1 + 2 * 3)
    assert resolve_lib.branch_config(tiny_config(), run.layout, run.backend) is None
