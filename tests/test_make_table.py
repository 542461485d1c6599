"""make_table's statistics: t intervals over seeds, paired differences with their p-values,
areas under learning curves, episodes to a success level, the learning-rate choice, and
`results.paired_bootstrap_ci`. Expected numbers are derived by hand in the comments."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from rl4agents import results
from tests.scripts import load_script

# t_{0.975, 2}: for df = 2, P(|T| <= t) = t / sqrt(2 + t^2) = L gives t = L sqrt(2 / (1 - L^2)).
T2 = 0.95 * math.sqrt(2.0 / (1.0 - 0.95**2))  # 4.3026527...


def _make_table():
    return load_script("make_table")


# The t distribution.


def test_t_two_sided__closed_forms_for_one_and_two_degrees_of_freedom():
    for t in (0.0, 0.5, 1.0, 3.0, 40.0):
        assert results.t_two_sided(t, 1) == pytest.approx(2.0 / math.pi * math.atan(t))
        assert results.t_two_sided(-t, 2) == pytest.approx(t / math.sqrt(2.0 + t * t))
    # df = 3: 2/pi (theta + sin(theta) cos(theta)), theta = atan(t / sqrt(3)); t = sqrt(3):
    # theta = pi/4, so 2/pi (pi/4 + 1/2) = 1/2 + 1/pi.
    assert results.t_two_sided(math.sqrt(3.0), 3) == pytest.approx(0.5 + 1.0 / math.pi)
    assert results.t_two_sided(math.inf, 4) == 1.0
    with pytest.raises(ValueError, match=r"df=0; allowed: an integer >= 1"):
        results.t_two_sided(1.0, 0)


def test_t_quantile__hand_values_and_scipy():
    assert results.t_quantile(0.95, 2) == pytest.approx(T2, rel=1e-12)
    assert results.t_quantile(0.95, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    with pytest.raises(ValueError, match=r"level=1.0; allowed: 0 < level < 1"):
        results.t_quantile(1.0, 3)
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 9, 30, 101, 1000):
        for level in (0.5, 0.9, 0.95, 0.99):
            expected = stats.t.ppf(0.5 + level / 2.0, df)
            assert results.t_quantile(level, df) == pytest.approx(expected, rel=1e-9)
        for t in (0.3, 1.7, 6.0):
            assert results.t_two_sided(t, df) == pytest.approx(1 - 2 * stats.t.sf(t, df), abs=1e-12)


# Intervals and tests over seeds.


def test_t_interval__three_seeds_by_hand():
    # mean 0.7, s = 0.1, half width = t_{0.975,2} * 0.1 / sqrt(3).
    iv = results.t_interval([0.6, 0.7, 0.8])
    half = T2 * 0.1 / math.sqrt(3.0)
    assert iv.n == 3 and iv.mean == pytest.approx(0.7)
    assert (iv.low, iv.high) == pytest.approx((0.7 - half, 0.7 + half))
    assert results.t_interval([0.4, None, float("nan")]) == results.Interval(0.4, None, None, 1)
    assert results.t_interval([]) is None


def test_paired_t_p__three_seeds_by_hand():
    # d = (0.1, 0.2, 0.3): mean 0.2, s = 0.1, t = 0.2 / (0.1 / sqrt 3) = 2 sqrt 3 on 2 df:
    # p = 1 - t / sqrt(2 + t^2) = 1 - sqrt(12 / 14).
    assert results.paired_t_p([0.1, 0.2, 0.3]) == pytest.approx(1.0 - math.sqrt(12.0 / 14.0))
    # d = (0.1, 0.2, 0.2): mean 1/6, s = 1/sqrt(300), t = 5: p = 1 - 5 / sqrt(27).
    assert results.paired_t_p([0.1, 0.2, 0.2]) == pytest.approx(1.0 - 5.0 / math.sqrt(27.0))
    assert results.paired_t_p([0.5]) is None
    assert results.paired_t_p([0.1, 0.1]) == 0.0 and results.paired_t_p([0.0, 0.0]) == 1.0


def test_sign_flip_p__enumerated_by_hand():
    # |sum| over the 8 sign patterns of (0.1, 0.2, 0.3): 0.6, 0, 0.2, 0.4, 0.4, 0.2, 0, 0.6.
    assert results.sign_flip_p([0.1, 0.2, 0.3]) == 2 / 8  # observed 0.6: two patterns
    assert results.sign_flip_p([0.1, -0.2, 0.3]) == 6 / 8  # observed 0.2: six patterns
    assert results.sign_flip_p([0.0, 0.0]) == 1.0
    assert results.sign_flip_p([]) is None
    # Past SIGN_FLIP_EXACT seeds: random patterns, p = (1 + hits) / (1 + draws); only the
    # two all-equal patterns reach the observed mean of 17 equal differences.
    p = results.sign_flip_p([1.0] * 17, draws=4096, seed=3)
    assert 1 / 4097 <= p < 0.01


def test_detectable_difference__normal_by_hand_and_power_checked_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    # Normal: half-width 0.028 -> se = 0.028 / 1.959964 = 0.0142860; (1.959964 + 0.841621) se.
    mde = results.detectable_difference(-0.0033, 0.0527)
    assert mde == pytest.approx((1.959964 + 0.841621) * 0.028 / 1.959964, abs=1e-6)
    assert mde == pytest.approx(0.040024, abs=1e-6)
    se = 0.028 / 1.959964
    z = stats.norm.ppf(0.975)
    power = stats.norm.sf(z - mde / se) + stats.norm.cdf(-z - mde / se)
    assert power == pytest.approx(0.8, abs=1e-4)
    # Student's t on 4 df: (t_.975 + t_.8) se with scipy's quantiles; the noncentral t gives a
    # power a little under 0.8 at that difference (the formula's known approximation).
    low, high = 0.1, 0.3
    mde = results.detectable_difference(low, high, df=4)
    t975, t80 = stats.t.ppf(0.975, 4), stats.t.ppf(0.8, 4)
    se = 0.1 / t975
    assert mde == pytest.approx((t975 + t80) * se, rel=1e-9)
    nc = mde / se
    power = stats.nct.sf(t975, 4, nc) + stats.nct.cdf(-t975, 4, nc)
    assert 0.74 < power < 0.8
    assert results.detectable_difference(None, 0.3) is None
    assert results.detectable_difference(0.2, 0.2, df=2) == 0.0
    with pytest.raises(ValueError, match=r"power=0.4; allowed: 0.5 < power < 1"):
        results.detectable_difference(0.0, 1.0, power=0.4)
    with pytest.raises(ValueError, match=r"allowed: high >= low"):
        results.detectable_difference(0.3, 0.1)


# Sample efficiency.


def test_curve_auc_and_first_reach__by_hand():
    # Flat 0.1 on [0, 5] (area 0.5), then 0.1 -> 0.3 on [5, 10] (area 1.0): 1.5 / 10.
    assert results.curve_auc([(10, 0.3), (5, 0.1)], 10) == pytest.approx(0.15)
    # The last value held to the budget: 0.5 + 1.0 + 0.3 * 10 = 4.5 over 20.
    assert results.curve_auc([(5, 0.1), (10, 0.3)], 20) == pytest.approx(4.5 / 20)
    assert results.curve_auc([(0, 0.4), (50, 0.4)], 50) == pytest.approx(0.4)
    assert results.curve_auc([], 10) is None
    with pytest.raises(ValueError, match=r"budget=0; allowed: > 0"):
        results.curve_auc([(1, 1.0)], 0)
    points = [(5, 0.1), (10, 0.3), (15, 0.2)]
    assert results.first_reach(points, 0.3) == 10 and results.first_reach(points, 0.31) is None
    assert results.first_reach(points, 0.15, goal="min") == 5


def test_curve_bands__t_interval_per_x():
    xs, mean, low, high, n = results.curve_bands([[(1, 0.6), (2, 1.0)], [(1, 0.7)], [(1, 0.8)]])
    half = T2 * 0.1 / math.sqrt(3.0)
    assert xs == [1, 2] and n == [3, 1] and mean == pytest.approx([0.7, 1.0])
    assert low == pytest.approx([0.7 - half, 1.0]) and high == pytest.approx([0.7 + half, 1.0])


# The paired bootstrap over seeds and tasks.


def test_paired_bootstrap_ci__tiny_cases_by_hand():
    # One seed, tasks (1, 0) against (0, 0): a replicate's mean is 0, 1/2 or 1 with
    # probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles are 0 and 1, and the 30%
    # and 70% quantiles (level 0.4) are both 1/2.
    a, b = np.array([[1.0, 0.0]]), np.zeros(2)
    assert results.paired_bootstrap_ci(a, b) == (0.5, 0.0, 1.0)
    assert results.paired_bootstrap_ci(a, b, level=0.4) == (0.5, 0.5, 0.5)
    # b per seed: seed s of a is paired with seed s of b, so equal rows give exactly 0.
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert results.paired_bootstrap_ci(a, a.copy()) == (0.0, 0.0, 0.0)
    # Two seeds, one task: d = (1, 0) per seed; resampling seeds gives 0, 1/2, 1 as above.
    a, b = np.array([[3.0], [1.0]]), np.array([[2.0], [1.0]])
    assert results.paired_bootstrap_ci(a, b, samples=4000, seed=1) == (0.5, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"b has shape \(3,\); allowed: \(1,\) or \(2, 1\)"):
        results.paired_bootstrap_ci(a, np.zeros(3))
    with pytest.raises(ValueError, match=r"a has shape \(2,\); allowed: f\[S, N\]"):
        results.paired_bootstrap_ci(np.zeros(2), np.zeros(2))


def test_paired_bootstrap_ci__matches_normal_approximation_on_large_data():
    # d[s, t] = 0.3 + u_s + v_t + e_st (seed, task and noise effects). The mean over seeds and
    # tasks has variance ~ var(seed means) / S + var(task means) / N, so the 95% interval is
    # mean +- 1.96 sqrt of that.
    rng = np.random.default_rng(0)
    num_seeds, num_tasks = 80, 400
    u = rng.normal(0.0, 0.5, (num_seeds, 1))
    v = rng.normal(0.0, 1.0, (1, num_tasks))
    d = 0.3 + u + v + rng.normal(0.0, 0.5, (num_seeds, num_tasks))
    b = rng.uniform(0.0, 1.0, num_tasks)
    mean, low, high = results.paired_bootstrap_ci(d + b, b, samples=10000, seed=0)
    se = math.sqrt(d.mean(1).var(ddof=1) / num_seeds + d.mean(0).var(ddof=1) / num_tasks)
    assert mean == pytest.approx(d.mean())
    assert (high - low) / 2 == pytest.approx(1.959964 * se, rel=0.08)
    assert (low + high) / 2 == pytest.approx(mean, abs=0.1 * se)


# make_table on a synthetic sweep.

SUCCESS = {"grpo": [0.6, 0.7, 0.8], "opo": [0.7, 0.9, 1.0]}  # per seed; diffs 0.1, 0.2, 0.2
EPISODES = 2 * 4  # rollout.num_tasks x rollout.group_size


def _run(root, name, variant, seed, success, *, lr=None, train=(0.1, 0.1), eval_seed=1234):
    """A finished run: summary.json, config.json, and metrics.jsonl with held-out success
    success / 2 at step 10 and success at step 20 (of 20), and train/success `train`."""
    d = root / name.replace("/", "__")
    d.mkdir(parents=True)
    summary = {
        "finished": True,
        "steps": 20,
        "wall_s": 5.0,
        "eval_test": {"greedy_success": success},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    config = {
        "seed": seed,
        "env": {"name": "fl"},
        "credit": {"name": variant},
        "rollout": {"num_tasks": 2, "group_size": 4},
        "train": {"num_steps": 20, "eval_seed": eval_seed, "eval_tasks": 256},
        "optim": {"lr": lr or 0.001},
    }
    (d / "config.json").write_text(json.dumps(config))
    rows = [
        {"step": 10, "eval_test/greedy_success": success / 2, "train/success": train[0]},
        {"step": 20, "eval_test/greedy_success": success, "train/success": train[1]},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parts = [f"credit.name={variant}"] + ([f"optim.lr={lr}"] if lr else [])
    return {"name": name, "dir": d.name, "variant": parts, "env": "fl", "seed": seed}


def _sweep(root, runs):
    (root / "sweep.json").write_text(json.dumps({"study": "stats_study", "runs": runs}))
    return root


@pytest.fixture
def two_variants(tmp_path):
    root = tmp_path / "sweep"
    runs = [
        _run(root, f"fl/credit.name={v}/seed={s}", v, s, y)
        for v, ys in SUCCESS.items()
        for s, y in enumerate(ys)
    ]
    return _sweep(root, runs)


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_make_table__ci_paired_diff_auc_and_reach(two_variants, tmp_path):
    out = tmp_path / "out"
    args = [
        f"--sweep={two_variants}",
        f"--out={out}",
        "--metric=eval_test.greedy_success",
        "--baseline=grpo",
        "--reach=0.35",
    ]
    assert _make_table().main(args) == 0
    rows = _csv(out / "table.csv")
    head = "env,variant,metric,goal,seeds,mean,std,ci_low,ci_high,diff_vs_grpo,diff_ci_low"
    assert ",".join(rows[0].keys()).startswith(head + ",diff_ci_high,diff_p,")
    grpo, opo = ({k: v for k, v in r.items()} for r in rows)
    assert (grpo["env"], grpo["variant"], grpo["seeds"]) == ("fl", "credit.name=grpo", "3")
    # grpo: mean 0.7, s 0.1 -> 0.7 +- t_{0.975,2} 0.1 / sqrt 3.
    half = T2 * 0.1 / math.sqrt(3.0)
    assert float(grpo["mean"]) == pytest.approx(0.7)
    assert (float(grpo["ci_low"]), float(grpo["ci_high"])) == pytest.approx(
        (0.7 - half, 0.7 + half)
    )
    assert grpo["diff_vs_grpo"] == "" and grpo["diff_p"] == ""
    # opo - grpo per seed: 0.1, 0.2, 0.2 -> mean 1/6, s / sqrt 3 = 1/30, t = 5 on 2 df.
    assert float(opo["diff_vs_grpo"]) == pytest.approx(1 / 6)
    assert float(opo["diff_ci_low"]) == pytest.approx(1 / 6 - T2 / 30)
    assert float(opo["diff_ci_high"]) == pytest.approx(1 / 6 + T2 / 30)
    assert float(opo["diff_p"]) == pytest.approx(1 - 5 / math.sqrt(27)) and opo["diff_seeds"] == "3"
    # Detectable at 80%: (t_{0.975,2} + t_{0.8,2}) se, se = 1/30; on 2 df the p quantile is
    # (2p - 1) / sqrt(2 p (1 - p)): 0.6 / sqrt(0.32) for p = 0.8.
    t80 = 0.6 / math.sqrt(0.32)
    assert float(opo["diff_mde80"]) == pytest.approx((T2 + t80) / 30) and grpo["diff_mde80"] == ""
    # AUC of (10, y/2), (20, y) over 20 steps: (10 y/2 + 10 (y/2 + y) / 2) / 20 = 0.625 y.
    assert float(grpo["auc"]) == pytest.approx(0.625 * 0.7)
    assert float(opo["auc"]) == pytest.approx(0.625 * 2.6 / 3)
    # First evaluation >= 0.35: grpo seeds at steps 20, 10, 10 -> median 10 steps = 80
    # episodes; opo seeds all at step 10.
    assert (grpo["steps_to_reach"], grpo["episodes_to_reach"]) == ("10", "80")
    assert grpo["reached"] == "3/3" and opo["best"] == "1" and grpo["best"] == "0"
    md = (out / "table.md").read_text()
    assert "## Statistics" in md and "p: paired t-test (two-sided)" in md
    assert "| fl | credit.name=opo | eval_test.greedy_success ↑ | 3 | **0.867 [" in md
    assert "| 0.167 [0.023, 0.310] | 0.038 | 0.179 | 0.542 [" in md and "| 80 (3/3) |" in md
    assert "| (baseline) | - | - |" in md
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "![learning_curves](learning_curves.png)" in md

    # The exact sign-flip test instead: (0.1, 0.2, 0.2) has |sum| 0.5 in 2 of 8 patterns.
    assert _make_table().main([*args, "--p_test=sign_flip", "--reach=0.95"]) == 0
    opo = _csv(out / "table.csv")[1]
    assert float(opo["diff_p"]) == 0.25
    assert opo["diff_mde80"] == ""  # no power formula for the sign-flip test
    assert "p: exact sign-flip permutation test" in (out / "table.md").read_text()
    # Success 0.95: grpo never; opo only seed 2 (at step 20): the median is "never".
    grpo, opo = _csv(out / "table.csv")
    assert grpo["episodes_to_reach"] == "never" and grpo["reached"] == "0/3"
    assert opo["episodes_to_reach"] == "never" and opo["reached"] == "1/3"


def test_make_table__without_baseline_has_no_diff_columns(two_variants, tmp_path):
    out = tmp_path / "out"
    assert _make_table().main([f"--sweep={two_variants}", f"--out={out}"]) == 0
    columns = list(_csv(out / "table.csv")[0])
    assert not any(c.startswith("diff") for c in columns) and "lr" not in columns
    assert {"env", "variant", "seeds", "mean", "ci_low", "ci_high", "auc"} <= set(columns)
    assert not (out / "lr_sweep.csv").exists()


def test_make_table__bad_statistics_flags_fail_in_one_line(two_variants, tmp_path, capsys):
    make_table = _make_table()
    args = [f"--sweep={two_variants}", f"--out={tmp_path / 'out'}"]
    assert make_table.main([*args, "--baseline=ppo"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --baseline='ppo' names no row; allowed: one of "
        "['credit.name=grpo', 'credit.name=opo']\n"
    )
    with pytest.raises(SystemExit):
        make_table.main([*args, "--p_test=wilcoxon"])
    assert "--p_test" in capsys.readouterr().err
    assert make_table.main([*args, "--reach=nan"]) == 2
    assert "--reach=nan; allowed: a finite number" in capsys.readouterr().err


def test_paired_diff__refuses_runs_on_different_evaluation_tasks(tmp_path):
    root = tmp_path / "sweep"
    runs = [
        _run(root, "fl/credit.name=grpo/seed=0", "grpo", 0, 0.5),
        _run(root, "fl/credit.name=opo/seed=0", "opo", 0, 0.6, eval_seed=99),
    ]
    make_table = _make_table()
    entries = make_table.load_entries(str(_sweep(root, runs)))
    with pytest.raises(
        ValueError, match=r"evaluate different tasks \(train.eval_seed: 99 vs 1234\)"
    ):
        make_table.statistics(entries, [("eval_test.greedy_success", "max")], baseline="grpo")


def test_make_table__lr_sweep_chooses_on_training_success_not_test(tmp_path):
    # lr 0.01 trains better (train/success 0.5 at the end against 0.2) but tests worse.
    root = tmp_path / "sweep"
    runs = []
    for variant, ys in SUCCESS.items():
        for lr, shift, train in (("0.001", 0.0, (0.1, 0.2)), ("0.01", -0.3, (0.1, 0.5))):
            for s, y in enumerate(ys):
                name = f"fl/credit.name={variant}/optim.lr={lr}/seed={s}"
                runs.append(_run(root, name, variant, s, y + shift, lr=lr, train=train))
    out = tmp_path / "out"
    make_table = _make_table()
    args = [f"--sweep={_sweep(root, runs)}", f"--out={out}", "--metric=eval_test.greedy_success"]
    assert make_table.main([*args, "--baseline=grpo"]) == 0
    rows = _csv(out / "table.csv")
    assert [(r["variant"], r["lr"]) for r in rows] == [
        ("credit.name=grpo", "0.01"),
        ("credit.name=opo", "0.01"),
    ]
    assert float(rows[0]["mean"]) == pytest.approx(0.4)  # 0.7 - 0.3: the test is not peeked at
    sweep_rows = _csv(out / "lr_sweep.csv")
    assert len(sweep_rows) == 4 and sum(r["selected"] == "1" for r in sweep_rows) == 2
    # Score: the mean of the last quarter (here the last row) of train/success.
    scores = {r["lr"]: float(r["select_score"]) for r in sweep_rows}
    assert scores == pytest.approx({"0.001": 0.2, "0.01": 0.5})
    md = (out / "table.md").read_text()
    assert (
        "## Learning-rate sweep" in md and "| fl | credit.name=grpo | **0.01** | 0.500 | 3 |" in md
    )
    # The lr may not be chosen on a held-out split.
    assert make_table.main([*args, "--lr_select=eval_test/greedy_success"]) == 2
    # On the end of training success with lower is better, the other lr is kept.
    assert make_table.main([*args, "--lr_select=train/success:min"]) == 0
    assert [r["lr"] for r in _csv(out / "table.csv")] == ["0.001", "0.001"]


def test_make_table__lr_from_keeps_an_earlier_stages_choice(tmp_path, capsys):
    # Stage 1 chose 0.01 (it trains better); stage 2 added seeds at 0.01 only, and on them
    # 0.01 trains worse than stage 1's lone 0.001 run: --lr_from keeps 0.01 all the same.
    make_table = _make_table()
    stage1 = tmp_path / "stage1"
    stage1.mkdir()
    (stage1 / "lr_sweep.csv").write_text(
        "env,variant,lr,selected\nfl,base,0.001,0\nfl,base,0.01,1\n"
    )
    root = tmp_path / "sweep"
    runs = [_run(root, "fl/credit.name=grpo/optim.lr=0.001/seed=0", "grpo", 0, 0.2,
                 lr="0.001", train=(0.1, 0.4))]  # fmt: skip
    for s in range(3):
        name = f"fl/credit.name=grpo/optim.lr=0.01/seed={s}"
        runs.append(_run(root, name, "grpo", s, 0.5 + s / 10, lr="0.01", train=(0.1, 0.3)))
    out = tmp_path / "out"
    args = [f"--sweep={_sweep(root, runs)}", f"--out={out}", "--metric=eval_test.greedy_success"]
    assert make_table.main(args) == 0  # chosen afresh: 0.001 (0.4 against 0.3)
    assert [r["lr"] for r in _csv(out / "table.csv")] == ["0.001"]
    assert make_table.main([*args, f"--lr_from={stage1 / 'lr_sweep.csv'}"]) == 0
    (row,) = _csv(out / "table.csv")
    assert (row["lr"], row["seeds"]) == ("0.01", "3")
    assert float(row["mean"]) == pytest.approx(0.6)
    chosen = {r["lr"]: r["selected"] for r in _csv(out / "lr_sweep.csv")}
    assert chosen == {"0.001": "0", "0.01": "1"}
    assert "the learning rate an earlier stage chose (--lr_from)" in (out / "table.md").read_text()
    # Without the tuning seed: seeds 1 and 2 only, (0.6 + 0.7) / 2.
    lr_from = f"--lr_from={stage1 / 'lr_sweep.csv'}"
    assert make_table.main([*args, lr_from, "--exclude=seed=0$"]) == 0
    (row,) = _csv(out / "table.csv")
    assert row["seeds"] == "2" and float(row["mean"]) == pytest.approx(0.65)
    assert make_table.main([*args, "--exclude=seed=("]) == 2
    assert "--exclude='seed=(': missing ), unterminated subpattern" in capsys.readouterr().err
    # A choice no run has, and a file that is not an lr_sweep.csv: one-line errors.
    (stage1 / "lr_sweep.csv").write_text("env,variant,lr,selected\nfl,base,0.1,1\n")
    capsys.readouterr()
    assert make_table.main([*args, f"--lr_from={stage1 / 'lr_sweep.csv'}"]) == 2
    assert capsys.readouterr().err == (
        "error: --lr_from fixes the learning rate of row 'base' on 'fl' at '0.1'; "
        "allowed: one of the rates its runs have, ['0.001', '0.01']\n"
    )
    (stage1 / "table.csv").write_text("env,variant\nfl,grpo\n")
    assert make_table.main([*args, f"--lr_from={stage1 / 'table.csv'}"]) == 2
    assert "lacks the columns ['env', 'lr', 'selected', 'variant']" in capsys.readouterr().err
    (stage1 / "lr_sweep.csv").write_text(
        "env,variant,lr,selected\nfl,base,0.01,1\nfl,base,0.001,1\n"
    )
    assert make_table.main([*args, f"--lr_from={stage1 / 'lr_sweep.csv'}"]) == 2
    assert "selects two learning rates for ('base', 'fl'): 0.01 and 0.001" in (
        capsys.readouterr().err
    )


def test_make_table__raw_copy_remakes_the_same_tables_without_the_runs(two_variants, tmp_path):
    run = next(p for p in two_variants.iterdir() if p.is_dir())
    (run / "command.txt").write_text(
        "# cwd: /somewhere/project\nXLA_FLAGS=x /somewhere/.venv/bin/python scripts/train.py\n"
    )
    (run / "log.txt").write_text("not copied\n")
    with open(run / "metrics.jsonl", "a") as f:  # a row of keys the table does not use
        f.write(json.dumps({"step": 21, "wall_time": 9.0, "train/loss": 0.5}) + "\n")
    out, again = tmp_path / "out", tmp_path / "again"
    args = ["--metric=eval_test.greedy_success", "--baseline=grpo", "--curve_key=train/success"]
    assert _make_table().main([f"--sweep={two_variants}", f"--out={out}", "--raw", *args]) == 0
    raw = out / "raw"
    assert (raw / "sweep.json").read_text() == (two_variants / "sweep.json").read_text()
    copy = raw / run.name
    assert sorted(p.name for p in copy.iterdir()) == [
        "command.txt",
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    assert copy.joinpath("command.txt").read_text() == "XLA_FLAGS=x python scripts/train.py\n"
    rows = [json.loads(line) for line in copy.joinpath("metrics.jsonl").read_text().splitlines()]
    y = json.loads((run / "summary.json").read_text())["eval_test"]["greedy_success"]
    assert rows == [
        {"step": 10, "eval_test/greedy_success": y / 2, "train/success": 0.1},
        {"step": 20, "eval_test/greedy_success": y, "train/success": 0.1},
    ]  # the train/loss row is cut away
    # The copy alone remakes the tables.
    assert _make_table().main([f"--sweep={raw}", f"--out={again}", *args]) == 0
    for name in ("table.csv", "runs.csv"):
        assert (again / name).read_text() == (out / name).read_text()
    assert (again / "curves_fl.png").exists()
    # A second --raw replaces the copy.
    (run / "summary.json").unlink()
    assert _make_table().main([f"--sweep={two_variants}", f"--out={out}", "--raw", *args]) == 0
    assert not (raw / run.name / "summary.json").exists()
