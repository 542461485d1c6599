"""scripts/paired_eval.py's table: one row from per-task outcomes (hand-derived numbers), and
rows of environments evaluated earlier kept when others are evaluated again."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from rl4agents import results
from tests.scripts import load_script


@pytest.fixture(scope="module")
def paired_eval():
    return load_script("paired_eval")


def _outcomes(greedy, sampled):
    return {
        "greedy_success": np.asarray(greedy, np.float32),
        "sampled_success": np.asarray(sampled, np.float32),
    }


INFO = {"minutes": [15.5, 16.04, 14.0], "steps": [40, 38, 35], "cpu_s": [900.0, 1800.0, 900.0]}


def test_env_row__means_interval_and_extras_by_hand(paired_eval):
    # 4 tasks. Base solves task 0 only: 0.25. Seed 0 solves 0, 1: 0.5 (+0.25); seed 1 solves
    # 0, 1, 2: 0.75 (+0.5); seed 2 solves 1: 0.25 (+0). Mean over seeds and tasks: 0.5, so
    # delta = 0.25. Sign-flip test of the per-seed changes (0.25, 0.5, 0): the third's sign
    # changes nothing, and |mean| >= 0.25 needs the first two of one sign: (+, +, *) and
    # (-, -, *), 4 of the 8 patterns, p = 0.5.
    base = _outcomes([1, 0, 0, 0], [1, 1, 0, 0])
    rl = [
        _outcomes([1, 1, 0, 0], [1, 1, 1, 0]),
        _outcomes([1, 1, 1, 0], [1, 1, 1, 1]),
        _outcomes([0, 1, 0, 0], [0, 1, 0, 0]),
    ]
    row = paired_eval.env_row("maze", base, rl, [0, 1, 2], {**INFO, "variant": ["maze"]}, 2000)
    assert list(row) == list(paired_eval.COLUMNS + paired_eval.EXTRA)
    assert row["base_test"] == 0.25
    assert row["rl_test"] == 0.5
    assert row["delta"] == 0.25
    # the interval: results.paired_bootstrap_ci of the greedy outcomes, seed 0, rounded
    greedy = np.stack([o["greedy_success"] for o in rl])
    _, low, high = results.paired_bootstrap_ci(greedy, base["greedy_success"], samples=2000, seed=0)
    assert (row["delta_ci_low"], row["delta_ci_high"]) == (round(low, 4), round(high, 4))
    assert row["delta_ci_low"] < 0.25 < row["delta_ci_high"]
    assert row["seeds"] == 3 and row["eval_tasks"] == 4
    assert row["minutes"] == 16.0  # the longest run, rounded to 0.1
    assert row["rl_test_per_seed"] == "0.500 0.750 0.250"
    assert row["base_sampled"] == 0.5
    assert row["rl_sampled"] == pytest.approx((0.75 + 1.0 + 0.25) / 3, abs=1e-4)
    # Sampled: base 0.5; seeds 0.75, 1.0, 0.25, mean 2/3: a change of 1/6.
    assert row["sampled_delta"] == pytest.approx(1 / 6, abs=1e-4)
    sampled = np.stack([o["sampled_success"] for o in rl])
    _, low, high = results.paired_bootstrap_ci(
        sampled, base["sampled_success"], samples=2000, seed=0
    )
    assert (row["sampled_ci_low"], row["sampled_ci_high"]) == (round(low, 4), round(high, 4))
    assert row["sampled_ci_low"] < row["sampled_delta"] < row["sampled_ci_high"]
    assert row["steps"] == "40 38 35"
    assert row["p_sign_flip"] == 0.5
    assert row["cpu_hours"] == 1.0  # 3,600 CPU-seconds summed over seeds
    assert row["variant"] == "maze"
    assert row["eval_seed"] == ""  # not given
    info = {**INFO, "variant": ["maze"], "eval_seed": 20261207}
    assert paired_eval.env_row("maze", base, rl, [0, 1, 2], info, 2000)["eval_seed"] == 20261207


def test_env_row__a_change_on_every_task_and_seed_has_a_degenerate_interval(paired_eval):
    # Every seed solves every task the base fails and the base solves none: every replicate's
    # mean difference is 1, so the interval is [1, 1].
    base = _outcomes(np.zeros(6), np.zeros(6))
    rl = [_outcomes(np.ones(6), np.ones(6)) for _ in range(3)]
    row = paired_eval.env_row("sokoban", base, rl, [0, 1, 2], {**INFO, "variant": []}, 500)
    assert (row["delta"], row["delta_ci_low"], row["delta_ci_high"]) == (1.0, 1.0, 1.0)
    assert (row["sampled_delta"], row["sampled_ci_low"], row["sampled_ci_high"]) == (1, 1, 1)
    assert row["variant"] == "base"


def test_env_row__refuses_runs_evaluated_on_other_tasks(paired_eval):
    base = _outcomes(np.zeros(4), np.zeros(4))
    rl = [_outcomes(np.ones(5), np.ones(5))]
    with pytest.raises(ValueError, match="maze: the runs were evaluated on"):
        paired_eval.env_row("maze", base, rl, [0], {**INFO, "variant": []}, 10)


def test_merge_rows__a_new_evaluation_replaces_its_environment_and_keeps_the_others(paired_eval):
    old = [{"env": "frozen_lake", "delta": "0.1"}, {"env": "maze", "delta": "0.0"}]
    new = [{"env": "maze", "delta": 0.2}, {"env": "sokoban", "delta": 0.05}]
    assert paired_eval.merge_rows(old, new) == [
        {"env": "frozen_lake", "delta": "0.1"},
        {"env": "maze", "delta": 0.2},
        {"env": "sokoban", "delta": 0.05},
    ]


def test_write_and_read_csv__round_trip(paired_eval, tmp_path):
    rows = [
        {"env": "maze", "delta": 0.25, "seeds": 3, "steps": "40 38", "base_digest": "0696e122"},
        {"env": "sokoban", "delta": -0.5, "seeds": 5, "steps": "7", "base_digest": "0123"},
    ]
    path = str(tmp_path / "table.csv")
    paired_eval.writers.write_csv(path, rows)
    # Numbers come back as numbers (right-aligned in table.md), "7" as an int; a digest that
    # reads as a number ("0696e122" as a float, "0123" as an int) stays text.
    assert paired_eval.read_csv(path) == [
        {"env": "maze", "delta": 0.25, "seeds": 3, "steps": "40 38", "base_digest": "0696e122"},
        {"env": "sokoban", "delta": -0.5, "seeds": 5, "steps": 7, "base_digest": "0123"},
    ]
    assert paired_eval.read_csv(str(tmp_path / "none.csv")) == []


def test_saved_run_dirs__the_env_s_seed_folders_with_metrics_only(paired_eval, tmp_path):
    root = tmp_path / "run_data"
    for name in ("maze_seed1", "maze_seed0", "maze_x_seed0", "frozen_lake_seed0", "maze_seed2"):
        (root / name).mkdir(parents=True)
        if name != "maze_seed2":  # no metrics: not a run's curve
            (root / name / "metrics.jsonl").write_text('{"step": 1, "train/success": 0.5}\n')
    found = paired_eval.saved_run_dirs(str(tmp_path), "maze")
    assert [pathlib.Path(p).name for p in found] == ["maze_seed0", "maze_seed1"]
    assert paired_eval.saved_run_dirs(str(tmp_path / "none"), "maze") == []
    held_out, train = paired_eval.run_curves(found[0], "test", 0.25)
    assert held_out == [(0, 0.25)] and train == [(1, 0.5)]


def test_save_run_data__copies_the_run_s_small_files_and_replaces_an_older_copy(
    paired_eval, tmp_path
):
    run = tmp_path / "sweep" / "base_policy-maze__seed=1"
    (run / "checkpoints").mkdir(parents=True)
    command = "# cwd: /home/me/repo\nXLA_FLAGS=x /home/me/venv/bin/python3.11 scripts/train.py\n"
    for name, text in [("command.txt", command), ("config.json", "{}"), ("metrics.jsonl", "a")]:
        (run / name).write_text(text)
    out = tmp_path / "results"
    dest = pathlib.Path(paired_eval.save_run_data(str(run), str(out), "maze", 1))
    assert dest == out / "run_data" / "maze_seed1"
    assert sorted(p.name for p in dest.iterdir()) == ["command.txt", "config.json", "metrics.jsonl"]
    assert (dest / "command.txt").read_text() == "XLA_FLAGS=x python scripts/train.py\n"
    (run / "metrics.jsonl").write_text("b")
    (run / "summary.json").write_text("{}")
    paired_eval.save_run_data(str(run), str(out), "maze", 1)
    assert (dest / "metrics.jsonl").read_text() == "b" and (dest / "summary.json").exists()
    assert paired_eval.saved_run_dirs(str(out), "maze") == [str(dest)]


def test_start_policy__saved_policy_else_pretrained_checkpoint_else_none(paired_eval):
    from configs import base

    config = base.get_config()
    assert paired_eval.start_policy(config) is None
    config.model.checkpoint = "runs/models/m"
    assert paired_eval.start_policy(config) == ("model.checkpoint", "runs/models/m")
    config.init.params = "runs/base"  # a saved policy wins: its parameters are the start
    assert paired_eval.start_policy(config) == ("init.params", "runs/base")


def test_outcomes__the_runs_eval_seed_unless_another_is_given(paired_eval):
    calls = []

    class FakeExperiment:
        class config:  # noqa: N801  (the one field outcomes reads)
            class train:  # noqa: N801
                eval_seed = 1234

        def task_outcomes_fn(self, split, num_tasks, batch):
            def fn(params, seed):
                calls.append((split, num_tasks, batch, params, seed))
                return {"greedy_success": np.full(num_tasks, seed % 2, np.float32)}

            return fn

    exp = FakeExperiment()
    out = paired_eval.outcomes(exp, "p", "test", 4, 2)
    assert calls[-1] == ("test", 4, 2, "p", 1234) and out["greedy_success"].tolist() == [0] * 4
    out = paired_eval.outcomes(exp, "p", "test", 4, 2, seed=7)
    assert calls[-1] == ("test", 4, 2, "p", 7) and out["greedy_success"].tolist() == [1] * 4
