"""XLA's memory analysis of the teacher-forced scoring pass at each `model.logit_chunk`.

  python scripts/logit_chunk_memory.py --out=experiments/results/real_model/logit_chunk_memory
  python scripts/logit_chunk_memory.py --out=DIR --layers=4 --chunks=0,64 --dtypes=float32

Builds a policy of SmolLM2-135M's dimensions (d_model 576, 9 heads, 3 KV heads, head_dim 64,
d_ff 1536, vocabulary 49152, tied embeddings; `--layers` of its 30 layers, default 2) and, for
each compute dtype (`--dtypes`; float32 parameters either way) and `model.logit_chunk`
(`--chunks`), lowers and compiles two programs of `rollout.score_params` (the scoring function
of the RL update, the reference and old-policy passes and the SFT loss) over `--batch` x
`--length` tokens, every slot valid and scored (no `slots`), temperature 1:

  forward            sum of the target log-probs + sum of the entropies (a scalar)
  forward+backward   the gradient of that sum w.r.t. the parameters

Nothing is executed and nothing large is allocated: the parameters and tokens are abstract
(`nnx.eval_shape`, `jax.ShapeDtypeStruct`), and each program is only compiled for XLA's
`memory_analysis()` of it. It writes under `--out`:

  logit_chunk_memory.csv  one row per (dtype, logit_chunk, pass): XLA's temporaries,
                          arguments, outputs and aliased bytes (GiB, and exact temp bytes),
                          lowering and compile seconds, and the setting.
  logit_chunk_memory.md   the temporaries as a table (chunk sizes across), then every column.
  command.txt             each invocation's command line, appended.

The figures are those of the backend JAX runs on (the CPU here) under the XLA_FLAGS in force
(recorded in command.txt). Bad flags exit 2 with a one-line error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CSV_NAME, MD_NAME = "logit_chunk_memory.csv", "logit_chunk_memory.md"
PASSES = ("forward", "forward+backward")
DTYPES = ("float32", "bfloat16")
# SmolLM2-135M(-Instruct)'s config.json, but for its 30 layers (`--layers`).
SMOLLM2 = dict(
    d_model=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    d_ff=1536,
    rope_theta=100000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
)
SMOLLM2_VOCAB = 49152
COLUMNS = (
    "dtype",
    "logit_chunk",
    "pass",
    "temp_gib",
    "argument_gib",
    "output_gib",
    "alias_gib",
    "temp_bytes",
    "lower_s",
    "compile_s",
    "layers",
    "batch",
    "length",
    "vocab",
    "attn_chunk",
    "remat",
    "param_dtype",
    "backend",
)
GIB = 2.0**30


class FlagError(Exception):
    """A bad command-line flag: main prints it on one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors (unknown flag, bad int) on one line
        raise FlagError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help=f"Folder of {CSV_NAME}, {MD_NAME}, command.txt.")
    ap.add_argument("--layers", type=int, default=2, help="Decoder layers (SmolLM2 has 30).")
    ap.add_argument("--batch", type=int, default=16, help="Rows scored.")
    ap.add_argument("--length", type=int, default=512, help="Slots per row.")
    ap.add_argument("--chunks", default="0,128,32,8", help="model.logit_chunk values (0 = off).")
    ap.add_argument("--dtypes", default="float32,bfloat16", help=f"Compute dtypes, of {DTYPES}.")
    ap.add_argument("--vocab", type=int, default=SMOLLM2_VOCAB, help="Vocabulary size.")
    ap.add_argument("--attn_chunk", type=int, default=128, help="model.attn_chunk (0 = off).")
    ap.add_argument("--remat", action="store_true", help="model.remat (default off).")
    args = ap.parse_args(argv)
    for name, low in (("layers", 1), ("batch", 1), ("length", 2), ("vocab", 2), ("attn_chunk", 0)):
        if getattr(args, name) < low:
            raise FlagError(f"--{name}={getattr(args, name)}; allowed: >= {low}")
    try:
        args.chunks = [int(c) for c in args.chunks.split(",")]
    except ValueError:
        raise FlagError(
            f"--chunks={args.chunks!r}; allowed: comma-separated integers >= 0"
        ) from None
    if any(c < 0 for c in args.chunks) or len(set(args.chunks)) < len(args.chunks):
        raise FlagError(f"--chunks={args.chunks}; allowed: distinct integers >= 0")
    args.dtypes = args.dtypes.split(",")
    if not set(args.dtypes) <= set(DTYPES) or len(set(args.dtypes)) < len(args.dtypes):
        raise FlagError(f"--dtypes={args.dtypes}; allowed: distinct names of {list(DTYPES)}")
    return args


def model_config(args: argparse.Namespace, dtype: str, chunk: int):
    from rl4agents.models import policy as policy_lib

    return policy_lib.ModelConfig(
        vocab_size=args.vocab,
        num_layers=args.layers,
        dtype=dtype,
        param_dtype="float32",
        remat=args.remat,
        attn_chunk=args.attn_chunk,
        logit_chunk=chunk,
        **SMOLLM2,
    )


def measure(cfg, batch: int, length: int) -> list[dict]:
    """XLA's memory analysis of the forward and forward+backward scoring programs of `cfg` over
    [batch, length] tokens (compiled, not run): one dict per pass."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rl4agents.models import policy as policy_lib
    from rl4agents.rollout import rollout as rollout_lib

    graphdef, params = nnx.split(nnx.eval_shape(lambda: policy_lib.Policy(cfg, nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    valid = jax.ShapeDtypeStruct((batch, length), jnp.bool_)

    def forward(p, tok, val):
        sc = rollout_lib.score_params(graphdef, p, tok, val, 1.0)
        return jnp.sum(sc.logp) + jnp.sum(sc.entropy)

    rows = []
    for name, fn in zip(PASSES, (forward, jax.grad(forward)), strict=True):
        t0 = time.perf_counter()
        lowered = jax.jit(fn).lower(params, tokens, valid)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        ma = compiled.memory_analysis()
        if ma is None:
            raise RuntimeError(f"backend {jax.default_backend()!r} reports no memory analysis")
        rows.append(
            {
                "pass": name,
                "temp_gib": round(ma.temp_size_in_bytes / GIB, 4),
                "argument_gib": round(ma.argument_size_in_bytes / GIB, 4),
                "output_gib": round(ma.output_size_in_bytes / GIB, 4),
                "alias_gib": round(ma.alias_size_in_bytes / GIB, 4),
                "temp_bytes": int(ma.temp_size_in_bytes),
                "lower_s": round(t1 - t0, 2),
                "compile_s": round(t2 - t1, 2),
                "backend": jax.default_backend(),
            }
        )
    return rows


def write_outputs(out: str, rows: list[dict]) -> None:
    """The CSV (replaced whole) and the Markdown tables of `rows`."""
    from rl4agents.train import writers

    writers.write_csv(os.path.join(out, CSV_NAME), rows, list(COLUMNS))
    chunks = list(dict.fromkeys(r["logit_chunk"] for r in rows))
    temp = {(r["dtype"], r["pass"], r["logit_chunk"]): r["temp_gib"] for r in rows}
    pivot = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for name in PASSES:
            row = {"dtype": dtype, "pass": name}
            row.update({f"logit_chunk={c}": temp.get((dtype, name, c)) for c in chunks})
            if any(v is not None for k, v in row.items() if k.startswith("logit_chunk")):
                pivot.append(row)
    r0 = rows[0]
    setting = (
        f"{r0['layers']} layers of SmolLM2-135M's dimensions, vocabulary {r0['vocab']}, "
        f"{r0['batch']} x {r0['length']} tokens, every slot scored, attn_chunk "
        f"{r0['attn_chunk']}, remat {r0['remat']}, {r0['param_dtype']} parameters, "
        f"backend {r0['backend']}"
    )
    with open(os.path.join(out, MD_NAME), "w") as f:
        f.write(f"XLA temporaries (GiB) of `rollout.score_params`: {setting}.\n\n")
        f.write(writers.format_table(pivot) + "\n\n")
        f.write(writers.format_table(rows, list(COLUMNS)) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        configs = [
            (dtype, chunk, model_config(args, dtype, chunk))
            for dtype in args.dtypes
            for chunk in args.chunks
        ]
    except (FlagError, ValueError) as e:
        print(f"logit_chunk_memory: {e}", file=sys.stderr)
        return 2
    from rl4agents.train import writers

    os.makedirs(args.out, exist_ok=True)
    writers.append_command(args.out, "scripts/logit_chunk_memory.py", argv, env=("XLA_FLAGS",))
    setting = {
        "layers": args.layers,
        "batch": args.batch,
        "length": args.length,
        "vocab": args.vocab,
        "attn_chunk": args.attn_chunk,
        "remat": args.remat,
        "param_dtype": "float32",
    }
    rows = []
    for i, (dtype, chunk, cfg) in enumerate(configs, 1):
        for r in measure(cfg, args.batch, args.length):
            rows.append({"dtype": dtype, "logit_chunk": chunk, **r, **setting})
            print(
                f"[{i}/{len(configs)}] {dtype} logit_chunk={chunk} {r['pass']}: temporaries "
                f"{r['temp_gib']:.3f} GiB (compile {r['compile_s']:.1f} s)",
                flush=True,
            )
        write_outputs(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
