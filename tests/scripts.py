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
