"""What compiling a run's train step costs: lowering and compile seconds, XLA's memory figures.

    python scripts/compile_cost.py --config=configs/real_model.py:guess_number
    python scripts/compile_cost.py --config=configs/real_model.py:guess_number --layers=8 \
        --set=model.scan_layers=False --set=model.remat=False

Builds the run's experiment (as `scripts/train.py` would, nothing trained or evaluated),
lowers and compiles its jitted train step on the abstract state and prints one JSON line:
`layers`, the `--set` overrides, `lower_s`, `compile_s`, the compiled program's
`temp_gib`, `argument_gib` and `output_gib` per device (`memory_analysis`), the size of its
optimised HLO (`hlo_lines`, `fusions`) and the process's peak resident memory
(`peak_rss_gib`). `--layers=N` runs on the first N layers of the config's pretrained
checkpoint (`model.checkpoint`), written to a temporary folder: how compile time and memory
grow with depth without compiling the whole model. One XLA CPU device per core, as
`scripts/train.py` runs.

    python scripts/compile_cost.py --table=FILE.jsonl   # those lines as a Markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _cores  # noqa: E402,F401  (one XLA CPU device per core; before JAX starts)


def _parse_value(old, text: str):
    if isinstance(old, bool):
        if text not in ("True", "False"):
            raise ValueError(f"{text!r}; allowed: True or False")
        return text == "True"
    return type(old)(text)


def truncated_checkpoint(folder: str, layers: int, out: str) -> str:
    """A copy of the HF checkpoint `folder` holding only its first `layers` layers, in `out`."""
    from safetensors.numpy import load_file, save_file

    with open(os.path.join(folder, "config.json")) as f:
        hf_config = json.load(f)
    total = hf_config["num_hidden_layers"]
    if not 1 <= layers <= total:
        raise ValueError(f"--layers={layers}; allowed: 1 to {total} (the checkpoint's layers)")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(folder):
        if name not in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(folder, name), out)
    hf_config["num_hidden_layers"] = layers
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config, f)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    layer_of = re.compile(r"model\.layers\.(\d+)\.")
    kept = {k: v for k, v in tensors.items() if not (m := layer_of.match(k)) or int(m[1]) < layers}
    save_file(kept, os.path.join(out, "model.safetensors"))
    return out


TABLE_COLUMNS = ("layers", "set", "compile_s", "temp_gib", "hlo_lines", "peak_rss_gib")


def markdown_table(records: list[dict]) -> str:
    """The records (this script's JSON lines) as a Markdown table of `TABLE_COLUMNS`."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in records:
        cells = [" ".join(f"`{x}`" for x in r["set"]) or "(config)" if k == "set" else r[k]
                 for k in TABLE_COLUMNS]  # fmt: skip
        lines.append("| " + " | ".join(f"{c:,}" if isinstance(c, int) else str(c)
                                       for c in cells) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile a run's train step and report the cost.")
    p.add_argument("--config", help="config file[:argument], as train.py takes")
    p.add_argument("--table", help="print this JSON-lines file of results as Markdown")
    p.add_argument("--layers", type=int, default=0, help="first N layers of the checkpoint")
    p.add_argument("--set", action="append", default=[], help="key=value config override")
    args = p.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(markdown_table([json.loads(line) for line in f if line.strip()]))
        return 0
    if not args.config:
        print("error: --config (or --table) is required", file=sys.stderr)
        return 2

    from rl4agents.config_utils import load_config
    from rl4agents.train import experiment as experiment_lib

    config = load_config(args.config)
    config.unlock()
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep:
            print(f"error: --set={item!r}; allowed: key=value", file=sys.stderr)
            return 2
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[last] = _parse_value(node[last], text)
    with tempfile.TemporaryDirectory() as tmp:
        if args.layers:
            config.model.checkpoint = truncated_checkpoint(
                config.model.checkpoint, args.layers, os.path.join(tmp, "model")
            )
        config.lock()
        exp = experiment_lib.build(config)
        state = exp.abstract_state()
        t0 = time.perf_counter()
        lowered = exp.train_step.lower(state, exp.root_key())
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    ma = compiled.memory_analysis()
    hlo = compiled.as_text()
    gib = 2.0**30
    print(
        json.dumps(
            {
                "config": args.config,
                "layers": exp.model_cfg.num_layers,
                "set": args.set,
                "lower_s": round(t1 - t0, 1),
                "compile_s": round(t2 - t1, 1),
                "temp_gib": round(ma.temp_size_in_bytes / gib, 3),
                "argument_gib": round(ma.argument_size_in_bytes / gib, 3),
                "output_gib": round(ma.output_size_in_bytes / gib, 3),
                "hlo_lines": hlo.count("\n"),
                "fusions": len(re.findall(r"^\s*\S+ = \S+ fusion\(", hlo, re.M)),
                "peak_rss_gib": round(
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2
                ),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
