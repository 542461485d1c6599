"""XLA CPU back-end flags on the update's forward + backward: does another matmul engine help?

  python scripts/bench_xla_flags.py            # the update's forward + backward
  python scripts/bench_xla_flags.py --decode   # a decode step's MLP matmul (16 rows)

Each flag set runs in its own process (XLA reads its flags once): one XLA CPU device, the
benchmark model (PRESETS["bench"], vocab 512, f32), the multi-turn benchmark's layout
(T=473, 16 rows), scoring the 128 action slots, as in `bench_attention.py`. Prints the median
of 5 calls after a warm-up, and the loss, which must not change.
"""

from __future__ import annotations

import os
import subprocess
import sys

FLAG_SETS = (
    "",
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_experimental_xnn_fusion_type=dot",
    "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
    "--xla_cpu_experimental_ynn_fusion_type=dot",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_experimental_onednn_custom_call=true",
)

CHILD = """
import jax, jax.numpy as jnp
from flax import nnx
from scripts import bench_attention as ba
from rl4agents.models import policy as policy_lib
from rl4agents.rollout import rollout as rollout_lib
cfg = policy_lib.make_config("bench", ba.VOCAB)
graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
lay = rollout_lib.Layout(prompt=72, action=16, obs=39, turns=8, length=512)
slots = jnp.asarray(rollout_lib.action_slots(lay))
cut = lay.length - lay.obs
tokens = jax.random.randint(jax.random.key(1), (ba.ROWS, cut), 3, ba.VOCAB)
valid = jnp.ones((ba.ROWS, cut), bool)
rows = jnp.broadcast_to(slots, (ba.ROWS, len(slots)))
def loss(p):
    return rollout_lib.score(nnx.merge(graphdef, p), tokens, valid, slots=rows).logp.sum()
fn = jax.jit(jax.value_and_grad(loss))
print(f"{ba.median_s(fn, params) * 1e3:.0f} {float(fn(params)[0]):.4f}")
"""

DECODE_CHILD = """
import statistics, time
import jax, jax.numpy as jnp, numpy as np
n, rows, k, m = 24, 16, 256, 1376
ws = jax.random.normal(jax.random.key(0), (n, k, m)) * 0.05
wt = jnp.swapaxes(ws, 1, 2)
x = jax.random.normal(jax.random.key(1), (rows, k))
def chain(x, ws, transposed):
    def body(h, w):
        y = h @ w.T if transposed else h @ w
        return h + 1e-3 * y[:, :k], None
    return jax.lax.scan(body, x, ws)[0]
def median_ms(call):
    call()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3 / n
out = []
for w, t in ((ws, False), (wt, True)):
    f = jax.jit(lambda x, w, t=t: chain(x, w, t))
    out.append(median_ms(lambda: f(x, w).block_until_ready()))
xn, wn = np.asarray(x), list(np.asarray(ws))
out.append(median_ms(lambda: [xn @ w for w in wn]))
print(" ".join(f"{v:.3f}" for v in out))
"""


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    decode = "--decode" in sys.argv[1:]
    if [a for a in sys.argv[1:] if a != "--decode"]:  # --decode is its one flag
        print(f"error: unexpected arguments: {sys.argv[1:]}; allowed: --decode", file=sys.stderr)
        sys.exit(2)
    if decode:
        print(
            "decode-step matmul [16, 256] x [256, 1376], 1 XLA CPU device "
            "(median ms per matmul: kernel [K, N], kernel [N, K], NumPy [K, N]):"
        )
    else:
        print("update forward + backward, 1 XLA CPU device (median ms, loss):")
    for flags in FLAG_SETS:
        env = {
            **os.environ,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {flags}".strip(),
            "PYTHONPATH": root,
            "OPENBLAS_NUM_THREADS": "1",  # NumPy's reference on one core
            "OMP_NUM_THREADS": "1",
        }
        out = subprocess.run(
            [sys.executable, "-c", DECODE_CHILD if decode else CHILD],
            env=env,
            capture_output=True,
            text=True,
            cwd=root,
        )
        line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "failed"
        print(f"  {flags or '(defaults)':<60} {line}")


if __name__ == "__main__":
    main()
