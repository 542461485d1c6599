"""Two small fusions, each side by side with the program it replaced, in one process.

  python scripts/bench_fusions.py [--pairs 30]

- `qkv`: the update's teacher-forced forward + backward (`scripts/bench_attention.py`'s
  action-slot pass: 16 rows, T=473, the 128 action slots scored; one XLA CPU device) with the
  q, k and v projections as one matmul (`Attention._qkv`, the model as it is) against three
  separate products (the model before).
- `qkv_gen`: the same two models on the generation job below (decode steps, 16 rows per
  device).
- `prefill`: the generation job of `scripts/bench.py --vs-peers` (32 prompts of 64 tokens, 64
  sampled tokens; one device per core) with the prompt prefill reading only the keys up to its
  chunk's end (the rollout as it is) against reading the whole 129-slot cache (before; the
  prefill's start passed as a traced value, so its mask keeps every slot).

The old variant is built by swapping the one function back for the trace, then restored.
Both programs run in the same process and alternate call by call (the order flips every
pair), so a machine whose speed drifts affects both alike; printed are the medians, the
median of the per-pair ratios old / new and its quartiles, and the largest difference of the
outputs (gradients or log-probs), which must be ~0.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import argparse  # noqa: E402
import time  # noqa: E402

import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import profile_ops  # noqa: E402  (the jobs it profiles: the same programs)

from rl4agents import config_utils  # noqa: E402
from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402


def _separate_qkv(self, x):  # the model before: three products
    return self.q_proj(x), self.k_proj(x), self.v_proj(x)


_write = rollout_lib._write


def _write_traced_start(model, ctx, tokens, valid, start):  # the rollout before
    return _write(model, ctx, tokens, valid, jnp.asarray(start, jnp.int32))


def _built(make, module, name, old):
    """(old program, new program): `make()` traced with `module.name = old`, then as it is."""
    new = getattr(module, name)
    setattr(module, name, old)
    try:
        fn_old = make()
    finally:
        setattr(module, name, new)
    return fn_old, make()


def qkv_programs():
    def make():
        grad, args = profile_ops.update_job()
        jax.block_until_ready(grad(*args))  # trace and compile now
        return lambda i: grad(*args)

    return _built(make, policy_lib.Attention, "_qkv", _separate_qkv)


def generation_programs(module, name, old):
    def make():
        fn, (_, params) = profile_ops.rollout_job("gen")
        jax.block_until_ready(fn(jax.random.key(0), params))
        return lambda i: fn(jax.random.key(i), params).logp_behavior

    return _built(make, module, name, old)


def compare(name: str, programs, pairs: int) -> None:
    fn_old, fn_new = programs
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), fn_old(1), fn_new(1))
    times = {"old": [], "new": []}
    for i in range(pairs):
        order = (
            (("old", fn_old), ("new", fn_new)) if i % 2 == 0 else (("new", fn_new), ("old", fn_old))
        )
        for label, fn in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fn(i + 2))
            times[label].append(time.perf_counter() - t0)
    old, new = np.array(times["old"]), np.array(times["new"])
    ratio = old / new
    q25, q50, q75 = np.quantile(ratio, [0.25, 0.5, 0.75])
    print(
        f"{name}: old median {np.median(old):.4f} s, new median {np.median(new):.4f} s; "
        f"old / new per pair: median {q50:.3f}x (quartiles {q25:.3f}-{q75:.3f}) over {pairs} "
        f"pairs; largest output difference {max(jax.tree.leaves(diff)):.2e}"
    )


def main() -> None:
    ap = config_utils.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--pairs", type=int, default=30, help="alternating (old, new) call pairs")
    ap.add_argument("--only", choices=["qkv", "qkv_gen", "prefill"], default=None)
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error(f"--pairs={args.pairs}; allowed: >= 1")
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s)")
    if args.only in (None, "qkv"):
        with jax.default_device(jax.devices()[0]):
            compare("qkv (update fwd + bwd, 1 device)", qkv_programs(), args.pairs)
    if args.only in (None, "qkv_gen"):
        programs = generation_programs(policy_lib.Attention, "_qkv", _separate_qkv)
        compare("qkv (generation job)", programs, args.pairs)
    if args.only in (None, "prefill"):
        programs = generation_programs(rollout_lib, "_write", _write_traced_start)
        compare("prefill (generation job)", programs, args.pairs)


if __name__ == "__main__":
    main()
