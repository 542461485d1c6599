"""How far bf16 compute moves a checkpoint's predictions: the same float32 weights, f32 vs bf16.

  python scripts/bf16_tolerance.py --model=runs/models/smollm2-135m-instruct --torch \
      --out=experiments/results/real_model/bf16_tolerance
  python scripts/bf16_tolerance.py --model=DIR            # ours only, print the table

Loads the folder twice with `hf.load_pretrained`, both times with float32 parameters, computing
once in float32 and once in bfloat16 (`model.dtype="bfloat16"`, `model.param_dtype="float32"`,
as training runs it: bf16 matrix products that accumulate in f32, f32 norms, softmax and
logits), and scores the four prompts of `scripts/check_parity.py` (two chats, prose, code; four
random token sequences without a tokenizer in the folder), teacher-forced, each as if alone.
Per prompt and over all of them, bf16 against f32:

- max and mean |Δ log p| of the prompt's own next tokens (the n - 1 positions that have one);
- max |Δ entropy| of the next-token distribution, max |Δ logit| and the largest |logit| (f32),
  over all n positions;
- same argmax: the share of the n positions whose most likely next token is the same.

With `--torch`, the same for `transformers` on the same folder: float32 against
`torch.autocast("cpu", dtype=torch.bfloat16)` (bf16 products, activations and logits).

Writes to --out (optional): tolerance.json (the numbers, the tool versions and the processor),
tolerance.md (the table) and command.txt (the command, appended).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import jax  # noqa: E402
import numpy as np  # noqa: E402
from check_parity import prompts  # noqa: E402  (scripts/, beside this file)

from rl4agents import config_utils, provenance  # noqa: E402
from rl4agents.models import hf, parity  # noqa: E402
from rl4agents.train import writers  # noqa: E402

JSON_NAME, MD_NAME = "tolerance.json", "tolerance.md"
RUNS = (("ours", "ours, bf16 vs f32"), ("torch", "PyTorch autocast bf16 vs f32"))
COLUMNS = (  # key, title, format
    ("max_dlogp", "max \\|Δ log p\\|", "{:.3g}"),
    ("mean_dlogp", "mean \\|Δ log p\\|", "{:.3g}"),
    ("max_dentropy", "max \\|Δ entropy\\|", "{:.3g}"),
    ("max_dlogit", "max \\|Δ logit\\|", "{:.3g}"),
    ("max_logit", "max \\|logit\\|", "{:.3g}"),
    ("same_argmax", "same argmax", "{:.1%}"),
)


def parse_args(argv):
    ap = config_utils.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Local Hugging Face checkpoint folder.")
    ap.add_argument("--out", default="", help="Folder for tolerance.json/.md and command.txt.")
    ap.add_argument("--torch", action="store_true", help="Also measure PyTorch autocast.")
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model={args.model!r} holds no config.json; allowed: a HF checkpoint folder")
    if args.out:
        config_utils.check_workdir("--out", args.out)
    return args


def our_logits(policy, seqs: list[list[int]], pad_id: int) -> list[np.ndarray]:
    """f32[n, V] logits of our policy at each of a prompt's n positions, per prompt of `seqs`
    (token ids), all in one right-filled batch (each row computes as if alone)."""
    tokens, positions, mask, _ = parity.batch(seqs, pad_id, left=False)
    logits = parity.our_logits(policy, tokens, positions, mask)
    return [logits[row, : len(seq)] for row, seq in enumerate(seqs)]


def torch_logits(ref, seqs: list[list[int]], pad_id: int, bf16: bool) -> list[np.ndarray]:
    """f32[n, V] logits of a float32 transformers causal LM per prompt, as `our_logits`; with
    `bf16` under `torch.autocast("cpu", dtype=torch.bfloat16)` (its bf16 logits cast to f32)."""
    import torch

    tokens = torch.tensor(parity.batch(seqs, pad_id, left=False)[0], dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        logits = ref(tokens).logits.float().numpy()
    return [logits[row, : len(seq)] for row, seq in enumerate(seqs)]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _per_position(a: np.ndarray, b: np.ndarray, seq: list[int]) -> dict[str, np.ndarray]:
    la, lb = _log_softmax(a), _log_softmax(b)
    at, nxt = np.arange(len(seq) - 1), np.asarray(seq[1:])
    entropy = lambda lp: -(np.exp(lp) * lp).sum(-1)
    return dict(
        dlogp=np.abs(la[at, nxt] - lb[at, nxt]),
        dentropy=np.abs(entropy(la) - entropy(lb)),
        dlogit=np.abs(a.astype(np.float64) - b).max(-1),
        logit=np.abs(a).max(-1).astype(np.float64),
        same=a.argmax(-1) == b.argmax(-1),
    )


def _summary(p: dict[str, np.ndarray]) -> dict:
    return dict(
        tokens=int(p["same"].size),
        max_dlogp=float(p["dlogp"].max()),
        mean_dlogp=float(p["dlogp"].mean()),
        max_dentropy=float(p["dentropy"].max()),
        max_dlogit=float(p["dlogit"].max()),
        max_logit=float(p["logit"].max()),
        same_argmax=float(p["same"].mean()),
    )


def tolerance(a: list[np.ndarray], b: list[np.ndarray], seqs: list[list[int]]) -> dict:
    """Differences between two runs' logits, `a` (the f32 run) and `b`, each a list of f32[n, V]
    per prompt of `seqs` (token ids, n >= 2 each). Returns {"prompts": [one dict per prompt],
    "all": the same dict over every position of every prompt}, each dict of floats:

      tokens        n, the positions (next-token distributions) compared
      max_dlogp     max |Δ log p| of the prompt's own next tokens (its n - 1 positions with one)
      mean_dlogp    their mean
      max_dentropy  max |Δ entropy| of the next-token distribution (nats)
      max_dlogit    max |Δ logit| over the positions and the vocabulary
      max_logit     the largest |logit| of `a`
      same_argmax   the share of positions whose argmax is the same

    Log-softmax and entropy are computed in float64 from the logits."""
    per = [_per_position(x, y, s) for x, y, s in zip(a, b, seqs, strict=True)]
    joined = {k: np.concatenate([p[k] for p in per]) for k in per[0]}
    return dict(prompts=[_summary(p) for p in per], all=_summary(joined))


def markdown(result: dict) -> str:
    lines = [
        "| compute | prompt (positions) | " + " | ".join(t for _, t, _ in COLUMNS) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in COLUMNS) + " |",
    ]
    for key, title in RUNS:
        if key not in result["tolerance"]:
            continue
        run = result["tolerance"][key]
        rows = list(zip(result["prompts"], run["prompts"], strict=True)) + [("all", run["all"])]
        for name, row in rows:
            cells = [fmt.format(row[k]) for k, _, fmt in COLUMNS]
            lines.append(f"| {title} | {name} ({row['tokens']}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"`{result['model']}`, the same float32 weights computed in float32 and in bfloat16, "
        f"teacher-forced on each prompt alone. Δ log p: the log-prob of each of the prompt's own "
        f"next tokens (n - 1 per prompt); entropy, logits ({result['vocab_size']:,} per "
        f"position) and argmax: all n positions. Max |logit|: the f32 run's.",
    ]
    return "\n".join(lines) + "\n"


def run(args) -> dict:
    t0 = time.perf_counter()
    f32, cfg = hf.load_pretrained(args.model, "float32")
    bf16, cfg16 = hf.load_pretrained(args.model, "bfloat16", param_dtype="float32")
    names, seqs, pad_id = prompts(args.model, cfg.vocab_size)
    found = {"ours": tolerance(our_logits(f32, seqs, pad_id), our_logits(bf16, seqs, pad_id), seqs)}
    versions = dict(jax=jax.__version__)
    if args.torch:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        ref = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        ref.eval()
        a, b = (torch_logits(ref, seqs, pad_id, bf16=on) for on in (False, True))
        found["torch"] = tolerance(a, b, seqs)
        versions.update(torch=torch.__version__, transformers=transformers.__version__)
    return dict(
        model=os.path.basename(os.path.normpath(args.model)),
        architecture=hf.model_type_for(cfg),
        layers=cfg.num_layers,
        vocab_size=cfg.vocab_size,
        ours_bf16=dict(dtype=cfg16.dtype, param_dtype=cfg16.param_dtype),
        prompts=names,
        prompt_tokens=[len(s) for s in seqs],
        tolerance=found,
        seconds=round(time.perf_counter() - t0, 1),
        versions=versions,
        host=provenance.host(),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    result = run(args)
    table = markdown(result)
    print(table, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_text(os.path.join(args.out, JSON_NAME), json.dumps(result, indent=2))
        writers.write_text(os.path.join(args.out, MD_NAME), table)
        writers.append_command(args.out, "scripts/bf16_tolerance.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
