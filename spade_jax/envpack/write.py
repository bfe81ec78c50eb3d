"""Writes a pack: an installable Python package of a run's admitted environments.

    OUT/
      pyproject.toml            # name, version; depends on spade_jax and gymnasium (extra "openenv")
      README.md                 # how to install and use it, one row per environment
      <name>/__init__.py        # registers the Gymnasium ids on import (fixed text)
      <name>/__main__.py        # `python -m <name> list | serve` (fixed text)
      <name>/manifest.json      # `manifest.Manifest`
      <name>/programs/*.json    # one program each, JSON-escaped

No file holds a literal special token: the JSON files are written with
`spade_jax.text.json_text` (every ``<``, ``>`` escaped), the package code is fixed text,
and the README and pyproject take only sanitized names and numbers from the run, with the
skill and document id of each environment shown HTML-escaped.
"""

from __future__ import annotations

import html
import keyword
import os
import re
from collections.abc import Sequence
from pathlib import Path

import spade_jax
from spade_jax.envpack.manifest import MANIFEST_FILE, PROGRAMS_DIR, Manifest, PackedEnv, PackError, program_sha256
from spade_jax.envpack.source import AdmittedEnv
from spade_jax.text import display_line, json_text

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_VERSION = re.compile(r"\d+(\.\d+){0,3}")
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")

_INIT = '''"""Environments designed in a spade_jax run, packed by `python -m spade_jax.envpack` (manifest.json).

Importing this package registers one Gymnasium environment per program (`ENV_IDS`);
`python -m <this package> list` lists them and `serve` serves them over OpenEnv. Every step
runs in spade_jax's sandbox, never in this process.
"""

from pathlib import Path

from spade_jax.envpack.runtime import Pack

PACK = Pack.load(Path(__file__).parent)
ENV_IDS = PACK.register_gymnasium()
'''

_MAIN = '''"""`python -m <this package> list | serve`: see `spade_jax.envpack.pack_cli`."""

from spade_jax.envpack.pack_cli import main

from . import PACK

raise SystemExit(main(PACK))
'''

_PYPROJECT = '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
description = "Environments admitted in spade_jax run {run}, for Gymnasium and OpenEnv; every step in its sandbox"
requires-python = ">=3.11"
dependencies = ["spade_jax", "gymnasium>=1.0"]

[project.optional-dependencies]
openenv = ["openenv-core>=0.3"]

[tool.setuptools]
packages = ["{name}"]

[tool.setuptools.package-data]
{name} = ["manifest.json", "programs/*.json"]
'''


def default_name(workdir: str) -> str:
    """``spade_envs_<run directory name>`` as a Python package name."""
    stem = re.sub(r"[^a-z0-9_]", "_", os.path.basename(os.path.normpath(workdir)).lower()).strip("_")
    return f"spade_envs_{stem}"[:64].rstrip("_") if stem else "spade_envs"


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or keyword.iskeyword(name) or name == "spade_jax":
        raise PackError(f"the pack name must be a Python package name of 1-64 lowercase letters, digits and '_' "
                        f"starting with a letter (not spade_jax), got {name!r}")


def check_destination(out_dir: str) -> None:
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise PackError(f"{out_dir} exists and is not an empty directory; name a new one with --out")


def _stems(env_ids: Sequence[str]) -> list[str]:
    """A file and Gymnasium name per env id: its safe characters, a hash suffix when any were not, unique."""
    used, stems = set(), []
    for env_id in env_ids:
        stem = _UNSAFE_ID.sub("_", env_id)[:60]
        if stem != env_id:
            stem += "-" + program_sha256(env_id)[:8]
        unique, n = stem, 1
        while unique.lower() in used:
            n += 1
            unique = f"{stem}-{n}"
        used.add(unique.lower())
        stems.append(unique)
    return stems


def _md(value) -> str:
    """A README table cell: one escaped line, HTML-escaped, no column separator."""
    return html.escape(display_line("" if value is None else str(value), 80)).replace("|", "\\|")


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _readme(manifest: Manifest, out_name: str) -> str:
    rows = [f"| `{e.gym_id}` | {_md(e.skill)} | {', '.join(e.levels) or '-'} | {e.level or '-'} | "
            f"{_num(e.win_rate)} | {_num(e.regret)} | {_md(e.doc_id)} |" for e in manifest.environments]
    name = manifest.name
    return "\n".join([
        f"# {name}", "",
        f"{len(manifest.environments)} environment(s) admitted in the spade_jax run "
        f"`{_md(manifest.run.get('workdir'))}`, packed by `python -m spade_jax.envpack`. Every reset and step "
        "runs in spade_jax's sandbox (a jailed worker process), never in the caller's process; `manifest.json` "
        "has each environment's skill, levels, calibration, win rates, regret and source document.", "",
        "```sh", f"pip install ./{out_name}            # needs spade_jax installed; [openenv] adds openenv-core",
        f"python -m {name} list", "```", "",
        "Gymnasium (text observations and actions):", "", "```python", "import gymnasium as gym",
        f"import {name}", f"env = gym.make({name}.ENV_IDS[0])", "observation, info = env.reset(seed=0)",
        "observation, reward, terminated, truncated, info = env.step(\"...\")", "```", "",
        "OpenEnv: `python -m {0} serve --port 8000`, then any OpenEnv client, e.g. "
        "`GenericEnvClient(base_url=\"http://localhost:8000\")`: `reset(env_id=..., seed=...)`, "
        "`step({{\"text\": ...}})`.".format(name), "",
        "| Gymnasium id | skill | levels | level | win rate | regret | document |",
        "| --- | --- | --- | --- | ---: | ---: | --- |", *rows, ""])


def write_pack(admitted: Sequence[AdmittedEnv], out_dir: str, *, name: str, version: str = "0.1.0",
               run: dict | None = None) -> Manifest:
    """Writes the pack of ``admitted`` into ``out_dir`` (which must not exist or be empty); returns its manifest."""
    check_name(name)
    if not _VERSION.fullmatch(version):
        raise PackError(f"the pack version must be numbers joined by dots (e.g. 0.1.0), got {version!r}")
    if not admitted:
        raise PackError("no admitted environment to pack")
    check_destination(out_dir)
    package = Path(out_dir) / name
    (package / PROGRAMS_DIR).mkdir(parents=True, exist_ok=True)
    envs = []
    for env, stem in zip(admitted, _stems([e.env_id for e in admitted])):
        program = f"{PROGRAMS_DIR}/{stem}.json"
        digest = program_sha256(env.code)
        _write(package / program, json_text({"env_id": env.env_id, "sha256": digest, "source": env.code}, indent=1))
        envs.append(PackedEnv(env_id=env.env_id, gym_id=f"{name}/{stem}-v0", program=program, program_sha256=digest,
                              **env.fields))
    manifest = Manifest(name=name, version=version, environments=tuple(envs), run=dict(run or {}),
                        spade_jax=spade_jax.__version__)
    _write(package / MANIFEST_FILE, json_text(manifest.to_json(), indent=1, allow_nan=False))
    _write(package / "__init__.py", _INIT)
    _write(package / "__main__.py", _MAIN)
    dist = name.replace("_", "-")
    run_name = _UNSAFE_ID.sub("_", str((run or {}).get("workdir", "")))[:64] or "-"
    _write(Path(out_dir) / "pyproject.toml", _PYPROJECT.format(dist=dist, version=version, run=run_name, name=name))
    _write(Path(out_dir) / "README.md", _readme(manifest, os.path.basename(os.path.normpath(out_dir))))
    return manifest


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")
