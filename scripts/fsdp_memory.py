"""Does fsdp split the activations? XLA's temporaries and the MLP products' rows per mesh.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python scripts/fsdp_memory.py

Compiles the train step of the tiny test config (tests/train/test_train.py; d_ff 768, 8 tasks
x 2 samples, 16 evaluation tasks) on 8 CPU devices for meshes (8,1,1), (2,4,1), (2,2,2) and
(1,8,1) at 1 and 3 turns, with the test suite's XLA settings, and prints per mesh: XLA's
temporaries in units of the per-device parameter bytes (`compiled.memory_analysis()`), the
memory estimate's largest phase in the same units, and the most rows of any fused gate/up
product ([rows, 2 x d_ff / tensor]) against one device's share of the episodes' slots. Nothing runs;
run it at another commit (e.g. in a `git worktree`, with PYTHONPATH pointing there) to compare.
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_cpu_use_fusion_emitters=false",
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rl4agents import memory  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402
from rl4agents.train import experiment  # noqa: E402
from tests.train.test_train import tiny_config  # noqa: E402

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 8, 1))


def main() -> None:
    if sys.argv[1:]:  # it takes no arguments
        print(f"error: unexpected arguments: {sys.argv[1:]}", file=sys.stderr)
        sys.exit(2)
    print(
        "| mesh | turns | XLA temporaries / params per device | estimate's largest phase "
        "| most gate/up rows | one device's share |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for shape in MESHES:
        for turns in (1, 3):
            config = tiny_config(
                **{
                    "rollout.max_turns": turns,
                    "model.d_ff": 768,
                    "mesh.shape": shape,
                    "rollout.num_tasks": 8,
                    "train.eval_tasks": 16,
                }
            )
            exp = experiment.build(config)
            compiled = exp.train_step.lower(exp.abstract_state(), exp.root_key()).compile()
            temp = compiled.memory_analysis().temp_size_in_bytes
            est = memory.estimate(exp, dict(exp.mesh.shape))
            p = est.term("parameters")
            gate_up = 2 * exp.model_cfg.d_ff // shape[2]  # split over tensor
            pattern = rf"= f32\[(\d+),{gate_up}\]\{{[^}}]*\}} dot\("
            rows = max(int(m) for m in re.findall(pattern, compiled.as_text()))
            episodes = config.rollout.num_tasks * config.rollout.group_size
            slots = rollout_lib.make_layout(exp.env, exp.step_cfg.rollout).length
            share = episodes // (shape[0] * shape[1]) * slots
            phase = est.phase_bytes(est.peak_phase) / p
            print(
                f"| {shape} | {turns} | {temp / p:.2f} | {phase:.2f} ({est.peak_phase}) "
                f"| {rows} | {share} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
