"""bf16 against f32 compute on CPU: the policy's forward and forward + backward, a plain
matmul, and the same model in PyTorch (bf16 autocast), side by side in one run.

  python scripts/bench_bf16.py                      # defaults: 2 layers, 2 x 256 tokens
  python scripts/bench_bf16.py --layers=4 --batch=4 --length=256 --no-torch

The model has SmolLM2-135M's layer dimensions (d=576, 9 heads, 3 KV heads of 64, d_ff 1536,
vocab 49152, tied embeddings) with fewer layers and random weights. Each XLA flag set runs in
its own process (XLA reads its flags once), on one XLA CPU device, and times (median of
`--repeats` rounds after a warm-up; within a process the timed calls take turns):

- `matmul`: one [1024, 1024] x [1024, 1024] product in f32, in bf16 with a bf16 result, and in
  bf16 with an f32 result (`preferred_element_type`), the form CPU bf16 units accumulate in;
- `forward`: the policy's logits at every slot and their mean next-token NLL (f32 log-softmax);
- `forward+backward`: the gradient of that NLL with respect to the (f32) parameters,

with `model.dtype` float32 and bfloat16 (parameters float32 in both). The PyTorch rows run
`transformers.LlamaForCausalLM` of the same dimensions (f32 weights, `torch.autocast("cpu",
torch.bfloat16)` for bf16) on every core. GFLOP/s are nominal: 2 x tokens x the matmul
parameters (layers and head) plus 4 x B x heads x T^2 x head_dim for attention, forward;
three times that for forward + backward; the same count for both frameworks, so ratios compare
like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

# XLA CPU options that might route bf16 products to a library kernel (oneDNN, XNNPACK, YNNPACK)
# or change the instruction set; each runs in its own process.
FLAG_SETS = (
    "",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_experimental_onednn_fusion_type=dot",
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_experimental_xnn_fusion_type=dot",
    "--xla_cpu_experimental_ynn_fusion_type=dot",
)

D_MODEL, HEADS, KV_HEADS, HEAD_DIM, D_FF, VOCAB = 576, 9, 3, 64, 1536, 49152


def nominal_flops(layers: int, batch: int, length: int, vocab: int) -> float:
    """Forward FLOPs: matmuls of the layers and the head, and the full attention square."""
    per_layer = (
        D_MODEL * HEADS * HEAD_DIM * 2 + D_MODEL * KV_HEADS * HEAD_DIM * 2 + 3 * D_MODEL * D_FF
    )
    tokens = batch * length
    attn = 4 * batch * HEADS * length * length * HEAD_DIM
    return 2.0 * tokens * (layers * per_layer + D_MODEL * vocab) + layers * attn


def interleaved_s(fns: dict, repeats: int) -> dict:
    """Median seconds of each function over `repeats` rounds (after a warm-up call each),
    calling them in turn within a round: load from other processes that comes and goes hits
    all of them alike, so their ratios are steadier than their absolute times."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def jax_child(args) -> dict:
    """Times of the matmuls and the policy in f32 and bf16 under this process's XLA flags."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rl4agents.models import policy as policy_lib

    a = jax.random.normal(jax.random.key(0), (1024, 1024), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (1024, 1024), jnp.float32)
    ab, bb = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    dot, dot_f32 = jax.jit(jnp.dot), jax.jit(partial(jnp.dot, preferred_element_type=jnp.float32))
    mm = {
        "matmul f32": lambda: dot(a, b).block_until_ready(),
        "matmul bf16->bf16": lambda: dot(ab, bb).block_until_ready(),
        "matmul bf16->f32": lambda: dot_f32(ab, bb).block_until_ready(),
    }
    out = {k: 2 * 1024**3 / secs / 1e9 for k, secs in interleaved_s(mm, 5 * args.repeats).items()}
    fwd_flops = nominal_flops(args.layers, args.batch, args.length, args.vocab)
    tokens = jax.random.randint(jax.random.key(2), (args.batch, args.length), 0, args.vocab)
    positions = jnp.broadcast_to(jnp.arange(args.length), tokens.shape)
    mask = jnp.broadcast_to(
        jnp.tril(jnp.ones((args.length, args.length), bool)), (args.batch,) + (args.length,) * 2
    )
    fns, flops = {}, {}
    for dtype in ("float32", "bfloat16"):
        cfg = policy_lib.make_config(
            "tiny",
            args.vocab,
            d_model=D_MODEL,
            num_layers=args.layers,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            d_ff=D_FF,
            tie_embeddings=True,
            rope_theta=1e5,
            dtype=dtype,
        )
        graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))

        def nll(p, graphdef=graphdef):
            logits = nnx.merge(graphdef, p)(tokens, positions, mask).logits[:, :-1]
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

        fwd, both = jax.jit(nll), jax.jit(jax.value_and_grad(nll))
        tag = "f32" if dtype == "float32" else "bf16"
        fns[f"forward {tag}"] = lambda fwd=fwd, p=params: fwd(p).block_until_ready()
        fns[f"forward+backward {tag}"] = lambda both=both, p=params: jax.block_until_ready(both(p))
        flops[f"forward {tag}"], flops[f"forward+backward {tag}"] = fwd_flops, 3 * fwd_flops
    for name, secs in interleaved_s(fns, args.repeats).items():
        out[name] = flops[name] / secs / 1e9
    return out


def torch_child(args) -> dict:
    """The same model in PyTorch (transformers' Llama), f32 and bf16 autocast."""
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=D_MODEL,
        intermediate_size=D_FF,
        num_hidden_layers=args.layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        tie_word_embeddings=True,
        rope_theta=1e5,
    )
    model = transformers.LlamaForCausalLM(cfg).float()
    tokens = torch.randint(0, args.vocab, (args.batch, args.length))
    fwd_flops = nominal_flops(args.layers, args.batch, args.length, args.vocab)
    fns, flops = {}, {}
    for tag, autocast in (("f32", False), ("bf16", True)):

        def forward(autocast=autocast):
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                return model(tokens, labels=tokens).loss

        def both(autocast=autocast):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                loss = model(tokens, labels=tokens).loss
            loss.backward()

        fns[f"forward {tag}"], fns[f"forward+backward {tag}"] = forward, both
        flops[f"forward {tag}"], flops[f"forward+backward {tag}"] = fwd_flops, 3 * fwd_flops
    return {
        name: flops[name] / secs / 1e9 for name, secs in interleaved_s(fns, args.repeats).items()
    }


def run_child(args, kind: str, flags: str) -> dict | str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {flags}".strip(),
        "PYTHONPATH": root,
    }
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={kind}"] + [
        f"--{k}={getattr(args, k)}" for k in ("layers", "batch", "length", "vocab", "repeats")
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"failed: {tail[:120]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratio(row: dict, key: str) -> str:
    f32, bf16 = row.get(f"{key} f32"), row.get(f"{key} bf16")
    return f"{bf16 / f32:.2f}" if f32 and bf16 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fn = jax_child if args.child == "jax" else torch_child
        print(json.dumps(fn(args)))
        return
    print(
        f"{args.layers} layers of d={D_MODEL}, vocab {args.vocab}, {args.batch} x {args.length} "
        f"tokens; nominal GFLOP/s (median of {args.repeats}); bf16/f32 = speed ratio; the "
        "defaults run first and last (their spread is the machine's noise)"
    )
    cols = (
        "matmul f32",
        "matmul bf16->bf16",
        "matmul bf16->f32",
        "forward f32",
        "forward bf16",
        "forward+backward f32",
        "forward+backward bf16",
    )
    print("| run | " + " | ".join(cols) + " | fwd bf16/f32 | fwd+bwd bf16/f32 |")
    print("|---" * (len(cols) + 3) + "|")
    # the defaults once more at the end: the spread of the two rows is the machine's noise
    runs = [("jax", flags) for flags in FLAG_SETS] + [("jax", "")]
    if not args.no_torch:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401

            runs.append(("torch", ""))
        except ImportError:
            print("(PyTorch or transformers not importable: no PyTorch rows)")
    for kind, flags in runs:
        row = run_child(args, kind, flags)
        name = "PyTorch" if kind == "torch" else f"JAX {flags or '(default flags)'}"
        if isinstance(row, str):
            print(f"| {name} | {row} |")
            continue
        cells = [f"{row[c]:.0f}" if c in row else "-" for c in cols]
        fwd, both = ratio(row, "forward"), ratio(row, "forward+backward")
        print(f"| {name} | " + " | ".join(cells) + f" | {fwd} | {both} |", flush=True)


if __name__ == "__main__":
    main()
