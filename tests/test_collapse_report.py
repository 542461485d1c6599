"""scripts/collapse_report.py: per-run collapse statistics and task changes, by hand."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def report():
    return load_script("collapse_report")


def _metrics(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_stats__late_medians_all_zero_share_and_windows(report):
    rows = [
        {"step": 1, "train/success": 0.1, "train/entropy": 0.5, "train/zero_std_groups": 0.25},
        {"step": 1, "eval_test/greedy_success": 0.3},  # an evaluation row: not a training step
        {"step": 2, "train/success": 0.3, "train/entropy": 0.4, "train/zero_std_groups": 0.5},
        {"step": 3, "train/success": 0.5, "train/entropy": 0.2, "train/zero_std_groups": 1.0},
        {"step": 4, "train/success": 0.7, "train/entropy": 0.1, "train/zero_std_groups": 0.75},
        {"step": 5, "train/success": 0.9, "train/entropy": 0.3, "train/zero_std_groups": 1.0},
    ]
    got = report.run_stats(rows, after=2, window=2)
    assert got["steps"] == 5
    assert got["entropy_start"] == 0.5
    assert got["entropy_late"] == pytest.approx(0.2)  # median of 0.2, 0.1, 0.3
    assert got["zero_std_late"] == 1.0  # median of 1.0, 0.75, 1.0
    assert got["all_zero_late"] == pytest.approx(2 / 3)
    assert got["success_start"] == pytest.approx(0.2)  # steps 1 and 2
    assert got["success_end"] == pytest.approx(0.8)  # steps 4 and 5
    assert got["mi_gap_late"] is None  # not logged
    rows[3]["train/mi/gap"], rows[5]["train/mi/gap"] = 0.5, 0.1
    assert report.run_stats(rows, after=2, window=2)["mi_gap_late"] == pytest.approx(0.3)
    assert report.run_stats([{"step": 1, "eval_test/greedy_success": 0.3}], 2, 2) == {}


def test_task_changes__gained_and_lost_against_the_base_greedy_and_sampled(report):
    def row(policy, seed, task, greedy, sampled):
        return {
            "env": "maze",
            "policy": policy,
            "seed": seed,
            "task": str(task),
            "greedy_success": str(greedy),
            "sampled_success": str(sampled),
        }

    per_task = [
        row("base", "", 0, 1.0, 0.0),
        row("base", "", 1, 0.0, 0.0),
        row("base", "", 2, 0.0, 1.0),
        row("rl", "0", 0, 0.0, 1.0),  # lost greedy, gained sampled
        row("rl", "0", 1, 1.0, 1.0),  # gained both
        row("rl", "0", 2, 1.0, 1.0),  # gained greedy
        row("rl", "1", 0, 1.0, 0.0),  # the other seed: unchanged
        row("rl", "1", 1, 0.0, 0.0),
        row("rl", "1", 2, 0.0, 1.0),
    ]
    assert report.task_changes(per_task, "maze", "0") == {
        "gained": 2,
        "lost": 1,
        "sampled_gained": 2,
        "sampled_lost": 0,
    }
    assert set(report.task_changes(per_task, "maze", "1").values()) == {0}
    assert report.task_changes(per_task, "sokoban", "0") == {}


def test_main__writes_diagnosis_per_run_sorted_and_refuses_a_folder_without_run_data(
    report, tmp_path, monkeypatch
):
    step = {"train/success": 0.5, "train/entropy": 0.2, "train/zero_std_groups": 1.0}
    for name in ("maze_seed1", "maze_seed0", "countdown_seed0"):
        _metrics(tmp_path / "run_data" / name / "metrics.jsonl", [{"step": 1, **step}])
    (tmp_path / "run_data" / "notes").mkdir()  # not a run folder
    monkeypatch.setattr("sys.argv", ["collapse_report.py", f"--results={tmp_path}", "--after=0"])
    report.main()
    lines = (tmp_path / "diagnosis.csv").read_text().splitlines()
    assert lines[0].split(",") == list(report.COLUMNS)
    assert [line.split(",")[:2] for line in lines[1:]] == [
        ["countdown", "0"],
        ["maze", "0"],
        ["maze", "1"],
    ]
    assert "scripts/collapse_report.py" in (tmp_path / "diagnosis.md").read_text()
    monkeypatch.setattr("sys.argv", ["collapse_report.py", f"--results={tmp_path / 'none'}"])
    with pytest.raises(SystemExit, match="no run_data"):
        report.main()
