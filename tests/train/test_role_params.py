"""One parameter set per role (`model.role_params`, `rl4agents.models.roles`).

A tiny two_agent experiment (3x3 maps, 4 turns, a one-layer model) with R = 2 sets: the
rollout samples turn k with set k mod 2, the update trains set r on role r's tokens only, the
swapped-roles control exchanges the sets, and the stacked state checkpoints. Each check is
against an independent reference: a single set's teacher-forced pass, a single set's update,
the sets exchanged by hand, hand-derived index arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from rl4agents import checkpoint as checkpoint_lib
from rl4agents import config_utils, memory, sharding
from rl4agents.models import policy as policy_lib
from rl4agents.models import roles
from rl4agents.rollout import rollout as rollout_lib
from rl4agents.train import experiment, loop, microbatch, objective, resolve, sft, views
from rl4agents.train import step as step_lib


def tiny_config(**overrides):
    """A locked two_agent config with two role sets, small enough to compile fast."""
    c = base.get_config()
    c.unlock()
    c.env.name = "two_agent"
    c.env.vocab = "minimal"
    c.env.two_agent.update(
        size=3, min_distance=1, max_steps=4, ood_size=3, ood_max_steps=4, num_candidates=4
    )
    c.model.update(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=32)
    c.model.role_params = 2
    c.rollout.update(num_tasks=2, group_size=2, max_turns=4, max_action_len=5)
    c.credit.name = "at_grpo"
    c.loss.entropy_coef = 0.0  # a bonus on every token would move both sets
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
    return sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])


@functools.cache
def role_exp() -> experiment.Experiment:
    return experiment.build(tiny_config(), mesh=one_device_mesh())


def one_set(seed: int):
    """A fresh single parameter set of the tiny model (its own initialisation)."""
    return nnx.split(policy_lib.Policy(role_exp().model_cfg, nnx.Rngs(seed)))[1]


@functools.cache
def sampled():
    """(two different sets stacked, the B episodes they sampled)."""
    cfg = role_exp().step_cfg
    params = jax.tree.map(lambda a, b: jnp.stack([a, b]), one_set(0), one_set(1))

    @jax.jit
    def run(key, p):
        return rollout_lib.rollout(key, cfg.graphdef, p, cfg.env, cfg.env_params, cfg.rollout)

    return params, run(jax.random.key(3), params)


def test_roles__hand_derived_indices_stack_and_swap():
    x = {"w": jnp.arange(3.0)[:, None] * jnp.ones((3, 2))}  # set r holds r
    np.testing.assert_array_equal(roles.swap(x)["w"][:, 0], [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(roles.swap(x, 2)["w"][:, 0], [2.0, 0.0, 1.0])
    np.testing.assert_array_equal(roles.unstack(x, 2)["w"], [2.0, 2.0])
    stacked = roles.stack({"w": jnp.array([1.0, 2.0])}, 2)["w"]
    np.testing.assert_array_equal(stacked, [[1.0, 2.0], [1.0, 2.0]])
    turn_ids = jnp.array([[-1, 0, 0, 1, 2, 3, -1]])
    np.testing.assert_array_equal(roles.role_of_slot(turn_ids, 2), [[0, 0, 0, 1, 0, 1, 0]])
    per_role = jnp.stack([jnp.full((1, 7), 10.0), jnp.full((1, 7), 20.0)])
    np.testing.assert_array_equal(
        roles.pick(per_role, roles.role_of_slot(turn_ids, 2)), [[10, 10, 10, 20, 10, 20, 10]]
    )
    with pytest.raises(ValueError, match="model.role_params=1; allowed: >= 2"):
        roles.stack(x, 1)


def test_knob_off__the_update_is_the_single_set_program():
    """role_params 0 and 1 trace the shared-set program: the update's jaxpr is the same for
    both, and the scoring helper is `score` of the merged model, op for op."""
    cfg = role_exp().step_cfg
    traj = sampled()[1]
    p = one_set(0)
    off = [
        dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, role_params=r))
        for r in (0, 1)
    ]
    state = step_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=p, opt_state=cfg.optimizer.init(p), ref_params=None
    )
    jaxprs = [
        str(
            jax.make_jaxpr(lambda s, t, c=c: step_lib.update(s, t, jax.random.key(0), c))(
                state, traj
            )
        )
        for c in off
    ]
    assert jaxprs[0] == jaxprs[1]
    tokens, valid = traj.tokens, traj.valid_mask
    new = jax.make_jaxpr(
        lambda q: rollout_lib.score_params(cfg.graphdef, q, tokens, valid, 1.0).logp
    )(p)
    old = jax.make_jaxpr(
        lambda q: rollout_lib.score(nnx.merge(cfg.graphdef, q), tokens, valid, 1.0).logp
    )(p)
    assert str(new) == str(old)


def test_rollout__turn_k_samples_with_set_k_mod_2():
    """The recorded log-prob of every action token equals that of a teacher-forced pass of
    set (turn mod 2) alone, and differs from the other set's on the turns it did not play."""
    cfg = role_exp().step_cfg
    params, traj = sampled()

    @jax.jit
    def logp(p):
        return rollout_lib.score(nnx.merge(cfg.graphdef, p), traj.tokens, traj.valid_mask).logp

    single = [logp(roles.unstack(params, r)) for r in (0, 1)]
    role = np.asarray(traj.turn_ids) % 2
    act = np.asarray(traj.action_mask)
    assert act[role == 0].sum() > 0 and act[role == 1].sum() > 0
    expected = np.where(role == 0, single[0], single[1])
    got = np.asarray(traj.logp_behavior)
    np.testing.assert_allclose(got[act], expected[act], atol=2e-5)
    for r in (0, 1):  # the other set would have given other log-probs
        other = np.asarray(single[1 - r])[act & (role == r)]
        assert np.max(np.abs(other - got[act & (role == r)])) > 1e-3


@pytest.mark.parametrize("role", [0, 1])
def test_update__set_r_learns_from_role_r_tokens_only(role):
    """Equal starting sets, advantages only on role r's tokens: one update leaves the other
    set bit for bit as it was, and moves set r exactly as a single set's update on the same
    batch does (the loss, token-mean over every action token, is then the same function of
    set r's parameters)."""
    cfg = role_exp().step_cfg
    single_cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, role_params=0))
    traj = sampled()[1]
    view = views.full_view(traj, cfg)
    tok_role = roles.role_of_slot(view.turn_ids, 2)
    noise = jax.random.normal(jax.random.key(7), view.tokens.shape)
    adv = jnp.where(view.action_mask & (tok_role == role), noise, 0.0)
    zeros = jnp.zeros(view.tokens.shape, jnp.float32)
    slots = jnp.broadcast_to(
        jnp.asarray(view.action_slots), (view.tokens.shape[0], len(view.action_slots))
    )
    batch = objective.Batch(
        tokens=view.tokens,
        valid_mask=view.valid,
        action_mask=view.action_mask,
        logp_old=view.logp_behavior,
        advantages=adv,
        returns=zeros,
        values_old=zeros,
        logp_ref=zeros,
        weights=jnp.ones_like(zeros),
        obs_target=view.obs_target,
        turn_ids=view.turn_ids,
        score_slots=slots,
    )
    start = one_set(0)
    stacked = roles.stack(start, 2)

    def updated(p, c):
        return jax.jit(
            lambda q: microbatch.minibatch_updates(
                q, c.optimizer.init(q), batch, jax.random.key(0), c
            )
        )(p)

    new, _, metrics = updated(stacked, cfg)
    ref, _, ref_metrics = updated(start, single_cfg)
    for a, b in zip(jax.tree.leaves(roles.unstack(new, 1 - role)), jax.tree.leaves(start)):
        np.testing.assert_array_equal(a, b)
    moved = 0.0
    for a, b, s in zip(
        jax.tree.leaves(roles.unstack(new, role)), jax.tree.leaves(ref), jax.tree.leaves(start)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        moved = max(moved, float(jnp.max(jnp.abs(a - s))))
    assert moved > 1e-4
    for key in ("loss", "pg_loss", "grad_norm"):
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5, err_msg=key)


def test_evaluate__swap_roles_equals_the_sets_exchanged_by_hand():
    """The control (greedy and sampled, `loop.evaluate` -> `Experiment.eval_fn` ->
    `step.evaluate`) equals evaluating the two sets exchanged by hand."""
    exp = role_exp()
    params = sampled()[0]
    by_hand = jax.tree.map(lambda x: x[::-1], params)
    swapped = loop.evaluate(exp, params, "test", 2, swap_roles=True)
    assert swapped == loop.evaluate(exp, by_hand, "test", 2)
    cfg = exp.step_cfg
    env, env_params = exp.env.make_split("test")
    rc = dataclasses.replace(exp.eval_rollout_config("test", True, 2), role_params=0)
    with pytest.raises(ValueError, match="swap_roles=True with role_params=0"):
        step_lib.evaluate(
            one_set(0), None, jax.random.key(6), cfg, env, env_params, rc, swap_roles=True
        )


def test_checkpoint__stacked_state_saves_and_restores(tmp_path):
    exp = role_exp()
    state = exp.init_state(jax.random.key(0))
    leaf = jax.tree.leaves(state.params)[0]
    assert leaf.shape[0] == 2 and leaf.sharding.spec[0] is None  # the role axis, replicated
    mu = jax.tree.leaves(state.opt_state)
    assert any(x.ndim and x.shape[0] == 2 for x in mu)  # AdamW's moments follow the sets
    with checkpoint_lib.Checkpointer(
        str(tmp_path), config_json=exp.config_json, compat_keys=experiment.COMPAT_KEYS
    ) as ckpt:
        ckpt.save(0, state)
        ckpt.wait()
        restored = ckpt.restore(0, exp.abstract_state())
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (
            {"env.name": "frozen_lake"},
            r"model.role_params=2 with env.name='frozen_lake', which "
            r"has 1 agent\(s\) taking turns; allowed: 0 or 1 \(no roles\)",
        ),
        ({"model.role_params": 3}, r"model.role_params=3 .* allowed: 0 or 1, or 2"),
        ({"model.role_params": -1}, r"model.role_params=-1; allowed: 0 or 1"),
        ({"model.value_head": "shared"}, r"model.value_head='shared' with model.role_params=2"),
        ({"model.lora.rank": 4}, r"model.lora.rank=4 with model.role_params=2"),
        ({"loss.echo_coef": 0.1}, r"loss.echo_coef=0.1 with model.role_params=2"),
    ],
)
def test_resolve__refuses_what_role_sets_do_not_support(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        experiment.build(tiny_config(**overrides), check_only=True)


def test_memory__counts_r_parameter_sets_and_their_moments():
    mesh = {"data": 1, "fsdp": 1, "tensor": 1}
    runs = {
        r: resolve.resolve(tiny_config(**{"model.role_params": r}), check_only=True) for r in (0, 2)
    }
    two, one = memory.estimate(runs[2], mesh), memory.estimate(runs[0], mesh)
    for term in ("parameters", "optimizer"):
        assert two.term(term) == 2 * one.term(term), term
    assert two.num_params == one.num_params  # one set's count; the terms hold R of them


def test_config__two_agent_roles_passes_the_start_up_checks():
    c = config_utils.load_config_file("configs/two_agent_roles.py")
    assert (c.model.role_params, c.credit.name, c.env.name) == (2, "at_grpo", "two_agent")
    run = resolve.resolve(c, check_only=True)
    assert run.rollout_cfg.role_params == 2


def test_eval_cli__swap_roles_adds_the_control_row(tmp_path):
    """`scripts/eval.py --swap_roles` on a saved R = 2 run: a "trained" and a "swapped" row per
    split, the same numbers as `loop.evaluate` on the restored sets (8 devices in the
    subprocess, one here: success over 8 tasks does not see the reduction order)."""
    c = tiny_config(
        **{"rollout.num_tasks": 4, "train.num_steps": 2, "train.eval_every": 2}
        | {"train.eval_tasks": 8, "train.eval_ood": False}
    )
    loop.run(c, str(tmp_path), quiet=True)
    out = subprocess.run(
        [sys.executable, "scripts/eval.py", f"--workdir={tmp_path}", "--swap_roles"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout and "swapped" in out.stdout
    rows = json.loads((tmp_path / "eval_provenance.json").read_text())["eval"]["rows"]
    assert [(r["split"], r["roles"]) for r in rows] == [("test", "trained"), ("test", "swapped")]
    exp = experiment.build(c, mesh=one_device_mesh())
    with checkpoint_lib.Checkpointer(
        str(tmp_path / "checkpoints"),
        config_json=exp.config_json,
        compat_keys=experiment.COMPAT_KEYS,
    ) as ckpt:
        params = ckpt.restore(2, exp.abstract_state()).params
    for row, swap in zip(rows, (False, True)):
        ref = loop.evaluate(exp, params, "test", 8, swap_roles=swap)
        assert {k: row[k] for k in ("greedy_success", "sampled_success")} == {
            k: ref[k] for k in ("greedy_success", "sampled_success")
        }


def test_warm_start__one_saved_set_starts_every_role_and_stacked_sets_restore(tmp_path):
    """`init.params` holding one set (a base policy) gives each role a copy of it; a saved run
    of R sets restores as it is; a run with one set refuses R saved sets in one line."""
    single = experiment.build(tiny_config(**{"model.role_params": 0}), mesh=one_device_mesh())
    params = one_set(5)
    keys = experiment.INIT_COMPAT_KEYS
    sft.save_params(str(tmp_path / "one"), params, 0, single.config_json, keys)
    got = role_exp().saved_params(str(tmp_path / "one"))
    want = jax.tree.leaves(params)
    for leaf, ref in zip(jax.tree.leaves(got), want, strict=True):
        assert leaf.shape == (2, *ref.shape) and leaf.sharding.spec[0] is None
        np.testing.assert_array_equal(leaf[0], ref)
        np.testing.assert_array_equal(leaf[1], ref)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), one_set(0), one_set(1))
    sft.save_params(str(tmp_path / "two"), stacked, 0, role_exp().config_json, keys)
    got = role_exp().saved_params(str(tmp_path / "two"))
    for leaf, ref in zip(jax.tree.leaves(got), jax.tree.leaves(stacked), strict=True):
        np.testing.assert_array_equal(leaf, ref)
    with pytest.raises(ValueError, match="model.role_params"):
        single.saved_params(str(tmp_path / "two"))
    # A run's start-up accepts the warm start (the refusal is gone).
    experiment.build(tiny_config(**{"init.params": str(tmp_path / "one")}), check_only=True)
