"""Check an imported Hugging Face checkpoint against `transformers`: logits and greedy decoding.

  python scripts/check_parity.py --model=runs/models/smollm2-135m-instruct --float64 \
      --out=experiments/results/real_model/parity
  python scripts/check_parity.py --model=DIR            # print the table only

Loads the folder twice, with `hf.load_pretrained` (ours) and with
`transformers.AutoModelForCausalLM` (the reference), both in float32 on the CPU, and compares
(`rl4agents.models.parity`):

- logits on four prompts (a chat rendered with the model's chat template, a three-turn chat with
  a system message, prose with numbers, Python code; without a tokenizer in the folder, four
  random token sequences), each alone and all in one left-padded batch: per prompt the largest
  |difference| over all its positions and the whole vocabulary, and the same for log-probs;
- with `--float64`, both float32 runs against the reference in float64: the rounding floor
  that float32 leaves to any implementation, against which the first column is read;
- each prompt alone (a batch of one) against the reference alone, and each side's batch
  against its own result alone: float32 sums are not associative, and a kernel chosen for
  another batch shape rounds differently;
- with `--layers` (and `--float64`), per hidden state along the depth the largest difference
  from the float64 reference, ours and the reference's float32, on the prompt whose logits
  differ most: a wrong operation shows as a jump at one block, rounding as a slow growth;
- `--new_tokens` greedy tokens after the first prompt: our KV-cache decoder against the
  reference's full forwards.

Writes to --out (optional): parity.json (the numbers, the greedy tokens, the tool versions and
the processor), parity.md (the table) and command.txt (the command, appended). Exits with
status 1 when a logit difference exceeds --atol or the greedy tokens differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import jax  # noqa: E402
import numpy as np  # noqa: E402

from rl4agents import provenance  # noqa: E402
from rl4agents.models import hf, hf_tokenizer, parity  # noqa: E402
from rl4agents.train import writers  # noqa: E402

JSON_NAME, MD_NAME = "parity.json", "parity.md"
COLUMNS = (
    ("unpadded", "ours vs reference"),
    ("left_padded", "left-padded batch"),
    ("ours_padded_vs_unpadded", "ours padded vs alone"),
    ("log_probs", "log-probs"),
    ("alone", "each alone"),
    ("ours_batch_vs_alone", "ours batch vs alone"),
    ("reference_batch_vs_alone", "reference batch vs alone"),
    ("ours_vs_reference_f64", "ours vs reference f64"),
    ("reference_f32_vs_f64", "reference f32 vs f64"),
)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Local Hugging Face checkpoint folder.")
    ap.add_argument("--out", default="", help="Folder for parity.json/.md and command.txt.")
    ap.add_argument("--float64", action="store_true", help="Also run the reference in float64.")
    ap.add_argument(
        "--layers", action="store_true", help="Per-layer hidden-state errors (needs --float64)."
    )
    ap.add_argument("--new_tokens", type=int, default=32, help="Greedy tokens to compare.")
    ap.add_argument("--atol", type=float, default=5e-4, help="Largest logit difference allowed.")
    return ap.parse_args(argv)


def prompts(folder: str, vocab_size: int) -> tuple[list[str], list[list[int]], int]:
    """(names, token ids, pad id) of the prompts: `parity.default_prompts` with the folder's
    tokenizer, else random ids."""
    try:
        tok = hf_tokenizer.HFTokenizer(folder)
    except (FileNotFoundError, ValueError):
        names = [f"random_{n}" for n in (37, 58, 27, 18)]
        return names, parity.random_prompts(vocab_size, (37, 58, 27, 18)), 0
    return list(parity.PROMPT_NAMES), parity.default_prompts(tok), tok.pad_id


def markdown(result: dict) -> str:
    keys = [(k, title) for k, title in COLUMNS if k in result["logits"]]
    lines = [
        "| prompt (tokens) | " + " | ".join(title for _, title in keys) + " |",
        "| --- | " + " | ".join("---:" for _ in keys) + " |",
    ]
    for i, (name, n) in enumerate(zip(result["prompts"], result["prompt_tokens"], strict=True)):
        cells = [f"{result['logits'][k][i]:.2e}" for k, _ in keys]
        lines.append(f"| {name} ({n}) | " + " | ".join(cells) + " |")
    g = result["greedy"]
    verdict = "the same" if g["equal"] else f"different from token {g['first_mismatch']}"
    lines += [
        "",
        f"Max |logit difference| over every position and the {result['vocab_size']:,} logits of "
        f"each prompt, float32 (f64: the reference in float64). Greedy, {len(g['ours'])} tokens "
        f"after the first prompt: {verdict}. Bound {result['atol']:g}: "
        f"{'passed' if result['passed'] else 'FAILED'}.",
    ]
    if result.get("hidden_states"):
        layers = result["hidden_states"]
        lines += [
            "",
            f"Hidden states on `{layers['prompt']}`, largest |difference| from the reference in "
            "float64 (0: embeddings; last: after the final norm):",
            "",
            "| state | max abs value | ours | reference f32 | ours' worst position |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for i, row in enumerate(layers["states"]):
            lines.append(
                f"| {i} | {row['max_abs']:.1f} | {row['ours']:.2e} | {row['reference_f32']:.2e} "
                f"| {row['ours_position']} |"
            )
    return "\n".join(lines) + "\n"


def run(args) -> dict:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    policy, cfg = hf.load_pretrained(args.model, "float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    ref.eval()
    names, seqs, pad_id = prompts(args.model, cfg.vocab_size)
    logits = parity.compare(policy, ref, seqs, pad_id, float64=args.float64)
    greedy = parity.greedy_match(policy, ref, seqs[0], args.new_tokens)
    hidden = None
    if args.layers:
        worst_prompt = int(np.argmax(logits["unpadded"]))
        hidden = dict(
            prompt=names[worst_prompt],
            states=parity.layer_errors(policy, ref, seqs[worst_prompt]),
        )
    worst = max(max(logits[k]) for k in ("unpadded", "left_padded", "ours_padded_vs_unpadded"))
    return dict(
        model=os.path.basename(os.path.normpath(args.model)),
        architecture=hf.model_type_for(cfg),
        layers=cfg.num_layers,
        vocab_size=cfg.vocab_size,
        prompts=names,
        prompt_tokens=[len(s) for s in seqs],
        logits=logits,
        greedy=greedy,
        hidden_states=hidden,
        atol=args.atol,
        max_logit_diff=worst,
        passed=bool(worst <= args.atol and greedy["equal"]),
        seconds=round(time.perf_counter() - t0, 1),
        versions=dict(
            jax=jax.__version__, torch=torch.__version__, transformers=transformers.__version__
        ),
        host=provenance.host(),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"check_parity: --model={args.model!r} holds no config.json", file=sys.stderr)
        return 2
    if args.new_tokens < 1:
        print(f"check_parity: --new_tokens={args.new_tokens}; allowed: >= 1", file=sys.stderr)
        return 2
    if args.layers and not args.float64:
        print("check_parity: --layers needs --float64", file=sys.stderr)
        return 2
    if not args.atol > 0:
        print(f"check_parity: --atol={args.atol}; allowed: a number > 0", file=sys.stderr)
        return 2
    result = run(args)
    table = markdown(result)
    print(table, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        writers.write_text(os.path.join(args.out, JSON_NAME), json.dumps(result, indent=2))
        writers.write_text(os.path.join(args.out, MD_NAME), table)
        writers.append_command(args.out, "scripts/check_parity.py", argv)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
