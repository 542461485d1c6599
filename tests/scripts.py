"""Loading a command-line script of `scripts/` as a module, for tests of its functions."""

import importlib.util
import pathlib
import sys
import types

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> types.ModuleType:
    """`scripts/<name>.py` as the module `<name>_script`, imported as when run: registered in
    `sys.modules` (dataclasses look their module up) with `scripts/` on the path while it
    imports (for its helpers beside it, such as `_cores`)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


# A tiny FrozenLake run of `scripts/train.py` (one layer, minimal vocabulary, 8 tasks, no
# progress bar) for tests that drive the command line end to end.
TINY_TRAIN_FLAGS = (
    "--config=configs/frozen_lake.py",
    "--config.env.vocab=minimal",
    "--config.rollout.num_tasks=8",
    "--config.model.num_layers=1",
    "--config.train.max_minutes=0",
    "--config.train.eval_tasks=8",
    "--config.log.progress=False",
)


def train_argv(workdir, *flags: str) -> list[str]:
    """The argv of `scripts/train.py` on the tiny run in `workdir`; later `flags` override
    earlier ones (absl keeps the last value of a flag)."""
    return [sys.executable, "scripts/train.py", f"--workdir={workdir}", *TINY_TRAIN_FLAGS, *flags]
