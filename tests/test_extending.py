"""The worked example of docs/extending.md: the `opo` credit variant and its study.

Hand-derived values, a NumPy loop reference written like verl's
`compute_opo_outcome_advantage`, edge cases, the generated config section, one train step,
and (slow) the study `experiments/opo_vs_grpo.py` through scripts/sweep.py and
scripts/make_table.py. The registry-wide property tests (tests/credit/test_registry.py) cover
`opo` by themselves.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base, frozen_lake
from rl4agents import credit, envs, losses, registry, sharding, sweep
from rl4agents.envs.host import registry as host_registry
from rl4agents.train import experiment, resolve
from tests.credit.conftest import SPARSE_GROUPS, build_traj, episodes_traj, regroup, run_credit

ROOT = pathlib.Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-6


def _per_episode(traj, adv) -> np.ndarray:
    """f64[B]: the value each episode holds on all its action tokens (NaN without any)."""
    adv, mask = np.asarray(adv, np.float64), np.asarray(traj.action_mask)
    np.testing.assert_array_equal(adv[~mask], 0.0)
    out = np.full(traj.batch_size, np.nan)
    for b in range(traj.batch_size):
        if mask[b].any():
            np.testing.assert_allclose(adv[b, mask[b]], adv[b, mask[b]][0], rtol=1e-6)
            out[b] = adv[b, mask[b]][0]
    return out


def _drop_last_action_token(traj, b: int):
    """Episode `b`'s last turn loses its last action token (that slot becomes padding)."""
    k = int(traj.num_turns[b]) - 1
    t = int(traj.turn_end[b, k])
    return traj.replace(
        tokens=traj.tokens.at[b, t].set(0),
        valid_mask=traj.valid_mask.at[b, t].set(False),
        action_mask=traj.action_mask.at[b, t].set(False),
        turn_ids=traj.turn_ids.at[b, t].set(-1),
        turn_end=traj.turn_end.at[b, k].set(t - 1),
        logp_behavior=traj.logp_behavior.at[b, t].set(0.0),
    )


# ----------------------------------------------------------------------------- hand cases


def _hand_traj():
    # Two action slots per turn. Group 0: episodes with 1, 2, 3 turns and scores 1, 0, .5;
    # episode 2 loses one action token, so its token length is 5, not 6. Group 5: one episode
    # (score 3). Group 9: two 2-turn episodes, scores 2 and 4.
    traj = episodes_traj(
        [[0.0], [0.0, 0.0], [0.0, 0.0, 0.0], [0.0], [0.0, 0.0], [0.0, 0.0]],
        [0, 0, 0, 5, 9, 9],
        outcome=[1.0, 0.0, 0.5, 3.0, 2.0, 4.0],
    )
    return _drop_last_action_token(traj, 2)


def test_opo__hand_values():
    traj = _hand_traj()
    np.testing.assert_array_equal(np.asarray(traj.action_mask).sum(1), [2, 4, 5, 2, 4, 4])
    # length="tokens": group 0 has L = 2, 4, 5, so b = (2*1 + 4*0 + 5*.5) / 11 = 9/22 and
    #   A = 1 - 9/22 = 13/22, 0 - 9/22 = -9/22, .5 - 9/22 = 2/22 (the plain mean .5 would give
    #   .5, -.5, 0). Group 5 is a group of one: baseline 0, A = 3 (verl). Group 9 has equal
    #   lengths, so b = mean = 3 and A = -1, 1.
    tokens = _per_episode(traj, run_credit("opo", traj).advantages)
    want = [13 / 22, -9 / 22, 2 / 22, 3.0, -1.0, 1.0]
    np.testing.assert_allclose(tokens, want, rtol=RTOL, atol=ATOL)
    # length="turns": L = 1, 2, 3, so b = (1 + 0 + 1.5) / 6 = 5/12, A = 7/12, -5/12, 1/12.
    turns = _per_episode(traj, run_credit("opo", traj, length="turns").advantages)
    want_turns = [7 / 12, -5 / 12, 1 / 12, 3.0, -1.0, 1.0]
    np.testing.assert_allclose(turns, want_turns, rtol=RTOL, atol=ATOL)
    # singleton_policy="zero": the group of one gets 0, the others are unchanged.
    zero = _per_episode(traj, run_credit("opo", traj, singleton_policy="zero").advantages)
    np.testing.assert_allclose(zero, [*want[:3], 0.0, *want[4:]], rtol=RTOL, atol=ATOL)
    out = run_credit("opo", traj)
    assert out.returns is None
    np.testing.assert_allclose(out.metrics["frac_singleton"], 1 / 6, rtol=RTOL)
    np.testing.assert_allclose(out.metrics["baseline_mean"], (3 * 9 / 22 + 2 * 3) / 6, rtol=RTOL)


def test_opo__token_penalty_enters_the_score():
    # Equal lengths (2 tokens each); penalty .25 on both of episode 0's tokens: s = .5, 1,
    # b = .75, A = -.25, .25.
    traj = episodes_traj([[1.0], [1.0]], [0, 0])
    penalty = np.where(np.asarray(traj.action_mask), 0.25, 0.0)
    penalty[1] = 0.0
    traj = traj.replace(token_penalty=jnp.asarray(penalty, jnp.float32))
    got = _per_episode(traj, run_credit("opo", traj).advantages)
    np.testing.assert_allclose(got, [-0.25, 0.25], rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------- loop reference (verl's form)


def opo_loop(traj, length: str = "tokens", singleton_policy: str = "raw") -> np.ndarray:
    """f64[B, T] OPO advantages with Python loops, structured like verl's implementation."""
    mask = np.asarray(traj.action_mask)
    scores = np.asarray(traj.outcome_reward, np.float64)
    if traj.token_penalty is not None:
        scores = scores - np.where(mask, np.asarray(traj.token_penalty, np.float64), 0.0).sum(1)
    lengths = mask.sum(1) if length == "tokens" else np.asarray(traj.num_turns)
    index = np.asarray(traj.group_ids)
    id2score, id2len, id2bsl = defaultdict(list), defaultdict(list), {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(float(lengths[i]))
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = None  # a group of one
        else:
            total = sum(id2len[idx])
            weighted = sum(n * s for n, s in zip(id2len[idx], id2score[idx], strict=True))
            id2bsl[idx] = weighted / total if total > 0 else 0.0
    adv = np.zeros(mask.shape)
    for i in range(len(scores)):
        if id2bsl[index[i]] is None:
            a = scores[i] if singleton_policy == "raw" else 0.0
        else:
            a = scores[i] - id2bsl[index[i]]
        adv[i, mask[i]] = a
    return adv


@pytest.mark.parametrize(
    "seed, empty", [(0, ()), (1, (0,)), (2, (3, 4, 5, 6))], ids=["full", "one_empty", "group_empty"]
)
@pytest.mark.parametrize("length", ["tokens", "turns"])
@pytest.mark.parametrize("singleton_policy", ["raw", "zero"])
def test_opo__matches_loop_reference(seed, empty, length, singleton_policy):
    # Sparse group ids with a group of one; token penalties; episodes without any turn
    # ("group_empty": every episode of group 3 is empty, so its sum of lengths is 0).
    traj = regroup(build_traj(seed, penalty=True, empty=empty), SPARSE_GROUPS)
    out = run_credit("opo", traj, length=length, singleton_policy=singleton_policy)
    want = opo_loop(traj, length, singleton_policy)
    np.testing.assert_allclose(np.asarray(out.advantages, np.float64), want, rtol=RTOL, atol=ATOL)
    assert all(np.isfinite(np.asarray(v)) for v in out.metrics.values())


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("singleton_policy, want", [("raw", 2.5), ("zero", 0.0)])
def test_opo__group_of_one(singleton_policy, want):
    traj = episodes_traj([[0.0, 0.0]], [7], outcome=[2.5])
    got = _per_episode(traj, run_credit("opo", traj, singleton_policy=singleton_policy).advantages)
    np.testing.assert_allclose(got, [want], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("length", ["tokens", "turns"])
@pytest.mark.parametrize("singleton_policy", ["raw", "zero"])
def test_opo__equal_lengths_reduce_to_the_mean_baseline(length, singleton_policy):
    # Every episode takes 2 full turns, so all lengths are equal and b_g is the plain group
    # mean: OPO is then exactly dr_grpo (s - mean, no std), singletons included.
    scores = np.random.default_rng(0).normal(size=len(SPARSE_GROUPS))
    traj = episodes_traj([[0.0, 0.0]] * len(SPARSE_GROUPS), SPARSE_GROUPS, outcome=scores)
    got = run_credit("opo", traj, length=length, singleton_policy=singleton_policy)
    want = run_credit("dr_grpo", traj, singleton_policy=singleton_policy)
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=RTOL, atol=ATOL)


def test_opo__unknown_choice_lists_allowed():
    traj = episodes_traj([[1.0], [0.0]], [0, 0])
    with pytest.raises(ValueError, match=r"unknown length 'chars'; allowed: \['tokens', 'turns'"):
        credit.get("opo")(traj, length="chars")
    with pytest.raises(ValueError, match=r"allowed: \['raw', 'zero'\]"):
        credit.get("opo")(traj, singleton_policy="drop")


# ----------------------------------------------------------------- config section, train step


def test_config__section_comes_from_the_signature():
    want = {"length": "tokens", "singleton_policy": "raw"}
    assert "opo" in credit.names() and credit.defaults("opo") == want
    assert base.get_config().credit.opo.to_dict() == want
    with pytest.raises(ValueError, match=r"\['bad'\].*'opo'") as info:
        credit.validate("opo", {"bad": 1})
    assert "allowed fields: ['length', 'singleton_policy']" in str(info.value)
    assert credit.validate("opo", {"length": "turns"}) == {**want, "length": "turns"}


def test_config__command_line_overrides():
    # What `--config.credit.name=opo --config.credit.opo.length=turns` gives train.py.
    c = sweep.resolve(
        str(ROOT / "configs" / "frozen_lake.py"),
        {"credit.name": "opo", "credit.opo.length": "turns"},
    )
    assert c.credit.name == "opo" and c.credit.opo.length == "turns"
    with pytest.raises(ValueError, match="credit.opo.lenght"):
        sweep.resolve(str(ROOT / "configs" / "frozen_lake.py"), {"credit.opo.lenght": "turns"})


def test_train_step__opo_on_frozen_lake_is_finite():
    config = sweep.apply_overrides(
        frozen_lake.get_config("opo"),
        # one layer: it compiles faster, and the check is of the estimator, not the model
        {
            "rollout.num_tasks": 2,
            "rollout.group_size": 4,
            "rollout.max_turns": 3,
            "model.num_layers": 1,
        },
    )
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (1, 1, 1), devices=jax.devices()[:1])
    exp = experiment.build(config, mesh=mesh)
    state, metrics = exp.train_step(exp.init_state(jax.random.key(0)), exp.root_key())
    metrics = jax.device_get(metrics)
    assert int(state.step) == 1
    assert all(np.isfinite(v) for v in metrics.values()), metrics


# ------------------------------------------------------------------------- the study (slow)

TINY = {
    "train.num_steps": 2,
    "train.eval_every": 2,
    "train.eval_tasks": 8,
    "train.ood_max_turns": 0,
    "rollout.num_tasks": 2,
    "rollout.group_size": 4,
    "rollout.max_turns": 3,
}


@pytest.mark.slow
def test_study__sweep_and_table(tmp_path):
    # The real study's points (seed 0 only) with a tiny budget, through the two commands of
    # the study's docstring.
    study, real = tmp_path / "opo_vs_grpo_tiny.py", str(ROOT / "experiments" / "opo_vs_grpo.py")
    study.write_text(
        textwrap.dedent(
            f"""
            import dataclasses
            import importlib.util

            spec = importlib.util.spec_from_file_location("opo_study", {real!r})
            REAL = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(REAL)
            BASE = REAL.BASE


            def get_sweep():
                return [
                    dataclasses.replace(p, overrides={{**p.overrides, **{TINY!r}}})
                    for p in REAL.get_sweep()
                    if p.overrides["seed"] == 0
                ]
            """
        )
    )
    out, results = tmp_path / "sweep", tmp_path / "results"
    sweep_cmd = [sys.executable, "scripts/sweep.py", str(study), f"--out={out}", "--workers=1"]
    done = subprocess.run(sweep_cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 done, 0 skipped" in done.stdout
    table_cmd = [sys.executable, "scripts/make_table.py", f"--sweep={out}", f"--out={results}"]
    made = subprocess.run(table_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    md = (results / "table.md").read_text()
    assert "| credit.name=grpo | " in md and "| credit.name=opo | " in md, md
    assert "2 of 2 runs complete." in md


def test_registry__one_type_for_every_extension_point():
    """Environments, credit, losses, aggregations, host factories and rollout backends share
    `rl4agents.registry.Registry`; the config sections find theirs by name."""
    tables = (
        envs.registry.ENVIRONMENTS,
        credit.registry._CREDIT,
        losses.POLICY_LOSSES,
        losses.AGGREGATIONS,
        host_registry.FACTORIES,
        resolve.BACKENDS,
    )
    assert all(isinstance(t, registry.Registry) for t in tables)
    assert registry.for_section("env") is envs.registry.ENVIRONMENTS
    assert registry.for_section("credit") is credit.registry._CREDIT
    assert registry.for_section("loss") is losses.POLICY_LOSSES
    assert resolve.BACKENDS.names() == ["host", "jax"]

    table = registry.Registry("widget")
    table.register("a", fast=True)(lambda x, *, k=1: x)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        table.register("a")(lambda x: x)
    with pytest.raises(KeyError, match=r"unknown widget 'b'; known: \['a'\]"):
        table.get("b")
    assert table.attr("a", "fast") and table.defaults("a") == {"k": 1}
    table.declare("a", slow=False)
    assert table.attr("a", "slow") is False


def test_registry__facts_live_with_the_variant():
    """What callers need to know of a variant is declared where it registers."""
    assert envs.registry.backend("host") == "host" and envs.registry.backend("maze") == "jax"
    assert "host" not in envs.registry.names()  # the jitted environments (the contract's)
    assert set(envs.registry.names(backend=None)) == {*envs.registry.names(), "host"}
    assert credit.requires_values("turn_gae") and not credit.requires_values("grpo")
    assert credit.requires_groups("grpo") and not credit.requires_groups("ppo_gae")
    assert credit.requires_greedy("remax")
