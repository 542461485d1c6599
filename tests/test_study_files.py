"""The plans of the study files: the method-family studies (experiments/branching_estimators.py,
losses_filters.py, staleness.py, loss_t3.py, at_grpo_roles.py) and the learning and credit
studies from the base policy (echo_trap.py, credit_v2.py, gigpo_vs_grpo.py, learning_base_v5.py).

Each study is loaded as scripts/sweep.py loads it, and its runs' configs are resolved as
train.py gets them (`sweep.resolve`); the checks read the resolved configs, not the study's
own tables: unique run names, the same seeds for every variant of an environment, the same
evaluation tasks, the base policy as the start, the variants' differences from their
baseline, the analysis command's row labels, and for the branching study the rows per step.
(Every committed study's configs also pass train.py's start-up checks:
tests/test_sweep.py::test_committed_study__plans_and_every_config_passes_checks.)
"""

from __future__ import annotations

import collections
import csv
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base_policy
from rl4agents import config_utils, losses, results, sweep
from rl4agents.rollout import branch as branch_lib
from tests.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUDIES = (
    "branching_estimators",
    "losses_filters",
    "staleness",
    "loss_t3",
    "at_grpo_roles",
    "echo_trap",
)
# Environment variables that change a plan; cleared so each test sees the default plan.
_VARS = (
    "BASE_POLICY",
    "BRANCHING_ENVS",
    "BRANCHING_SEEDS",
    "BRANCHING_MINUTES",
    "LOSSES_FILTERS_ENVS",
    "LOSSES_FILTERS_SEEDS",
    "LOSSES_FILTERS_MINUTES",
    "STALENESS_ENVS",
    "STALENESS_SEEDS",
    "STALENESS_MINUTES",
    "LOSS_T3_SEEDS",
    "LOSS_T3_MINUTES",
    "AT_GRPO_SEEDS",
    "AT_GRPO_MINUTES",
    "CREDIT_V2_STAGE",
    "CREDIT_V2_LR_FILE",
    "CREDIT_V2_TEMPERATURE",
    "GIGPO_ENVS",
    "ECHO_ENVS",
    "ECHO_SEEDS",
    "V5_ENVS",
    "V5_TEMPERATURE",
    "V5_SEEDS",
    "RECIPE",
    "RECIPE_ENVS",
    "RECIPE_SEEDS",
    "RECIPE_SEED0",
)
DEFAULT_SEEDS = {
    "branching_estimators": 3,
    "losses_filters": 3,
    "staleness": 3,
    "loss_t3": 5,
    "at_grpo_roles": 3,
    "echo_trap": 3,
}
DEFAULT_RUNS = {
    "branching_estimators": 24,
    "losses_filters": 30,
    "staleness": 42,
    "loss_t3": 15,
    "at_grpo_roles": 9,
    "echo_trap": 24,
}
DEFAULT_MINUTES = {"at_grpo_roles": 18.0, "echo_trap": 0.0}  # the others: 10 (0: steps only)


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _plan(name: str):
    """(study, module, [(run, resolved config)]) of experiments/<name>.py."""
    path = f"experiments/{name}.py"
    study = sweep.load_study(path)
    module = config_utils.load_module(path, f"study_{name}")
    return study, module, [(r, sweep.resolve(r.config, r.overrides)) for r in study.runs]


def _labels(study, strip: str) -> list[str]:
    """The row labels make_table gives the study's runs (results.short_labels, then --strip)."""
    labels = results.short_labels([r.variant for r in study.runs])
    return [re.sub(strip, "", label) or "base" for label in labels] if strip else labels


@pytest.mark.parametrize("name", STUDIES)
def test_study__unique_names_same_seeds_same_eval_tasks_and_the_base_policy(name, clean_env):
    study, module, planned = _plan(name)
    assert len(planned) == DEFAULT_RUNS[name]
    assert len({r.name for r in study.runs}) == len(study.runs)
    assert len({r.dirname for r in study.runs}) == len(study.runs)
    seeds = collections.defaultdict(set)
    eval_tasks = collections.defaultdict(set)
    for run, c in planned:
        seeds[(c.env.name, run.variant)].add(c.seed)
        tasks = (c.train.eval_tasks, c.train.final_eval_tasks)
        eval_tasks[c.env.name].add((c.train.eval_seed, *tasks, c.train.eval_ood))
        assert c.init.params == base_policy.CHECKPOINT
        assert c.train.max_minutes == DEFAULT_MINUTES.get(name, 10.0)
    assert set(map(frozenset, seeds.values())) == {frozenset(range(DEFAULT_SEEDS[name]))}
    assert all(len(v) == 1 for v in eval_tasks.values()), eval_tasks
    # make_table's --baseline (the study's BASELINE) names one row in every environment, and
    # no two variants of an environment share a row.
    labels = _labels(study, getattr(module, "STRIP", ""))
    rows = collections.defaultdict(dict)
    for run, label in zip(study.runs, labels, strict=True):
        env = run.variant[0].split(",")[0] if run.variant else ""
        assert rows[env].setdefault(label, run.variant) == run.variant, (label, run.variant)
    table = load_script("make_table")
    for env_rows in rows.values():
        assert table.resolve_baseline(module.BASELINE, sorted(env_rows)) in env_rows


def test_study__environment_variables_pick_envs_seeds_and_minutes(clean_env):
    clean_env.setenv("BRANCHING_ENVS", "sokoban")
    clean_env.setenv("BRANCHING_SEEDS", "2")
    clean_env.setenv("BRANCHING_MINUTES", "18")
    clean_env.setenv("BASE_POLICY", "runs/elsewhere")
    study, _, planned = _plan("branching_estimators")
    assert len(planned) == 4 * 2
    assert {c.env.name for _, c in planned} == {"sokoban"}
    assert {c.seed for _, c in planned} == {0, 1}
    assert {c.train.max_minutes for _, c in planned} == {18.0}
    assert {c.init.params for _, c in planned} == {"runs/elsewhere"}
    clean_env.setenv("LOSS_T3_SEEDS", "2")
    assert len(sweep.load_study("experiments/loss_t3.py").runs) == 3 * 2
    clean_env.setenv("STALENESS_ENVS", "maze")
    with pytest.raises(ValueError, match=r"STALENESS_ENVS names \['maze'\]; allowed"):
        sweep.load_study("experiments/staleness.py")


def _rows_by_hand(c) -> int:
    """Episode rows one step computes: T x G x (1 + M x N) with M the fork slots of the rule
    (docs/methods.md, "Branching rollouts"), T x G without branching."""
    b = c.rollout.num_tasks * c.rollout.group_size
    rule = c.rollout.branch.rule
    if rule == "none":
        return b
    slots = {"every": c.rollout.max_turns, "turns": len(c.rollout.branch.turns)}
    m = slots.get(rule, c.rollout.branch.max_forks)
    assert c.rollout.branch.levels == 1
    return b * (1 + m * c.rollout.branch.num_branches)


def test_branching__rows_per_step_match_grpo_within_5_percent(clean_env):
    _, module, planned = _plan("branching_estimators")
    rows = {}
    for _, c in planned:
        n = _rows_by_hand(c)
        bc = branch_lib.BranchConfig(
            rule=c.rollout.branch.rule,
            num_branches=c.rollout.branch.num_branches,
            turns=tuple(c.rollout.branch.turns),
            max_forks=c.rollout.branch.max_forks,
        )
        if c.rollout.branch.rule != "none":
            b = c.rollout.num_tasks * c.rollout.group_size
            assert bc.num_rows(b, c.rollout.max_turns) == n  # the library's count agrees
        assert rows.setdefault((c.env.name, c.credit.name), n) == n
    # Hand-derived: 16 x 16; vineppo 14 x 2 x (1 + 8) and 10 x 2 x (1 + 12); tree_grpo and
    # arpo 13 x 4 x (1 + 2 x 2).
    assert rows == {
        ("frozen_lake", "grpo"): 256,
        ("frozen_lake", "vineppo"): 252,
        ("frozen_lake", "tree_grpo"): 260,
        ("frozen_lake", "arpo"): 260,
        ("sokoban", "grpo"): 256,
        ("sokoban", "vineppo"): 260,
        ("sokoban", "tree_grpo"): 260,
        ("sokoban", "arpo"): 260,
    }
    for (env, credit), n in rows.items():
        base = rows[(env, "grpo")]
        assert base == module.BASELINE_ROWS
        assert abs(n - base) <= module.ROWS_TOLERANCE * base, (env, credit, n)
    rules = {c.credit.name: c.rollout.branch.rule for _, c in planned}
    assert rules == {"grpo": "none", "vineppo": "every", "tree_grpo": "turns", "arpo": "arpo"}


def _diffs(planned, baseline_of) -> dict:
    """variant -> the config keys in which its runs differ from the baseline run of the same
    environment and seed (one set per variant, checked equal across its runs)."""
    base = {(c.env.name, c.seed): c.to_dict() for run, c in planned if baseline_of(run)}
    out = {}
    for run, c in planned:
        diff = sweep.config_diff(base[(c.env.name, c.seed)], c.to_dict())
        keys = {d.split(":")[0] for d in diff}
        assert out.setdefault(run.variant[1:], keys) == keys, (run.name, keys)
    return out


def test_losses_filters__each_variant_changes_only_its_keys(clean_env):
    _, _, planned = _plan("losses_filters")

    def baseline(run):
        return "loss.policy=ppo_clip" in run.variant

    diffs = _diffs(planned, baseline)
    assert diffs == {
        ("loss.policy=ppo_clip",): set(),
        ("loss.policy=sapo",): {"loss.policy", "loss.sapo.agg"},
        ("sampling.filter=top_p_variance",): {"sampling.filter"},
        ("sampling.filter=void_turn",): {"sampling.filter"},
        ("loss.epo_coef=0.05",): {"loss.epo_coef"},
    }
    for _, c in planned:
        assert c.train.minibatches == 4 and c.loss.ppo_clip.agg == "token-mean"
        assert c.loss.policy != "sapo" or c.loss.sapo.agg == "token-mean"
        assert c.sampling.top_p_variance.p == 0.9


def test_staleness__k_and_every_registered_correction(clean_env):
    _, _, planned = _plan("staleness")
    variants = set()
    for _, c in planned:
        assert c.loss.policy == "ppo_clip" and c.train.minibatches == 1
        fix = "tis" if c.loss.tis_cap > 0 else c.mismatch.name
        assert not (c.loss.tis_cap > 0 and c.mismatch.name != "none")
        variants.add((c.env.name, c.train.staleness, fix))
    per_env = {(k, fix) for _, k, fix in variants}
    # Every registered correction at k = 4 but sequence MIS (the study takes the token rule).
    corrections = set(losses.mismatch.names()) - {"mis_sequence"}
    assert corrections == {"mis_token", "icepop", "m2po"}
    assert per_env == {(0, "none"), (2, "none"), (4, "none"), (4, "tis")} | {
        (4, name) for name in corrections
    }
    assert {env for env, _, _ in variants} == {"frozen_lake", "sokoban"}
    assert {c.loss.tis_cap for _, c in planned} == {0.0, 2.0}


def test_loss_t3__three_losses_differ_only_in_the_loss(clean_env):
    _, module, planned = _plan("loss_t3")

    def baseline(run):
        return "loss.policy=ppo_clip" in run.variant

    diffs = _diffs(planned, baseline)
    assert diffs == {
        ("loss.policy=ppo_clip",): set(),
        ("loss.policy=cispo", "loss.cispo.ratio_high=None"): {
            "loss.policy",
            "loss.cispo.ratio_high",
        },
        ("loss.policy=cispo", "loss.cispo.ratio_high=5.0"): {"loss.policy"},
    }
    for _, c in planned:
        assert c.env.name == "frozen_lake" and c.train.minibatches == 4
        assert c.loss.cispo.ratio_low is None and c.loss.cispo.agg == "token-mean"
        assert c.loss.ppo_clip.agg == "token-mean"
        assert module.EARLY_STEP % c.train.eval_every == 0


def test_loss_t3__unbounded_cispo_is_the_importance_sampling_gradient():
    """cispo with no bounds has the gradient of l = -rho A (token-mean), rho = exp(logp -
    logp_old); at rho = 1 ppo_clip, cispo and IS give the same gradient (so the study needs
    several updates per batch), and off it they differ."""
    rng = np.random.default_rng(0)
    logp_old = jnp.asarray(-rng.uniform(0.1, 2.0, (3, 5)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(3, 5)) < 0.7)
    n = float(mask.sum())

    def grad_of(name, logp, **kw):
        fn = losses.get(name)
        return jax.grad(lambda lp: fn(lp, logp_old, adv, mask, **kw)[0])(logp)

    def is_grad(logp):  # d/dlogp of (1/n) sum_mask -exp(logp - logp_old) A, by hand
        return jnp.where(mask, -jnp.exp(logp - logp_old) * adv / n, 0.0)

    shifted = logp_old + jnp.asarray(rng.uniform(-0.6, 0.6, (3, 5)), jnp.float32)
    for logp in (logp_old, shifted):
        g = grad_of("cispo", logp, ratio_high=None)
        np.testing.assert_allclose(g, is_grad(logp), rtol=1e-5, atol=1e-7)
    same = [grad_of("ppo_clip", logp_old), grad_of("cispo", logp_old, ratio_high=5.0)]
    for g in same:
        np.testing.assert_allclose(g, is_grad(logp_old), rtol=1e-5, atol=1e-7)
    assert not np.allclose(grad_of("ppo_clip", shifted), is_grad(shifted), atol=1e-4)


def _fake_run(root, run, *, final, curve, finished=True):
    d = root / run.dirname
    d.mkdir(parents=True)
    summary = {"finished": finished, "steps": 60}
    if final is not None:
        summary["eval_test"] = {"greedy_success": final}
    (d / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": s, "eval_test/greedy_success": v} for s, v in curve.items()]
    rows.insert(1, {"step": 30, "train/success": 0.5})  # a train row at the same step
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"name": run.name, "dir": run.dirname, "variant": list(run.variant), "seed": run.seed}


def test_loss_t3__seed_spread_by_hand(clean_env, tmp_path, capsys):
    clean_env.setenv("LOSS_T3_SEEDS", "3")
    study = sweep.load_study("experiments/loss_t3.py")
    module = config_utils.load_module("experiments/loss_t3.py", "study_loss_t3")
    # per variant (in plan order: is, ppo, cispo): per seed (final, success at step 30)
    values = [
        [(0.8, 0.2), (0.6, 0.6), (0.7, 0.4)],
        [(0.7, 0.5), (0.7, 0.5), (0.75, 0.45)],
        [(0.7, 0.3), (None, 0.5), (0.9, None)],  # seed 1 unfinished, seed 2 lacks step 30
    ]
    plan = []
    for run in study.runs:
        final, early = values[len(plan) // 3][run.seed]
        curve = {15: 0.1, 30: early, 45: 0.9} if early is not None else {15: 0.1, 45: 0.9}
        plan.append(_fake_run(tmp_path, run, final=final, curve=curve, finished=final is not None))
    (tmp_path / "sweep.json").write_text(json.dumps({"study": "loss_t3", "runs": plan}))
    rows = module.seed_spread(str(tmp_path), 30)
    assert [r["variant"] for r in rows] == [
        "loss.policy=cispo, loss.cispo.ratio_high=None",
        "loss.policy=ppo_clip",
        "loss.policy=cispo, loss.cispo.ratio_high=5.0",
    ]
    is_row, ppo_row, cispo_row = rows
    # is: finals 0.8, 0.6, 0.7 -> mean 0.7, std 0.1; early 0.2, 0.6, 0.4 -> mean 0.4, std 0.2
    assert is_row["seeds"] == 3 and is_row["early_seeds"] == 3
    assert math.isclose(is_row["final_mean"], 0.7) and math.isclose(is_row["final_std"], 0.1)
    assert math.isclose(is_row["early_mean"], 0.4) and math.isclose(is_row["early_std"], 0.2)
    # ppo: finals 0.7, 0.7, 0.75 -> std sqrt(((-1/60)^2 * 2 + (1/30)^2) / 2) = 0.0288675
    assert math.isclose(ppo_row["final_std"], 0.05 / math.sqrt(3), rel_tol=1e-9)
    assert math.isclose(ppo_row["early_std"], 0.05 / math.sqrt(3), rel_tol=1e-9)
    # cispo: finals of the finished seeds 0.7, 0.9; early of the seeds that logged it 0.3, 0.5
    assert cispo_row["seeds"] == 2 and cispo_row["early_seeds"] == 2
    assert math.isclose(cispo_row["final_mean"], 0.8)
    assert math.isclose(cispo_row["final_std"], math.sqrt(0.02))
    assert math.isclose(cispo_row["early_std"], math.sqrt(0.02))
    md = module.markdown(rows, 30).splitlines()
    assert md[2] == (
        "| loss.policy=cispo, loss.cispo.ratio_high=None | 3 | 0.700 | 0.100 | 0.400 | 0.200 | 3 |"
    )
    assert module.main([f"--sweep={tmp_path}", "--early=30"]) == 0
    assert capsys.readouterr().out.splitlines() == md
    assert module.main([f"--sweep={tmp_path / 'nope'}"]) == 2
    assert "holds no sweep.json" in capsys.readouterr().err


def _echo_rows(zero_after=30, entropy_after=40, success_after=50):
    """Metrics rows of steps 1-60: the share of zero-variance groups 0.5 then 1.0, entropy
    1.0 then 0.2, batch success 0.3 then 0.1 (each switching after the given step), no reward
    std; held-out greedy success 0.3, 0.28, 0.24 at steps 0, 20, 40."""
    rows = [{"step": 0, "eval_test/greedy_success": 0.3}]
    for s in range(1, 61):
        rows.append(
            {
                "step": s,
                "train/zero_std_groups": 0.5 if s <= zero_after else 1.0,
                "train/entropy": 1.0 if s <= entropy_after else 0.2,
                "train/success": 0.3 if s <= success_after else 0.1,
            }
        )
        if s in (20, 40):
            rows.append({"step": s, "eval_test/greedy_success": {20: 0.28, 40: 0.24}[s]})
    return rows


def test_echo_trap__collapse_signature_by_hand(clean_env, tmp_path, capsys):
    module = config_utils.load_module("experiments/echo_trap.py", "study_echo_trap")
    sig = module.run_signature(_echo_rows(), window=10)
    # Centred means over steps s - 5 .. s + 5 (11 values), read at steps 6-55. Zero-variance
    # share at step 25 + k: (k + 0.5 (11 - k)) / 11 reaches 0.8 first at k = 7.
    assert sig["zero_std_step"] == 32
    assert (sig["zero_std_start"], sig["zero_std_end"]) == (0.5, 1.0)
    # Entropy: the first window (step 6) is 1.0, so the limit is 0.5; at step 35 + k the mean
    # is (11 - 0.8 k) / 11 <= 0.5 first at k = 7 (0.491; k = 6 gives 0.564).
    assert sig["entropy_step"] == 42
    assert sig["entropy_start"] == 1.0 and math.isclose(sig["entropy_end"], 0.2)
    # Batch success: peak 0.3, fallen at 0.25; at step 45 + k, (3.3 - 0.2 k) / 11 is 0.245 at
    # k = 3 (0.264 at k = 2).
    assert sig["train_fall_step"] == 48
    # Held-out greedy: 0.3 at step 0, fallen at <= 0.25: step 40 (0.24; 0.28 at 20 is not).
    assert (sig["greedy_fall_step"], sig["greedy_prev_step"]) == (40, 20)
    assert (sig["greedy_start"], sig["greedy_min"], sig["greedy_last"]) == (0.3, 0.24, 0.24)
    assert sig["reward_std_step"] is None and sig["steps"] == 60
    # A window of 1 reads the raw values: the first step after each switch.
    raw = module.run_signature(_echo_rows(), window=1)
    assert (raw["zero_std_step"], raw["entropy_step"], raw["train_fall_step"]) == (31, 41, 51)
    # A series that starts at 0 has no collapse to find.
    flat = [{**r, "train/reward_std": 0.0} for r in _echo_rows() if "train/success" in r]
    assert module.run_signature(flat, window=10)["reward_std_step"] is None

    # A sweep folder: two complete grpo runs and an unfinished critic run.
    clean_env.setenv("ECHO_ENVS", "countdown")
    clean_env.setenv("ECHO_SEEDS", "2")
    study = sweep.load_study("experiments/echo_trap.py")
    plan = []
    for run in study.runs:
        grpo = run.variant == ("countdown,grpo",) and run.seed == 0
        if not (grpo or "ppo_gae" in run.name):
            continue
        d = tmp_path / run.dirname
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"finished": grpo}))
        rows = _echo_rows(zero_after=40) if grpo else _echo_rows()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        plan.append(
            {"dir": run.dirname, "variant": list(run.variant), "env": "countdown", "seed": run.seed}
        )
    (tmp_path / "sweep.json").write_text(json.dumps({"study": "echo_trap", "runs": plan}))
    runs = module.signature(str(tmp_path), window=10)
    assert [(r["variant"], r["seed"], r["complete"]) for r in runs] == [
        ("grpo", 0, True),
        ("ppo_gae", 0, False),
        ("ppo_gae", 1, False),
    ]
    assert runs[0]["zero_std_step"] == 42  # 35 + 7
    md = module.summary_markdown(runs).splitlines()
    assert len(md) == 3  # header, rule, grpo: unfinished runs are left out of the summary
    # Variance at step 42: before batch success fell (48), after the evaluation at step 40
    # that saw greedy success fall (from the one at 20): "0 / 0 / 1".
    assert md[2] == (
        "| countdown | grpo | 1 | 42 (1/1) | 42 (1/1) | never | 48 (1/1) | 40 (1/1) | 1/1 "
        "| 0 / 0 / 1 | 0.300 -> 0.240 |"
    )
    late = {**runs[0], "greedy_prev_step": 40, "greedy_fall_step": 60}
    early = {**runs[0], "greedy_prev_step": 45, "greedy_fall_step": 50}
    assert module._before_greedy([late, early, {**early, "zero_std_step": None}]) == "1 / 1 / 1"
    out = tmp_path / "out"
    assert module.main([f"--sweep={tmp_path}", f"--out={out}", "--window=10"]) == 0
    assert capsys.readouterr().out.splitlines() == md
    assert (out / "signature.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "signature.md").read_text().splitlines() == md
    assert len(list(csv.DictReader(open(out / "signature.csv")))) == 3
    assert module.main([f"--sweep={tmp_path / 'nope'}"]) == 2
    assert "holds no sweep.json" in capsys.readouterr().err


def test_at_grpo_roles__credit_and_role_sets_only(clean_env):
    _, module, planned = _plan("at_grpo_roles")
    base = {c.seed: c.to_dict() for run, c in planned if run.variant == ("two_agent,grpo",)}
    diffs = collections.defaultdict(set)
    for run, c in planned:
        diff = sweep.config_diff(base[c.seed], c.to_dict())
        diffs[run.variant].add(frozenset(d.split(":")[0] for d in diff))
    assert diffs == {
        ("two_agent,grpo",): {frozenset()},
        ("two_agent,at_grpo",): {frozenset({"credit.name"})},
        ("two_agent,at_grpo", "model.role_params=2"): {
            frozenset({"credit.name", "model.role_params"})
        },
    }
    for _, c in planned:
        assert c.env.name == "two_agent" and c.train.num_steps == 150
        assert c.train.eval_tasks == module.EVAL_TASKS
    clean_env.setenv("AT_GRPO_SEEDS", "2")
    clean_env.setenv("AT_GRPO_MINUTES", "5")
    _, _, planned = _plan("at_grpo_roles")
    assert len(planned) == 3 * 2 and {c.train.max_minutes for _, c in planned} == {5.0}


def test_credit_v2__stage_one_every_rate_at_a_fixed_number_of_steps(clean_env):
    study, module, planned = _plan("credit_v2")
    assert len(planned) == 6 * 2 * 3
    cells = collections.defaultdict(set)
    for _, c in planned:
        cells[(c.env.name, c.credit.name)].add(c.optim.lr)
        assert c.seed == 0 and c.init.params == base_policy.CHECKPOINT
        assert (c.train.eval_seed, c.train.eval_tasks, c.train.final_eval_tasks) == (
            1234,
            256,
            1024,
        )
        assert c.train.eval_at_start  # every curve starts at the base policy
        # Every variant makes the same number of updates: no wall-clock limit.
        assert (c.train.num_steps, c.train.max_minutes) == (module.STEPS[c.env.name], 0.0)
        assert c.rollout.temperature == 1.0
        assert (c.loss.ppo_clip.agg == "seq-mean-token-mean") == (c.env.name == "maze")
        # maze at the 8 x 8 batch with which GRPO learned it; sokoban at its default
        batch = (c.rollout.num_tasks, c.rollout.group_size)
        assert batch == ((8, 8) if c.env.name == "maze" else (16, 16)), (c.env.name, batch)
        critic = c.credit.name in ("ppo_gae", "turn_gae")
        assert (c.model.value_head == "separate") == critic, c.credit.name
        assert (c.init.critic == "policy") == critic
    assert {env for env, _ in cells} == {"sokoban", "maze"}
    assert {v for _, v in cells} == {"grpo", "rloo", "ppo_gae", "turn_gae", "gigpo", "empg"}
    assert set(map(frozenset, cells.values())) == {frozenset({1e-4, 3e-4, 1e-3})}
    assert len({r.dirname for r in study.runs}) == len(study.runs)
    # The analysis command's --strip leaves the variant names lr_sweep.csv is keyed by.
    labels = results.short_labels([r.variant for r in study.runs])
    rows = {make_table_split(re.sub(r"^[a-z_]+,", "", label)) for label in labels}
    assert {v for v, _ in rows} == set(module.VARIANTS)
    clean_env.setenv("CREDIT_V2_STAGE", "tuning")
    with pytest.raises(ValueError, match=r"CREDIT_V2_STAGE='tuning'; allowed: one of"):
        _plan("credit_v2")


def make_table_split(label: str) -> tuple[str, str]:
    """("grpo", "0.001") for "grpo, optim.lr=0.001", as scripts/make_table.py splits labels."""
    variant, lr = label.split(", optim.lr=")
    return variant, lr


def test_credit_v2__stage_two_adds_seeds_at_the_chosen_rate_and_keeps_stage_one(
    clean_env, tmp_path
):
    study1, module, _ = _plan("credit_v2")
    lines = ["env,variant,lr,metric,selected"]
    for env in module.ENVS:
        for i, variant in enumerate(module.VARIANTS):
            for j, lr in enumerate(("0.0001", "0.0003", "0.001")):
                lines.append(f"{env},{variant},{lr},eval_test.greedy_success,{int(i % 3 == j)}")
    path = tmp_path / "lr_sweep.csv"
    path.write_text("\n".join(lines) + "\n")
    clean_env.setenv("CREDIT_V2_STAGE", "seeds")
    clean_env.setenv("CREDIT_V2_LR_FILE", str(path))
    study2, _, planned = _plan("credit_v2")
    # Stage 1's runs are the first of stage 2's plan, in the same directories.
    assert [r.dirname for r in study2.runs[:36]] == [r.dirname for r in study1.runs]
    later = [c for _, c in planned[36:]]
    assert len(later) == 6 * 2 * 4 and {c.seed for c in later} == {1, 2, 3, 4}
    for c in later:
        i = list(module.VARIANTS).index(c.credit.name)
        assert c.optim.lr == (1e-4, 3e-4, 1e-3)[i % 3]
    seeds = collections.defaultdict(set)
    for _, c in planned:
        if c.optim.lr == (1e-4, 3e-4, 1e-3)[list(module.VARIANTS).index(c.credit.name) % 3]:
            seeds[(c.env.name, c.credit.name)].add(c.seed)
    assert set(map(frozenset, seeds.values())) == {frozenset(range(5))}  # paired seeds
    path.write_text("env,variant,lr,selected\nsokoban,grpo,0.001,1\n")
    with pytest.raises(ValueError, match=r"chooses no learning rate for \[\('rloo', 'sokoban'\)"):
        _plan("credit_v2")


def test_gigpo_vs_grpo__web_shop_and_sokoban_paired_with_the_same_settings(clean_env):
    _, module, planned = _plan("gigpo_vs_grpo")
    assert len(planned) == 2 * 2 * 5
    runs = collections.defaultdict(dict)
    for _, c in planned:
        runs[(c.env.name, c.seed)][c.credit.name] = c.to_dict()
        lr = module.LR.get(c.env.name, module.DEFAULT_LR)
        assert (c.rollout.temperature, c.optim.lr) == (1.0, lr)
        assert c.env.household.progress_reward == 0.0
        assert (c.train.eval_tasks, c.train.final_eval_tasks) == (128, 512)
        assert c.train.eval_at_start
    assert {env for env, _ in runs} == {"web_shop", "sokoban"}
    # Seed by seed: grpo then gigpo of each seed, so a study cut short leaves complete pairs.
    order = [(c.env.name, c.seed, c.credit.name) for _, c in planned]
    assert order[:4] == [
        ("web_shop", 0, "grpo"), ("web_shop", 0, "gigpo"),
        ("web_shop", 1, "grpo"), ("web_shop", 1, "gigpo"),
    ]  # fmt: skip
    for pair in runs.values():  # the estimator and its own settings, nothing else
        diff = sweep.config_diff(pair["grpo"], pair["gigpo"])
        assert {d.split(":")[0].split(".")[0] for d in diff} == {"credit"}, diff
    clean_env.setenv("GIGPO_ENVS", "household,maze")
    _, _, planned = _plan("gigpo_vs_grpo")
    assert {c.env.name for _, c in planned} == {"household", "maze"}
    household = [c for _, c in planned if c.env.name == "household"]
    assert {c.env.household.progress_reward for c in household} == {0.1}


def test_gigpo_vs_grpo__grouped_share_by_hand(clean_env, tmp_path, capsys):
    module = config_utils.load_module("experiments/gigpo_vs_grpo.py", "study_gigpo_vs_grpo")
    study = sweep.load_study("experiments/gigpo_vs_grpo.py")
    # GiGPO seeds 0 and 1 of web_shop: 30 steps, the grouped share rising linearly from
    # 0.5 + k / 100 at step k (k = 0..29); seed 1 a constant 0.1 higher; group size 2 then 4.
    # A grpo run (no anchor groups) and an unfinished GiGPO run (seed 2) are left out.
    plan = []
    for run in study.runs:
        gigpo = run.variant[0].endswith("gigpo")
        if run.variant[0].split(",")[0] != "web_shop" or run.seed > 2 or (not gigpo and run.seed):
            continue
        d = tmp_path / run.dirname
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"finished": run.seed < 2}))
        rows = [{"step": 0, "eval_test/greedy_success": 0.1}]
        for k in range(30):
            row = {"step": k + 1, "train/success": 0.1}
            if gigpo:
                row["train/frac_steps_grouped"] = 0.5 + k / 100 + 0.1 * run.seed
                row["train/step_group_size"] = 2.0 if k < 15 else 4.0
                row["train/frac_groups_singleton"] = 0.25
            rows.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        plan.append({"dir": run.dirname, "variant": list(run.variant), "env": "web_shop"})
    assert len(plan) == 4
    (tmp_path / "sweep.json").write_text(json.dumps({"study": "gigpo_vs_grpo", "runs": plan}))
    (row,) = module.grouped_share(str(tmp_path), edge=10)
    assert (row["env"], row["runs"]) == ("web_shop", 2)
    # Seed 0: mean of 0.50..0.79 = 0.645, first ten 0.545, last ten 0.745; seed 1 each + 0.1.
    assert math.isclose(row["grouped"], 0.695) and math.isclose(row["grouped_std"], 0.1 / 2**0.5)
    assert math.isclose(row["grouped_early"], 0.595)
    assert math.isclose(row["grouped_late"], 0.795)
    assert (row["group_size"], row["group_size_early"], row["group_size_late"]) == (3.0, 2.0, 4.0)
    assert row["group_size_std"] == 0.0 and row["singleton_groups"] == 0.25
    md = module.grouped_markdown([row], 10).splitlines()
    assert md[2] == (
        "| web_shop | 2 | 0.695 ± 0.071 | 0.595 ± 0.071 | 0.795 ± 0.071 | 3.000 ± 0.000 "
        "| 2.000 ± 0.000 | 4.000 ± 0.000 | 0.250 ± 0.000 | 0.250 ± 0.000 | 0.250 ± 0.000 |"
    )
    out = tmp_path / "out"
    assert module.main([f"--sweep={tmp_path}", f"--out={out}", "--edge=10"]) == 0
    assert capsys.readouterr().out.splitlines() == md
    assert (out / "grouped.md").read_text().splitlines() == md
    assert module.main([f"--sweep={tmp_path / 'nope'}"]) == 2
    assert "holds no sweep.json" in capsys.readouterr().err


def test_learning_base_v5__every_env_from_v5_at_half_temperature_with_v3_overrides(monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in ("BASE_POLICY", "V5_ENVS", "V5_TEMPERATURE", "V5_SEEDS"):
        monkeypatch.delenv(var, raising=False)
    study, _, planned = _plan("learning_base_v5")
    assert len(planned) == 10 * 3
    by_env = collections.defaultdict(set)
    for _, c in planned:
        by_env[c.env.name].add(c.seed)
        assert c.init.params == "runs/base_policy_v5"
        assert c.rollout.temperature == 0.5
        assert c.train.max_minutes == 18.0
    assert set(by_env) == {
        "frozen_lake", "maze", "wordle", "countdown", "sokoban",
        "search_qa", "two_agent", "web_shop", "terminal", "household",
    }  # fmt: skip
    assert all(seeds == {0, 1, 2} for seeds in by_env.values())
    terminal = [c for _, c in planned if c.env.name == "terminal"]
    assert {c.optim.lr for c in terminal} == {3e-5}
    assert {c.env.terminal.invalid_penalty for c in terminal} == {0.0}
    monkeypatch.setenv("V5_ENVS", "maze")
    monkeypatch.setenv("V5_TEMPERATURE", "1")
    monkeypatch.setenv("V5_SEEDS", "5")
    more, _, planned = _plan("learning_base_v5")
    assert {(c.env.name, c.rollout.temperature) for _, c in planned} == {("maze", 1.0)}
    assert {c.seed for _, c in planned} == set(range(5))
    first = {r.dirname for r in study.runs if "maze" in r.dirname}
    assert len(first) == 3 and first <= {r.dirname for r in more.runs}  # the same directories


def test_echo_trap__the_v5_learning_runs_with_fixed_steps_minibatches_and_one_remedy_each(
    clean_env,
):
    study, module, planned = _plan("echo_trap")
    # Where the trap was seen: frozen_lake in the v5 learning study at temperature 0.5,
    # countdown in the 8 x 8 recipe's pilot at temperature 1.
    _, _, v5 = _plan("learning_base_v5")
    clean_env.setenv("RECIPE_ENVS", "countdown")
    _, _, pilot = _plan("learning_recipes")
    start = {(c.env.name, c.seed): c.to_dict() for _, c in v5 if c.env.name != "countdown"}
    start |= {(c.env.name, c.seed): c.to_dict() for _, c in pilot}
    runs = collections.defaultdict(dict)
    labels = _labels(study, module.STRIP)
    for (_, c), label in zip(planned, labels, strict=True):
        runs[(c.env.name, c.seed)][label] = c
        assert c.train.minibatches == 4 and c.log.collapse_metrics and c.log.mi_proxy
        countdown = c.env.name == "countdown"
        assert c.rollout.temperature == (1.0 if countdown else 0.5)
        assert (c.rollout.num_tasks, c.rollout.group_size) == ((8, 8) if countdown else (16, 16))
        assert c.train.final_eval_tasks == 512
        assert (c.train.num_steps, c.train.max_minutes) == (module.STEPS[c.env.name], 0.0)
    assert {env for env, _ in runs} == {"countdown", "frozen_lake"}
    assert all(len(variants) == 4 for variants in runs.values()), runs.keys()
    # Seed by seed: the first four runs are seed 0 of every variant of the first environment.
    assert [c.seed for _, c in planned[:8]] == [0] * 4 + [1] * 4
    expected = {  # what each remedy changes against grpo, as config key prefixes
        "top_p_variance": {"sampling.filter"},
        "0.28": {"loss.ppo_clip.clip_high"},
        "ppo_gae": {"credit", "model.value_head", "init.critic"},
    }
    for (env, seed), variants in runs.items():
        grpo = variants["grpo"].to_dict()
        # The baseline is the trap run's seed with the shared changes (and countdown's in-run
        # evaluation every 40 steps instead of the pilot's 60).
        diff = {d.split(":")[0] for d in sweep.config_diff(start[(env, seed)], grpo)}
        assert diff == {
            "train.num_steps",
            "train.max_minutes",
            "train.minibatches",
            "train.final_eval_tasks",
            "train.eval_at_start",
            "log.collapse_metrics",
            "log.mi_proxy",
        } | ({"train.eval_every"} if env == "countdown" else set()), diff
        for label, c in variants.items():
            if label == "grpo":
                continue
            (prefixes,) = [v for k, v in expected.items() if k in label]
            diff = {d.split(":")[0] for d in sweep.config_diff(grpo, c.to_dict())}
            assert diff and all(any(d.startswith(p) for p in prefixes) for d in diff), diff
    clean_env.setenv("ECHO_ENVS", "frozen_lake")
    clean_env.setenv("ECHO_SEEDS", "5")
    _, _, planned = _plan("echo_trap")
    assert len(planned) == 4 * 5 and {c.env.name for _, c in planned} == {"frozen_lake"}


@pytest.mark.parametrize(
    "recipe,env",
    [
        ("batch8x8", None),
        ("minibatch4", None),
        ("progress", None),
        ("seqmean", "web_shop"),
        ("nopenalty", None),
        ("sparse", "wordle"),
        ("lr1e-4", "two_agent"),
        ("bonus", "web_shop"),
        ("lr1e-4+bonus", "web_shop"),
        ("remax", "countdown"),
        ("topp0.7", "web_shop"),
    ],
)
def test_learning_recipes__the_temperature_1_runs_with_one_change(recipe, env, clean_env):
    clean_env.setenv("RECIPE", recipe)
    if env:
        clean_env.setenv("RECIPE_ENVS", env)
    _, _, planned = _plan("learning_recipes")
    clean_env.setenv("V5_TEMPERATURE", "1")
    _, _, v5 = _plan("learning_base_v5")
    v5 = {(c.env.name, c.seed): c.to_dict() for _, c in v5}
    env = env or "maze"  # the default of RECIPE_ENVS
    assert {(c.env.name, c.seed) for _, c in planned} == {(env, s) for s in range(3)}
    expected = {
        "batch8x8": {
            "rollout.num_tasks",
            "rollout.group_size",
            "train.num_steps",
            "train.eval_every",
        },
        "minibatch4": {"train.minibatches"},
        "progress": {"env.maze.progress_reward"},
        "seqmean": {"loss.ppo_clip.agg"},
        "nopenalty": {"env.maze.invalid_penalty"},
        "sparse": {"env.wordle.invalid_penalty", "loss.entropy_coef"},
        "lr1e-4": {"optim.lr"},
        "bonus": {"env.web_shop.success_bonus"},
        "lr1e-4+bonus": {"optim.lr", "env.web_shop.success_bonus"},
        "remax": {"credit.name"},
        "topp0.7": {"rollout.top_p"},
    }[recipe]
    for _, c in planned:
        diff = {d.split(":")[0] for d in sweep.config_diff(v5[(c.env.name, c.seed)], c.to_dict())}
        assert diff == expected, diff
    clean_env.setenv("RECIPE_ENVS", "frozen_lake")
    clean_env.setenv("RECIPE_SEEDS", "1")
    if "bonus" in recipe:
        with pytest.raises(ValueError, match="RECIPE='bonus' on 'frozen_lake'; allowed: web_shop"):
            _plan("learning_recipes")
        return
    _, _, planned = _plan("learning_recipes")
    assert [(c.env.name, c.seed) for _, c in planned] == [("frozen_lake", 0)]
    if recipe == "lr1e-4":
        assert {c.optim.lr for _, c in planned} == {1e-4}
    if recipe == "topp0.7":
        assert {c.rollout.top_p for _, c in planned} == {0.7}
    for bad in ("bigger", "lr0", "lr-1e-4", "topp1", "topp0", "topp1.5"):
        clean_env.setenv("RECIPE", bad)
        with pytest.raises(ValueError, match=f"RECIPE='{bad}'; allowed"):
            _plan("learning_recipes")
    clean_env.setenv("RECIPE", "lr1e-4+lr3e-5")
    with pytest.raises(ValueError, match=r"RECIPE='lr1e-4\+lr3e-5' sets \['optim.lr'\] twice"):
        _plan("learning_recipes")


def test_learning_recipes__fresh_seeds_from_recipe_seed0_with_the_same_settings(clean_env):
    clean_env.setenv("RECIPE", "lr1e-4")
    clean_env.setenv("RECIPE_ENVS", "countdown")
    _, _, first = _plan("learning_recipes")
    clean_env.setenv("RECIPE_SEED0", "3")
    clean_env.setenv("RECIPE_SEEDS", "5")
    study, _, fresh = _plan("learning_recipes")
    assert [c.seed for _, c in first] == [0, 1, 2]
    assert [c.seed for _, c in fresh] == [3, 4, 5, 6, 7]
    assert {r.name for r in study.runs}.isdisjoint({r.name for r, _ in first})
    base = first[0][1].to_dict()
    for _, c in fresh:  # the seed is all that differs
        assert sweep.config_diff(base, c.to_dict()) == [f"seed: 0 -> {c.seed}"]
    clean_env.setenv("RECIPE_SEED0", "-1")
    with pytest.raises(ValueError, match=r"RECIPE_SEED0=-1; allowed: >= 0"):
        _plan("learning_recipes")


def test_learning_recipes__a_recipe_that_repeats_a_setting_is_refused(clean_env):
    clean_env.setenv("RECIPE", "seqmean")  # maze's settings already aggregate per episode
    with pytest.raises(
        ValueError, match=r"RECIPE='seqmean' would not change \['loss.ppo_clip.agg'\] on maze"
    ):
        _plan("learning_recipes")
    clean_env.setenv("RECIPE", "nopenalty")  # countdown's settings already have no penalty
    clean_env.setenv("RECIPE_ENVS", "wordle,countdown")
    with pytest.raises(ValueError, match="RECIPE='nopenalty' would not change .* on countdown"):
        _plan("learning_recipes")


def test_learning_recipes__a_temperature_suffix_pairs_with_the_v5_runs_at_that_temperature(
    clean_env,
):
    clean_env.setenv("RECIPE", "batch8x8_t0.5")
    clean_env.setenv("RECIPE_ENVS", "search_qa,wordle")
    _, _, planned = _plan("learning_recipes")
    clean_env.setenv("V5_TEMPERATURE", "0.5")
    clean_env.setenv("V5_ENVS", "search_qa,wordle")
    _, _, v5 = _plan("learning_base_v5")
    v5 = {(c.env.name, c.seed): c.to_dict() for _, c in v5}
    assert sorted((c.env.name, c.seed) for _, c in planned) == sorted(v5)
    for _, c in planned:
        assert c.rollout.temperature == 0.5
        diff = {d.split(":")[0] for d in sweep.config_diff(v5[(c.env.name, c.seed)], c.to_dict())}
        # the in-run evaluation interval differs only where v5's is not already 60 steps
        assert {"rollout.num_tasks", "rollout.group_size", "train.num_steps"} <= diff, diff
        assert diff <= {
            "rollout.num_tasks",
            "rollout.group_size",
            "train.num_steps",
            "train.eval_every",
        }, diff
    clean_env.setenv("RECIPE", "batch8x8_t0")
    with pytest.raises(ValueError, match="temperature 0.0 must be > 0"):
        _plan("learning_recipes")
