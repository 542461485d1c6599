"""Two train steps on each mesh against one device: the sharding equivalence table.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python scripts/mesh_equivalence.py --out=experiments/results/scale/equivalence.md

The tiny test config (FrozenLake 4x4, 4 tasks x 2 samples, ppo_gae with a shared value head, 2
minibatches) runs two train steps on a 1-device mesh and on (data, fsdp, tensor) meshes
(8,1,1), (2,4,1), (2,2,2) and (1,1,8) of 8 simulated CPU devices. The table gives the largest
difference of every logged loss term and of every parameter after two steps, and how much of
the parameters each device holds.
"""

from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rl4agents import config_utils, sharding  # noqa: E402
from rl4agents.train import experiment  # noqa: E402
from tests.train.test_train import tiny_config  # noqa: E402

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8))
KEYS = ("loss", "pg_loss", "value_loss", "entropy", "grad_norm")


def two_steps(config, shape):
    n = int(np.prod(shape))
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), shape, devices=jax.devices()[:n])
    exp = experiment.build(config, mesh=mesh)
    state = exp.init_state(jax.random.key(0))
    metrics = []
    for _ in range(2):
        state, m = exp.train_step(state, exp.root_key())
        metrics.append(jax.device_get(m))
    leaves = jax.tree.leaves(state.params)
    total = sum(x.size for x in leaves)
    per_device = sum(x.addressable_shards[0].data.size for x in leaves)
    return jax.device_get(state.params), metrics, per_device / total


def main():
    ap = config_utils.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="experiments/results/scale/equivalence.md")
    args = ap.parse_args()
    config_utils.check_output_file("--out", args.out)
    config = tiny_config(
        **{"credit.name": "ppo_gae", "model.value_head": "shared", "train.minibatches": 2}
    )
    p1, m1, _ = two_steps(config, (1, 1, 1))
    rows = []
    for shape in MESHES:
        p, m, frac = two_steps(config, shape)
        dm = max(abs(float(a[k]) - float(b[k])) for a, b in zip(m, m1) for k in KEYS)
        dp = max(
            float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(p1))
        )
        rows.append((shape, dm, dp, frac))
        print(f"{shape}: max |d metric| {dm:.2e}, max |d param| {dp:.2e}, params/device {frac:.3f}")
    lines = [
        "# Mesh equivalence: two train steps vs one device",
        "",
        "```bash",
        "XLA_FLAGS=--xla_force_host_platform_device_count=8 \\",
        f"    python scripts/mesh_equivalence.py --out={args.out}",
        "```",
        "",
        "Tiny FrozenLake config (tests/train/test_train.py), `ppo_gae` with a shared value head,",
        "2 minibatches, two train steps; metrics compared: " + ", ".join(KEYS) + ".",
        "Tolerances the tests use (tests/test_sharding.py): metrics rtol 1e-4 / atol 1e-6,",
        "parameters rtol 1e-4 / atol 2e-5 (fp32 reductions in a different order).",
        "",
        "| mesh (data, fsdp, tensor) | max abs metric diff | max abs parameter diff "
        "| fraction of parameters per device |",
        "|---|---:|---:|---:|",
    ]
    for shape, dm, dp, frac in rows:
        lines.append(f"| {shape} | {dm:.2e} | {dp:.2e} | {frac:.3f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
