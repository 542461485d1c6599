"""Copy a run's small artefacts into a results folder: curves PNG, summary JSON, eval CSV.

  python scripts/collect_run.py --workdir=runs/quickstart --out=experiments/results/foundation \
      --name=quickstart
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from rl4agents import config_utils  # noqa: E402
from rl4agents.train import writers  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_OUT = flags.DEFINE_string("out", None, "Results folder.")
_NAME = flags.DEFINE_string("name", None, "Prefix of the copied files.")
_KEYS = flags.DEFINE_list(
    "keys",
    [
        "train/success",
        "eval_test/greedy_success",
        "eval_test/sampled_success",
        "train/entropy",
        "train/zero_std_groups",
    ],
    "Metrics for the curve plot.",
)
flags.mark_flags_as_required(["workdir", "out", "name"])


def main(argv):
    if len(argv) > 1:
        config_utils.fail(f"unexpected arguments: {argv[1:]}")
    metrics = os.path.join(_WORKDIR.value, writers.METRICS_NAME)
    rows = writers.read_metrics(metrics)
    if not rows:
        config_utils.fail(f"--workdir={_WORKDIR.value!r} has no metrics; allowed: a run directory")
    if not any("eval_test/greedy_success" in r for r in rows):
        config_utils.fail(
            f"--workdir={_WORKDIR.value!r} has no evaluation yet; allowed: an evaluated run"
        )
    if os.path.exists(_OUT.value) and not os.path.isdir(_OUT.value):
        config_utils.fail(f"--out={_OUT.value!r} is a file; allowed: a directory (new or existing)")
    if not _NAME.value:
        config_utils.fail("--name=''; allowed: a file name prefix, e.g. quickstart")
    os.makedirs(_OUT.value, exist_ok=True)
    prefix = os.path.join(_OUT.value, _NAME.value)
    config = _stored_config(_WORKDIR.value)
    eval_tasks = config.get("train", {}).get("eval_tasks")
    init = config.get("init", {})
    sft_metrics = os.path.join(init.get("params") or "", writers.METRICS_NAME)
    sft_metrics = sft_metrics if init.get("params") and os.path.exists(sft_metrics) else None
    writers.plot_curves(
        metrics,
        prefix + "_curves.png",
        _KEYS.value,
        x="wall_time",
        title=_NAME.value,
        eval_tasks=eval_tasks,
        sft_metrics=sft_metrics,
        sft_wall_counted=bool(init.get("count_wall", False)),
    )
    # One CSV row per evaluated step: the test and (where evaluated) OOD rows merged.
    by_step: dict[int, dict] = {}
    for r in rows:
        if any(k.startswith(("eval_test/", "eval_ood/")) for k in r):
            by_step.setdefault(r["step"], {}).update(r)
    evals = [by_step[k] for k in sorted(by_step)]
    keys = {k for r in evals for k in r if k.startswith(("eval_test/", "eval_ood/"))}
    cols = ["step", "wall_time"] + sorted(keys)
    with open(prefix + "_eval.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in evals:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    summary = os.path.join(_WORKDIR.value, "summary.json")
    if os.path.exists(summary):
        with open(summary) as f:
            data = writers.relative_paths(json.load(f), _WORKDIR.value)
        with open(prefix + "_summary.json", "w") as f:
            json.dump(data, f, indent=2)
        print(json.dumps(data, indent=2))
    provenance = os.path.join(_WORKDIR.value, "provenance.json")
    if os.path.exists(provenance):
        shutil.copyfile(provenance, prefix + "_provenance.json")
    print(f"wrote {prefix}_curves.png, {prefix}_eval.csv")


def _stored_config(workdir: str) -> dict:
    """The run's resolved config as a dict (from provenance.json, else checkpoints/
    config.json), or {} when neither is there."""
    for path in (
        os.path.join(workdir, "provenance.json"),
        os.path.join(workdir, "checkpoints", "config.json"),
    ):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        data = data.get("config", data) if path.endswith("provenance.json") else data
        if isinstance(data, dict) and data:
            return data
    return {}


if __name__ == "__main__":
    app.run(main, flags_parser=config_utils.parse_plain_flags)
