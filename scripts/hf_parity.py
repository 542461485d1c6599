"""Parity of rl4agents' checkpoint loading with `transformers`, as a Markdown table.

  python scripts/hf_parity.py                                   # tiny random models, 3 seeds
  python scripts/hf_parity.py --out experiments/results/scale/parity.md
  python scripts/hf_parity.py --folder /path/to/local/checkpoint  # any local Llama/Qwen folder

For each architecture (Llama with Llama 3 RoPE scaling; Qwen2 with q/k/v biases and tied
embeddings; Qwen3 with q/k norms and head_dim != hidden/heads) and seed, a random 2-layer model
(hidden 64, 4 heads, 2 KV heads, vocab 128) is built with `transformers` (no download), saved
with `save_pretrained(safe_serialization=True)`, loaded with `rl4agents.models.hf`, and
compared on the logits of random prompts and on greedy continuations; the f32 policy is then
exported and reloaded by `transformers`. Needs the `hf` extra (torch, transformers,
safetensors, tokenizers).
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import platform  # noqa: E402
import shlex  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from rl4agents import config_utils  # noqa: E402
from rl4agents.models import hf, parity  # noqa: E402

transformers.logging.set_verbosity_error()
ARCHS = ("llama", "qwen2", "qwen3")
NOTE = """\
Reading: f32 loading matches transformers to float rounding (about 1e-6 on logits of size 3),
and the export reloads bit-identically. In bf16 the policy keeps RMSNorm, softmax and logit
accumulation in f32 while transformers computes in bf16, so the two bf16 runs differ from each
other by as much as each differs from f32 (about 5e-2); their greedy continuations then part
where two tokens are nearly tied, about as often as transformers' own bf16 and f32 runs do.
"""


def tiny_hf_model(arch: str, seed: int, vocab_size: int = 128):
    """A random 2-layer `transformers` model; norms and biases perturbed away from 1 / 0."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        config = transformers.LlamaConfig(
            **common,
            rope_theta=500000.0,
            rope_scaling={**rope, "original_max_position_embeddings": 64},
        )
        model = transformers.LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**{**common, "tie_word_embeddings": True}, rope_theta=1e6)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**common, head_dim=32, rope_theta=1e6)
        model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def our_logits(policy, tokens: np.ndarray) -> np.ndarray:
    """f32[B, S, V] logits of int32[B, S] tokens under a full causal mask."""
    return parity.our_logits(policy, *parity.batch(tokens.tolist(), 0, left=False)[:3])


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def hf_greedy(model, tokens: np.ndarray, num_new: int) -> np.ndarray:
    prompt = torch.as_tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=num_new,
            do_sample=False,
            pad_token_id=0,
        )
    return out[:, tokens.shape[1] :].numpy()


def measure(folder: str, tokens: np.ndarray, num_new: int, workdir: str) -> dict:
    """All parity numbers for one checkpoint folder."""
    load = lambda dtype: transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    ref32, ref16 = load(torch.float32).eval(), load(torch.bfloat16).eval()
    logits32, logits16 = hf_logits(ref32, tokens), hf_logits(ref16, tokens)
    greedy32, greedy16 = hf_greedy(ref32, tokens, num_new), hf_greedy(ref16, tokens, num_new)
    ours32, cfg = hf.load_pretrained(folder, "float32")
    ours16, _ = hf.load_pretrained(folder, "bfloat16")
    out_f32, out_bf16 = our_logits(ours32, tokens), our_logits(ours16, tokens)
    exported = hf.export_pretrained(ours32, cfg, os.path.join(workdir, "export"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    ours_greedy16 = np.asarray(hf.greedy_generate(ours16, tokens, num_new))
    return dict(
        scale=float(np.abs(logits32).max()),
        f32=float(np.abs(out_f32 - logits32).max()),
        greedy_f32=(np.asarray(hf.greedy_generate(ours32, tokens, num_new)) == greedy32),
        export=float(np.abs(hf_logits(reloaded, tokens) - logits32).max()),
        bf16_vs_f32=float(np.abs(out_bf16 - logits32).max()),
        bf16_vs_bf16=float(np.abs(out_bf16 - logits16).max()),
        hf_bf16_vs_f32=float(np.abs(logits16 - logits32).max()),
        greedy_bf16=(ours_greedy16 == greedy16),
        greedy_bf16_f32=(ours_greedy16 == greedy32),
        greedy_hf16_f32=(greedy16 == greedy32),
    )


def _matches(rows: list[dict], key: str) -> str:
    same = np.concatenate([r[key] for r in rows])  # bool[N, new tokens]
    return f"{int(same.all(axis=1).sum())}/{same.shape[0]} ({int(same.sum())}/{same.size})"


def table(results: dict[str, list[dict]], num_new: int) -> str:
    """Two Markdown tables: logit differences, and greedy continuations."""
    logits = (
        "| architecture | max abs logit (HF f32) | f32: max abs diff vs HF f32 "
        "| export -> transformers: max abs diff | bf16: max abs diff vs HF f32 "
        "| bf16: max abs diff vs HF bf16 | HF bf16 vs HF f32 (for scale) |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    greedy = (
        "| architecture | f32 = HF f32 | bf16 = HF bf16 | bf16 = HF f32 "
        "| HF bf16 = HF f32 (for scale) |\n|---|---|---|---|---|\n"
    )
    for name, rows in results.items():
        worst = lambda key, rows=rows: max(r[key] for r in rows)  # noqa: E731
        logits += (
            f"| {name} | {worst('scale'):.2f} | {worst('f32'):.2e} | {worst('export'):.2e} | "
            f"{worst('bf16_vs_f32'):.2e} | {worst('bf16_vs_bf16'):.2e} | "
            f"{worst('hf_bf16_vs_f32'):.2e} |\n"
        )
        greedy += (
            f"| {name} | {_matches(rows, 'greedy_f32')} | {_matches(rows, 'greedy_bf16')} | "
            f"{_matches(rows, 'greedy_bf16_f32')} | {_matches(rows, 'greedy_hf16_f32')} |\n"
        )
    return (
        f"Logits, max abs difference over all prompts, positions, vocabulary and seeds:\n\n"
        f"{logits}\nGreedy continuations of {num_new} tokens: sequences identical / sequences "
        f"(positions equal / positions):\n\n{greedy}"
    )


def main() -> None:
    parser = config_utils.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="random models per architecture")
    parser.add_argument("--batch", type=int, default=4, help="prompts per model")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=8, help="greedy continuation length")
    parser.add_argument("--folder", help="measure one local checkpoint folder instead")
    parser.add_argument("--out", help="also write the Markdown report here")
    args = parser.parse_args()
    for name in ("seeds", "batch", "prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}; allowed: >= 1")
    if args.folder and not os.path.isfile(os.path.join(args.folder, "config.json")):
        parser.error(f"--folder={args.folder!r} has no config.json; allowed: a HF checkpoint")
    if args.out:
        config_utils.check_output_file("--out", args.out)
    start = time.time()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as work:
        if args.folder:
            vocab = hf.read_config(args.folder)["vocab_size"]
            prompt = np.random.default_rng(0).integers(0, vocab, (args.batch, args.prompt_len))
            results[args.folder] = [measure(args.folder, prompt, args.new_tokens, work)]
        for arch in () if args.folder else ARCHS:
            for seed in range(args.seeds):
                folder = os.path.join(work, f"{arch}_{seed}")
                tiny_hf_model(arch, seed).save_pretrained(folder, safe_serialization=True)
                rng = np.random.default_rng(1000 + seed)
                prompt = rng.integers(0, 128, (args.batch, args.prompt_len))
                row = measure(folder, prompt, args.new_tokens, os.path.join(work, "x"))
                results.setdefault(arch, []).append(row)
                print(f"{arch} seed {seed}: f32 {row['f32']:.2e}", flush=True)
    report = table(results, args.new_tokens)
    command = "python " + " ".join(shlex.quote(a) for a in ["scripts/hf_parity.py", *sys.argv[1:]])
    what = args.folder or (
        f"{args.seeds} random models per architecture, {args.batch} prompts of "
        f"{args.prompt_len} tokens each"
    )
    versions = (
        f"jax {jax.__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {platform.machine()} CPU"
    )
    text = (
        "# Checkpoint parity with transformers\n\n"
        f"Command: `{command}` ({time.time() - start:.0f} s; {versions}).\n\n"
        f"{what}.\n\n{report}\n{NOTE}"
    )
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
