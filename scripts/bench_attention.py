"""Diagnostics behind bench.md's attention figures: one decode step and one attention layer.

  python scripts/bench_attention.py

Times, on one XLA CPU device with the benchmark model (PRESETS["bench"], vocab 512, f32):
- a decode step: prefill 64 tokens into a cache of T slots, then 16 greedy decode steps in a
  `lax.scan` (rows B=16, T in 128, 256, 512); ms per step = (total - prefill alone) / 16;
- the teacher-forced pass's attention (T=480, B=16): forward and forward + backward of the
  whole model with `model.attn_chunk` 0 (one block) and 128 (causal query blocks), if this
  version of the model has that field;
- the update's teacher-forced pass on the multi-turn benchmark's layout (T=473: prompt 72,
  8 turns of 16 action + 39 observation slots, the last observation cut), forward + backward
  scoring every slot and scoring the 128 action slots alone (`rollout.score(slots=)`), if
  this version has that argument.
Medians of 5 calls after a warm-up.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402

ROWS, FILL, STEPS, VOCAB = 16, 64, 16, 512


def median_s(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_ms(graphdef, params, cfg, length: int) -> tuple[float, float]:
    """(prefill ms, ms per decode step) with a cache of `length` slots."""

    def prefill(params, key):
        model = nnx.merge(graphdef, params)
        ctx = rollout_lib._Ctx(
            policy_lib.init_cache(cfg, ROWS, length),
            jnp.zeros((ROWS, length), bool),
            jnp.zeros((ROWS,), jnp.int32),
            jnp.zeros((ROWS, VOCAB)),
        )
        tokens = jax.random.randint(key, (ROWS, FILL), 3, VOCAB)
        return model, rollout_lib._write(model, ctx, tokens, jnp.ones((ROWS, FILL), bool), 0)

    def decode(params, key):
        model, ctx = prefill(params, key)

        def body(ctx, i):
            token = jnp.argmax(ctx.logits, -1).astype(jnp.int32)
            ctx = rollout_lib._write(
                model, ctx, token[:, None], jnp.ones((ROWS, 1), bool), FILL + i
            )
            return ctx, token

        return jax.lax.scan(body, ctx, jnp.arange(STEPS))[1]

    key = jax.random.key(0)
    only_prefill = median_s(jax.jit(lambda p, k: prefill(p, k)[1].logits), params, key)
    total = median_s(jax.jit(decode), params, key)
    return only_prefill * 1e3, (total - only_prefill) / STEPS * 1e3


def update_layout():
    """The multi-turn benchmark's slot layout: prompt 72, 8 turns of 16 action + 39
    observation slots (the update's pass cuts the last observation: T=473)."""
    return rollout_lib.Layout(prompt=72, action=16, obs=39, turns=8, length=512)


def score_loss(cfg, length: int = 480, slots=None):
    """(loss, params): the summed log-probs of the teacher-forced pass over [ROWS, length]
    random tokens as a function of the parameters, scoring every slot or `slots` (int32[R])."""
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(1), (ROWS, length), 3, VOCAB)
    valid = jnp.ones((ROWS, length), bool)
    kw = {} if slots is None else {"slots": jnp.broadcast_to(slots, (ROWS, len(slots)))}

    def loss(p):
        return rollout_lib.score(nnx.merge(graphdef, p), tokens, valid, **kw).logp.sum()

    return loss, params


def forward_ms(cfg, length: int = 480, slots=None) -> tuple[float, float]:
    """(forward ms, forward + backward ms) of `score_loss(cfg, length, slots)`."""
    loss, params = score_loss(cfg, length, slots)
    return median_s(jax.jit(loss), params) * 1e3, median_s(jax.jit(jax.grad(loss)), params) * 1e3


def main() -> None:
    if sys.argv[1:]:  # it takes no arguments
        print(f"error: unexpected arguments: {sys.argv[1:]}", file=sys.stderr)
        sys.exit(2)
    cfg = policy_lib.make_config("bench", VOCAB)
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s)")
    for length in (128, 256, 512):
        pre, step = decode_ms(graphdef, params, cfg, length)
        print(f"decode, cache T={length}: prefill {pre:.1f} ms, {step:.2f} ms per decode step")
    if "attn_chunk" in {f.name for f in dataclasses.fields(cfg)}:
        for chunk in (0, 128):
            fwd, both = forward_ms(dataclasses.replace(cfg, attn_chunk=chunk))
            print(
                f"teacher-forced pass, T=480, attn_chunk={chunk}: forward {fwd:.0f} ms, "
                f"forward + backward {both:.0f} ms"
            )
    if hasattr(rollout_lib, "action_slots"):
        lay = update_layout()
        slots = jnp.asarray(rollout_lib.action_slots(lay))
        cut = lay.length - lay.obs
        times = {}
        for name, sl in (("every slot", None), (f"{len(slots)} action slots", slots)):
            times[name] = forward_ms(cfg, cut, sl)
            fwd, both = times[name]
            print(
                f"teacher-forced pass, T={cut}, scoring {name}: forward {fwd:.0f} ms, "
                f"forward + backward {both:.0f} ms"
            )
        (f0, b0), (f1, b1) = times.values()
        print(f"  action slots alone: forward {f0 / f1:.2f}x, forward + backward {b0 / b1:.2f}x")


if __name__ == "__main__":
    main()
