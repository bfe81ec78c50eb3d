"""What a pack holds: ``manifest.json`` (one `PackedEnv` per program) and ``programs/<stem>.json``.

    {"format": 1, "name": "spade_envs_tiny", "version": "0.1.0", "spade_jax": "0.1.0",
     "run": {"workdir": "tiny", "last_iteration": 1},
     "environments": [{"env_id": "it0001-slot00", "gym_id": "spade_envs_tiny/it0001-slot00-v0",
                       "program": "programs/it0001-slot00.json", "program_sha256": "...", "skill": "...",
                       "doc_id": "...", "levels": ["easy", "medium", "hard"], "level": "medium", ...}]}

A program file is ``{"env_id": ..., "sha256": ..., "source": "..."}``; ``source`` is the admitted
program byte for byte once decoded (``sha256`` is over its UTF-8 bytes). Every file of a pack is
written with ``spade_jax.text.json_text``, so none holds a literal special token.

Standard library only: an installed pack reads this without JAX.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

FORMAT = 1
MANIFEST_FILE = "manifest.json"
PROGRAMS_DIR = "programs"


class PackError(ValueError):
    """A pack (or the run it is made from) that cannot be used; the message says what to fix."""


def program_sha256(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


@dataclasses.dataclass(frozen=True)
class PackedEnv:
    """One admitted environment of a run, as the pack describes it.

    env_id: its id in the run's environment memory (``seed-<name>`` for a handwritten seed);
    gym_id: its Gymnasium id; program: its program file, relative to the package;
    skill, doc_id: the designer's skill and source document (None for seeds);
    levels: the ``DIFFICULTY_LEVELS`` the program declares (read from its syntax tree; () if none);
    level: the level calibration chose and replays played (None: the program's default);
    calibration: per-level rates of the design's calibration, as logged (None without one);
    win_rate, hinted_win_rate, mean_plain, mean_hinted, regret, designer_reward: its latest
    measurement (None: never measured); measured_iteration: the iteration of that measurement;
    plays: how many iterations played it; iteration_added: the iteration it was designed (or
    first played, for a seed); retired: why pool rotation retired it (None: it was not).
    """

    env_id: str
    gym_id: str
    program: str
    program_sha256: str
    skill: str | None = None
    doc_id: str | None = None
    is_seed: bool = False
    levels: tuple[str, ...] = ()
    level: str | None = None
    calibration: dict | None = None
    win_rate: float | None = None
    hinted_win_rate: float | None = None
    mean_plain: float | None = None
    mean_hinted: float | None = None
    regret: float | None = None
    designer_reward: float | None = None
    measured_iteration: int | None = None
    plays: int = 0
    iteration_added: int | None = None
    retired: str | None = None

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["levels"] = list(self.levels)
        return data

    @classmethod
    def from_json(cls, data) -> "PackedEnv":
        if not isinstance(data, dict):
            raise PackError(f"a manifest environment must be an object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        missing = {"env_id", "gym_id", "program", "program_sha256"} - set(data)
        if missing:
            raise PackError(f"a manifest environment lacks {sorted(missing)}")
        values = {k: v for k, v in data.items() if k in known}
        values["levels"] = tuple(values.get("levels") or ())
        return cls(**values)


def finite_or_none(value) -> float | None:
    """A logged statistic as a float, or None when it is missing, not a number or not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclasses.dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    environments: tuple[PackedEnv, ...]
    run: dict = dataclasses.field(default_factory=dict)
    spade_jax: str = ""

    def to_json(self) -> dict:
        return {"format": FORMAT, "name": self.name, "version": self.version, "spade_jax": self.spade_jax,
                "run": self.run, "environments": [e.to_json() for e in self.environments]}

    @classmethod
    def read(cls, root: Path) -> "Manifest":
        path = Path(root) / MANIFEST_FILE
        data = _read_json(path, "the pack manifest")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PackError(f"{path} is not a format-{FORMAT} pack manifest (made by another spade_jax version?)")
        envs = tuple(PackedEnv.from_json(e) for e in data.get("environments") or ())
        return cls(name=str(data.get("name", "")), version=str(data.get("version", "")), environments=envs,
                   run=data.get("run") if isinstance(data.get("run"), dict) else {},
                   spade_jax=str(data.get("spade_jax", "")))


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise PackError(f"cannot read {what} {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise PackError(f"{what} {path} is not JSON: {err}") from None


def read_program(root: Path, env: PackedEnv) -> str:
    """The program of ``env``, checked against its manifest hash."""
    path = Path(root) / env.program
    data = _read_json(path, f"the program file of {env.env_id}")
    source = data.get("source") if isinstance(data, dict) else None
    if not isinstance(source, str) or program_sha256(source) != env.program_sha256:
        raise PackError(f"the program file {path} does not hold the program the manifest names "
                        f"(sha256 {env.program_sha256[:12]}...): the pack was changed after it was written")
    return source
