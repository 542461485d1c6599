"""Tests for rl4agents.train.writers."""

import json
import os

import numpy as np

from rl4agents.train.writers import (
    MetricWriter,
    format_table,
    plot_curves,
    read_metrics,
    relative_paths,
)


def _write_run(workdir, steps, **kwargs):
    with MetricWriter(workdir, **kwargs) as writer:
        for step in steps:
            writer.write(step, {"reward": step / 10, "loss": np.float32(1.0)}, wall_time=2.0 * step)
            if step % 2 == 0:
                writer.write(step, {"reward": step / 5}, prefix="eval", wall_time=2.0 * step)


def test_metric_writer__jsonl_rows(tmp_path):
    _write_run(tmp_path, range(3))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "wall_time": 0.0, "train/reward": 0.0, "train/loss": 1.0},
        {"step": 0, "wall_time": 0.0, "eval/reward": 0.0},
        {"step": 1, "wall_time": 2.0, "train/reward": 0.1, "train/loss": 1.0},
        {"step": 2, "wall_time": 4.0, "train/reward": 0.2, "train/loss": 1.0},
        {"step": 2, "wall_time": 4.0, "eval/reward": 0.4},
    ]
    assert read_metrics(tmp_path / "metrics.jsonl") == [json.loads(line) for line in lines]


def test_metric_writer__measures_wall_time(tmp_path):
    with MetricWriter(tmp_path) as writer:
        row = writer.write(1, {"x": 1.0})
    assert 0.0 <= row["wall_time"] < 60.0


def test_metric_writer__resume_drops_rows_from_resume_step(tmp_path):
    _write_run(tmp_path, range(5))
    _write_run(tmp_path, range(3, 5), resume_step=3)
    steps = [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == [0, 0, 1, 2, 2, 3, 4, 4]
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_metric_writer__truncate_after_while_open(tmp_path):
    with MetricWriter(tmp_path) as writer:
        for step in range(4):
            writer.write(step, {"x": step})
        assert writer.truncate_after(2) == 2
        writer.write(2, {"x": 20})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(row["step"], row["train/x"]) for row in rows] == [(0, 0), (1, 1), (2, 20)]


def test_read_metrics__skips_cut_short_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/x": 1.0}\n{"step": 2, "tr')
    assert read_metrics(path) == [{"step": 1, "train/x": 1.0}]


def test_metric_writer__tensorboard_event_file(tmp_path):
    _write_run(tmp_path, range(2))
    events = os.listdir(tmp_path / "tb")
    assert any(name.startswith("events.out.tfevents") for name in events)
    assert all(os.path.getsize(tmp_path / "tb" / name) > 0 for name in events)


def test_metric_writer__disabled_writes_nothing(tmp_path):
    with MetricWriter(tmp_path / "run", enabled=False) as writer:
        writer.write(0, {"x": 1.0})
    assert not (tmp_path / "run").exists()


def test_plot_curves__writes_png(tmp_path):
    _write_run(tmp_path, range(6))
    for x in ("step", "wall_time"):
        png = plot_curves(
            tmp_path / "metrics.jsonl",
            tmp_path / f"curves_{x}.png",
            ["reward", "loss"],
            x=x,
            title="run",
        )
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(png) > 1000


def test_format_table__aligned_markdown():
    rows = [
        {"env": "gsm", "reward": 0.123456, "episodes": 128},
        {"env": "alfworld", "reward": 1.5, "episodes": 7, "extra": 1},
    ]
    table = format_table(rows, ["env", "reward", "episodes", "missing"])
    assert table.splitlines() == [
        "| env      | reward | episodes | missing |",
        "| -------- | -----: | -------: | ------: |",
        "| gsm      | 0.1235 |      128 |       - |",
        "| alfworld |    1.5 |        7 |       - |",
    ]
    assert format_table(rows).splitlines()[0].split("|")[4].strip() == "extra"


def test_relative_paths__only_paths_inside_the_workdir(tmp_path):
    run = tmp_path / "runs" / "q"
    summary = {
        "curves": str(run / "curves.png"),
        "sft": {"params": str(run / "sft" / "params")},
        "ckpts": [str(run / "checkpoints")],
        "sibling": str(tmp_path / "runs" / "q2" / "x"),  # shares a prefix, not the folder
        "elsewhere": "/abs/other/file",
        "word": "finished",
        "steps": 3,
    }
    assert relative_paths(summary, run) == {
        "curves": "curves.png",
        "sft": {"params": os.path.join("sft", "params")},
        "ckpts": ["checkpoints"],
        "sibling": str(tmp_path / "runs" / "q2" / "x"),
        "elsewhere": "/abs/other/file",
        "word": "finished",
        "steps": 3,
    }
    # A workdir given relative to the current directory, as `--workdir=runs/q`.
    rel = {"curves": os.path.join("runs", "q", "curves.png"), "other": "runs/qq/x"}
    assert relative_paths(rel, "runs/q") == {"curves": "curves.png", "other": "runs/qq/x"}
