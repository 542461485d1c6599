"""Tests for rl4agents.train.writers."""

import json
import os

import numpy as np
import pytest

from rl4agents.train import writers
from rl4agents.train.writers import (
    MetricWriter,
    format_table,
    plot_curves,
    read_metrics,
    relative_paths,
    wilson_interval,
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


def test_wilson_interval__hand_computed_values():
    # 50 of 100: center 0.5, half width z / (1 + z^2/n) * sqrt(0.25/n + z^2/(4 n^2)).
    lo, hi = wilson_interval(0.5, 100)
    np.testing.assert_allclose([lo, hi], [0.403832, 0.596168], atol=1e-6)
    # All of 256 solved: lo = 1 / (1 + z^2/n); nothing of 256: hi = (z^2/n) / (1 + z^2/n).
    z2n = writers.Z_95**2 / 256
    lo, hi = wilson_interval(np.array([1.0, 0.0]), 256)
    np.testing.assert_allclose(lo, [1 / (1 + z2n), 0.0], atol=1e-12)
    np.testing.assert_allclose(hi, [1.0, z2n / (1 + z2n)], atol=1e-12)
    np.testing.assert_allclose(lo[0], 0.985216, atol=1e-6)  # 256 tasks: +-1.5% is noise
    with pytest.raises(ValueError, match=r"n=0; allowed: an int >= 1"):
        wilson_interval(0.5, 0)


def _rl_rows(path, ood=True):
    """A run's metrics: train rows every step, evaluations (test, OOD) every 2 steps."""
    with open(path, "w") as f:
        for step in range(1, 9):
            row = {"step": step, "wall_time": 10.0 + step, "train/success": step / 10}
            f.write(json.dumps(row) + "\n")
            if step % 2 == 0:
                ev = {"step": step, "wall_time": 10.0 + step}
                ev["eval_test/greedy_success"] = 0.984 + step / 1000
                if ood:
                    ev["eval_ood/greedy_success"] = 0.5 + step / 20
                f.write(json.dumps(ev) + "\n")


def _sft_rows(path):
    with open(path, "w") as f:
        for step in (1, 11, 21, 30):
            f.write(json.dumps({"step": step, "wall_time": step / 3, "sft/nll": 3 / step}) + "\n")
        f.write(json.dumps({"step": 30, "wall_time": 10.0, "eval_test/greedy_success": 0.9}) + "\n")


def _plotted(monkeypatch):
    """Captures the figure plot_curves draws (its axes' lines, limits and shaded areas)."""
    from matplotlib.figure import Figure

    figures = []
    savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


@pytest.mark.parametrize("ood,sft", [(False, False), (True, True)])
def test_plot_curves__success_panels_bands_ood_and_sft_phase(tmp_path, monkeypatch, ood, sft):
    _rl_rows(tmp_path / "metrics.jsonl", ood=ood)
    if sft:
        _sft_rows(tmp_path / "sft.jsonl")
    figures = _plotted(monkeypatch)
    png = plot_curves(
        tmp_path / "metrics.jsonl",
        tmp_path / "curves.png",
        ["train/success", "eval_test/greedy_success", "nll"],
        eval_tasks=256,
        sft_metrics=tmp_path / "sft.jsonl" if sft else None,
    )
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    train_ax, eval_ax, nll_ax = figures[0].axes
    for ax in (train_ax, eval_ax):  # success rates: a fixed [0, 1] axis
        lo, hi = ax.get_ylim()
        assert lo <= 0.0 and hi >= 1.0 and hi - lo < 1.1
    lines = {line.get_label(): line for line in eval_ax.get_lines()}
    assert list(lines) == ["eval_test/greedy_success", "eval_ood/greedy_success"][: 1 + ood]
    shift = 30 if sft else 0  # RL step s is drawn at the SFT's last step + s
    test_x = list(lines["eval_test/greedy_success"].get_xdata())
    assert test_x == ([30] if sft else []) + [shift + s for s in (2, 4, 6, 8)]
    # One 95% band per evaluated split, the Wilson interval over 256 tasks.
    bands = [c for c in eval_ax.collections if c.get_label() != "SFT"]
    assert len(bands) == len(lines)
    test_band = bands[0]  # drawn in the order of the lines
    top = test_band.get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(float(wilson_interval(0.992, 256)[1]))
    assert "95%, 256 tasks" in eval_ax.get_title()
    # The SFT phase: a shaded span [0, 30] in every panel, its NLL in the "nll" panel.
    spans = [c for c in train_ax.patches + train_ax.collections if c.get_label() == "SFT"]
    assert len(spans) == int(sft)
    assert [line.get_label() for line in nll_ax.get_lines()] == (["sft/nll"] if sft else [])
    if sft:
        assert list(train_ax.get_lines()[0].get_xdata()) == [30 + s for s in range(1, 9)]
        assert "SFT, then RL from 30" in train_ax.get_xlabel()


def test_plot_curves__wall_time_after_sft_and_bad_arguments(tmp_path, monkeypatch):
    _rl_rows(tmp_path / "metrics.jsonl")
    _sft_rows(tmp_path / "sft.jsonl")
    figures = _plotted(monkeypatch)
    for counted, first in [(False, 10.0 + 10.0 + 1), (True, 10.0 + 1)]:
        plot_curves(
            tmp_path / "metrics.jsonl",
            tmp_path / "wall.png",
            ["train/success"],
            x="wall_time",
            sft_metrics=tmp_path / "sft.jsonl",
            sft_wall_counted=counted,
        )
        assert figures[-1].axes[0].get_lines()[0].get_xdata()[0] == first
    args = (tmp_path / "metrics.jsonl", tmp_path / "x.png", ["train/success"])
    with pytest.raises(ValueError, match=r"x='time'; allowed: 'step' or 'wall_time'"):
        plot_curves(*args, x="time")
    with pytest.raises(ValueError, match=r"n=0; allowed"):
        plot_curves(*args, eval_tasks=0)
    with pytest.raises(ValueError, match=r"sft_metrics=.*nope.jsonl' is not a file"):
        plot_curves(*args, sft_metrics=tmp_path / "nope.jsonl")
    assert not (tmp_path / "x.png").exists()


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


def test_write_csv__header_rows_and_atomic_replace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    rows = [{"env": "maze", "x": 0.5}, {"env": "sokoban", "x": 1}]
    writers.write_csv(path, rows, ["env", "x"])
    assert path.read_text().splitlines() == ["env,x", "maze,0.5", "sokoban,1"]
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]  # no temporary file left behind
    writers.write_csv(path, rows)  # the header defaults to the first row's keys
    assert path.read_text().splitlines()[0] == "env,x"


def test_write_csv__extra_keys_raise_unless_ignored(tmp_path):
    rows = [{"env": "maze", "x": 0.5, "extra": 1}]
    with pytest.raises(ValueError, match="extra"):
        writers.write_csv(tmp_path / "t.csv", rows, ["env", "x"])
    writers.write_csv(tmp_path / "t.csv", rows, ["env", "x"], ignore_extra=True)
    assert (tmp_path / "t.csv").read_text().splitlines() == ["env,x", "maze,0.5"]


def test_append_command__quoted_line_with_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--a=1 --b=2")
    writers.append_command(tmp_path, "scripts/x.py", ["--out=a b", "--n=3"])
    writers.append_command(tmp_path, "scripts/x.py", ["--n=4"], env=("XLA_FLAGS",))
    lines = (tmp_path / writers.COMMAND_NAME).read_text().splitlines()
    assert lines == [
        "python scripts/x.py '--out=a b' --n=3",
        "XLA_FLAGS='--a=1 --b=2' python scripts/x.py --n=4",
    ]
