"""Where a benchmark job's device time goes: XLA CPU ops summed by kind, from a profiler trace.

  python scripts/profile_ops.py gen       # the single-turn generation job of bench.py
  python scripts/profile_ops.py rollout   # the multi-turn FrozenLake rollout of bench.py
  python scripts/profile_ops.py update    # the update's forward + backward (one device)
  python scripts/profile_ops.py real_update --model=DIR [--dtype=bfloat16]
                                          # bench.py --real-model's GRPO step on that model

`gen` runs `scripts/bench.py --vs-peers`'s generation job (32 prompts of 64 tokens, 64 sampled
tokens) and `rollout` its multi-turn rollout (4 maps x 8 samples, 8 turns of 16 action tokens,
4 turn groups), both on the CPU mesh of `scripts/train.py` (one device per core); `update`
runs the teacher-forced forward + backward of `scripts/bench_attention.py` (16 rows, T=473,
the 128 action slots scored) on one device; `real_update` the whole GRPO step (forward,
backward, gradient all-reduce, AdamW) of `scripts/bench.py --real-model` on a Hugging Face
folder (SmolLM2-135M-Instruct: 8 rows x 96 slots, two CPU devices). After two warm-up
calls, `--calls` calls run under `jax.profiler.trace`; the trace's XLA ops are summed over
devices and calls and printed per call: by fusion kind, and the YNNPACK fusions (dots,
softmax reductions) by output shape, so decode steps ([rows, ...] with one query) and
prefills ([rows x slots, ...]) show apart.
The profiler slows the program (wall time under it is printed, and is not the benchmark's
time); read the shares, not the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
if "update" in sys.argv[1:]:  # one device, as scripts/bench_attention.py
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
import _cores  # noqa: E402,F401  (one XLA CPU device per core otherwise; before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from benchlib import jobs, peer_lake, peer_single  # noqa: E402
from flax import nnx  # noqa: E402

from rl4agents import config_utils, sharding  # noqa: E402
from rl4agents.models import policy as policy_lib  # noqa: E402
from rl4agents.rollout import rollout as rollout_lib  # noqa: E402

_SKIP = ("$", "end:", "Thunk", "Slinky", "while", "PjitFunction", "Rendezvous", "Wait:")


def rollout_job(job: str):
    """(jitted fn, args) of the benchmark's generation job or multi-turn rollout."""
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (-1, 1, 1))
    cfg = policy_lib.make_config("bench", peer_single.VOCAB)
    graphdef, params = nnx.split(policy_lib.Policy(cfg, nnx.Rngs(0)))
    params = jax.device_put(params, sharding.replicated(mesh))
    if job == "gen":  # as scripts/bench.py's `our_jobs`
        env, rcfg, task_keys = (
            peer_single.RandomPrompt(max_completion=64, eos=False),
            peer_single.gen_rollout_config(),
            None,
        )
    else:
        env, rcfg = peer_lake.PeerLake(), peer_lake.rollout_config(4)
        task_keys = peer_lake.task_keys(peer_lake.NUM_MAPS)
    fn = jobs.make_rollout_fn(graphdef, env, env.default_params(), rcfg, mesh, task_keys=task_keys)
    return fn, (jax.random.key(7), params)


def update_job():
    """(jitted fn, args) of `scripts/bench_attention.py`'s update pass, action slots scored."""
    import bench_attention  # a sibling script (this folder is on the path)

    lay = bench_attention.update_layout()
    slots = jnp.asarray(rollout_lib.action_slots(lay))
    cfg = policy_lib.make_config("bench", bench_attention.VOCAB)
    loss, params = bench_attention.score_loss(cfg, lay.length - lay.obs, slots)
    return jax.jit(jax.grad(loss)), (params,)


def real_update_job(folder: str, dtype: str, sizes=None):
    """(jitted fn, args) of `scripts/bench.py --real-model`'s GRPO step on `folder` at `sizes`
    (default the benchmark's), as its `setup` builds it (the batch's old log-probs are the
    float32 policy's), without donation."""
    import transformers
    from benchlib import real_model

    from rl4agents.models import hf

    sizes = sizes or real_model.Sizes()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompts = real_model.chat_prompts(tokenizer, sizes.prompts, sizes.prompt_len)
    batch = real_model.grpo_batch(tokenizer, prompts, sizes.group, sizes.new_tokens)
    n = real_model.data_size(int(np.gcd(sizes.prompts, sizes.group)), jax.device_count())
    mesh = sharding.make_mesh(("data", "fsdp", "tensor"), (n, 1, 1), devices=jax.devices()[:n])
    policy, cfg = hf.load_pretrained(folder, "float32")
    params = jax.device_put(nnx.split(policy)[1], sharding.replicated(mesh))
    logp = jax.jit(real_model.completion_logp, static_argnums=0)(
        real_model.graphdef_for(cfg, "float32"), params, batch
    )
    batch = real_model.with_old_logp(batch, logp)
    batch = real_model.Batch(
        *(jax.device_put(x, sharding.batch_sharding(mesh, x.ndim)) for x in batch)
    )
    opt_state = jax.device_put(real_model.optimizer().init(params), sharding.replicated(mesh))
    step = real_model.make_grpo_step(real_model.graphdef_for(cfg, dtype), mesh, donate=False)
    return step, (params, opt_state, batch)


def op_table(trace_dir: str, calls: int) -> tuple[collections.Counter, collections.Counter]:
    """(ms per call by op name, op count per call) from the trace's complete events."""
    path = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)[0]
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    ms, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(_SKIP):
            ms[e["name"]] += e.get("dur", 0) / 1e3 / calls
            count[e["name"]] += 1 / calls
    return ms, count


def main(argv=None) -> int:
    ap = config_utils.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("job", choices=["gen", "rollout", "update", "real_update"])
    ap.add_argument("--model", default="", help="real_update: a Hugging Face model folder")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--calls", type=int, default=3, help="profiled calls")
    ap.add_argument("--top", type=int, default=12, help="rows per table")
    args = ap.parse_args(argv)
    for name in ("calls", "top"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}={getattr(args, name)}; allowed: >= 1")
    if args.job == "real_update":
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            ap.error(f"--model={args.model!r} holds no config.json; allowed: a model folder")
        fn, fn_args = real_update_job(args.model, args.dtype)
    elif args.job == "update":
        fn, fn_args = update_job()
    else:
        fn, fn_args = rollout_job(args.job)
    for _ in range(2):
        jax.block_until_ready(fn(*fn_args))
    trace_dir = tempfile.mkdtemp(prefix="profile_ops_")
    t0 = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(args.calls):
            jax.block_until_ready(fn(*fn_args))
    wall = (time.perf_counter() - t0) / args.calls
    ms, count = op_table(trace_dir, args.calls)
    shapes = {}
    hlo = fn.lower(*fn_args).compile().as_text()
    for m in re.finditer(r"^\s+%(\S+) = (\S+) fusion\(.*?op_name=\"([^\"]*)\"", hlo, re.M):
        shapes[m.group(1)] = (m.group(2).split("{")[0], m.group(3).split("/")[-1])
    total = sum(ms.values())
    print(
        f"{args.job}: {jax.device_count()} device(s), {wall * 1e3:.0f} ms per call under the "
        f"profiler; XLA ops {total:.0f} ms per call, summed over devices"
    )
    kinds = collections.Counter()
    for name, t in ms.items():
        kinds[name.split(".")[0]] += t
    print("\n| op kind | ms per call | share |\n|---|---|---|")
    for kind, t in kinds.most_common(args.top):
        print(f"| {kind} | {t:.1f} | {t / total:.1%} |")
    by_shape, n_shape = collections.Counter(), collections.Counter()
    for name, t in ms.items():
        if name.startswith("ynn_fusion") and name in shapes:
            by_shape[shapes[name]] += t
            n_shape[shapes[name]] += count[name]
    print("\n| YNNPACK fusion output | op | calls per call | ms per call | share |")
    print("|---|---|---|---|---|")
    for (shape, op), t in by_shape.most_common(args.top):
        n = n_shape[(shape, op)]
        print(f"| `{shape}` | {op} | {n:.0f} | {t:.1f} | {t / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
