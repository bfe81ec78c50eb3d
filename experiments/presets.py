"""The one preset loader: `configs/<file>.py[:arg]` -> the ConfigDict `--config=` gives `spade_jax.main`.

A spec is a preset file, as a path from the repository root (`configs/tiny.py:runlocal`) or an
absolute one, or a preset's name (`tiny:runlocal` for `configs/tiny.py`); after the colon, the
preset's argument (`get_config(arg)`). The presets in `configs/` are imported as the `configs`
package (so one preset may import another); any other file is loaded from its path.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def names() -> list[str]:
    """The presets in `configs/`."""
    return sorted(p.stem for p in CONFIGS.glob("*.py") if not p.name.startswith("_"))


def split(spec: str) -> tuple[Path, str]:
    """(the preset file's absolute path, its argument, "" when none) of ``spec``."""
    path, _, arg = spec.partition(":")
    file = Path(path)
    if file.suffix != ".py":
        file = CONFIGS / f"{path}.py"
    elif not file.is_absolute():
        file = REPO / file
    if not file.is_file():
        raise ValueError(f"no preset file {file} for {spec!r}: give configs/<name>.py[:arg] (from the repository "
                         f"root), an absolute path, or a name of {names()}")
    return file, arg


def module(spec: str):
    """The preset's module (its docstring is its command)."""
    file, _ = split(spec)
    if file.parent == CONFIGS:
        return importlib.import_module(f"configs.{file.stem}")
    module_spec = importlib.util.spec_from_file_location(f"preset_{file.stem}", file)
    loaded = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(loaded)
    return loaded


def load(spec: str):
    """The preset's ConfigDict: ``get_config(arg)``, or ``get_config()`` without an argument (as
    `ml_collections.config_flags` calls it)."""
    _, arg = split(spec)
    preset = module(spec)
    return preset.get_config(arg) if arg else preset.get_config()
