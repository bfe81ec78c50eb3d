"""EnvironmentMemory: the bounded archive of admitted environments and prompt exemplars.

Each record holds an environment's code, skill, source document, its latest measured
statistics (win rate, mean plain and hinted reward, regret, designer reward), the
admission report, the iteration it was added, how often it was replayed and when it
was last played. Handwritten seed environments enter with `add_seed` before they have
been measured (their statistics are None until the first `update`).

Eviction. When an add exceeds ``capacity`` the record with the lowest score goes:

    score = regret * staleness_decay ** (now - last_played)

where ``now`` is the latest iteration the memory has seen and an unmeasured regret
counts as 0. High-regret environments stay, and their claim fades as they go unplayed
(with the default 0.95 a record unplayed for 14 iterations counts half). Ties (e.g.
many zero-regret records) evict the least recently played first, then the oldest
added, then the earliest inserted. The record just added can be the one evicted.

Exemplars (designer prompts, as the reference): positives are high-regret records
with win rate in [0.15, 0.85], a negative is one with win rate > 0.9 or < 0.1. See
`EnvironmentMemory.exemplars` for the fallbacks when too few qualify.

Difficulty and rotation. A record keeps the difficulty ``level`` calibration chose (replays
play at it) and the outcomes of its latest plain plays (``recent_plain``, 1 = won, at most
MAX_RECENT_PLAYS). `retire_mastered` retires a record whose win rate over its last plays
exceeds a threshold: it stays in the memory (a negative "too easy" exemplar for the
designer, and in the novelty archive so it is not designed again) but is no longer
replayed; ``retired_iteration`` and ``retired_reason`` say when and why.

`to_state()` gives a JSON-serialisable dict and `from_state` rebuilds the memory from
it exactly (records, order, counters, settings); it is part of the checkpoint. States
saved before records had a level or play outcomes load with their defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

STATE_VERSION = 1
SEED_ID_PREFIX = "seed-"  # memory ids of handwritten seed environments: seed-<name>
_STAT_FIELDS = ("win_rate", "mean_plain", "mean_hinted", "regret", "designer_reward")
MAX_RECENT_PLAYS = 256  # plain play outcomes a record keeps for pool rotation


@dataclasses.dataclass(frozen=True)
class RotationConfig:
    """Pool rotation (EvoEnv): mastered records leave the replay pool (`retire_mastered`).

    retire_win_rate: a record whose plain win rate over its last `retire_plays` plays exceeds
      this is retired (0: no rotation); retire_plays: how many latest plain plays it looks at.
    """

    retire_win_rate: float = 0.0
    retire_plays: int = 8

    def __post_init__(self):
        if not 0.0 <= self.retire_win_rate < 1.0:
            raise ValueError(f"retire_win_rate must be in [0, 1) (0 = no rotation), got {self.retire_win_rate}")
        if not 1 <= self.retire_plays <= MAX_RECENT_PLAYS:
            raise ValueError(f"retire_plays must be in 1..{MAX_RECENT_PLAYS}, got {self.retire_plays}")


@dataclasses.dataclass
class EnvRecord:
    """One admitted environment. Statistics are the latest measurement (None = unmeasured)."""

    env_id: str
    code: str
    skill: str
    doc_id: str | None = None
    win_rate: float | None = None
    mean_plain: float | None = None
    mean_hinted: float | None = None
    regret: float | None = None
    designer_reward: float | None = None
    admission: dict = dataclasses.field(default_factory=dict)
    iteration_added: int = 0
    times_replayed: int = 0
    last_played: int = 0
    is_seed: bool = False
    level: str | None = None  # the difficulty level calibration chose (None: the program's default)
    recent_plain: list = dataclasses.field(default_factory=list)  # latest plain plays, 1 = won, oldest first
    retired_iteration: int | None = None
    retired_reason: str | None = None

    @property
    def measured(self) -> bool:
        return self.win_rate is not None

    @property
    def retired(self) -> bool:
        return self.retired_iteration is not None

    def record_plays(self, plain_wins) -> None:
        """Appends plain play outcomes (truthy = won), keeping the latest MAX_RECENT_PLAYS."""
        self.recent_plain = (self.recent_plain + [int(bool(w)) for w in plain_wins])[-MAX_RECENT_PLAYS:]


@dataclasses.dataclass(frozen=True)
class Exemplar:
    """An environment shown in a designer prompt.

    kind: "positive" or "negative"; qualified: whether it met the reference criterion
    (False for fallbacks); label: "good difficulty", "borderline" (a fallback positive
    outside the win-rate band), "unmeasured" (a seed not yet played), "too easy" or
    "too hard"; code: its source (prompts cut it to their size).
    """

    env_id: str
    skill: str
    code: str
    kind: str
    qualified: bool
    label: str
    win_rate: float | None
    regret: float | None
    doc_id: str | None


def _clean_float(name: str, value) -> float | None:
    """Stats are stored as plain floats; NaN/inf (e.g. no hinted episodes) become None."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a number or None, got {value!r}") from e
    return v if math.isfinite(v) else None


def _json_copy(env_id: str, report) -> dict:
    if report is None:
        return {}
    if not isinstance(report, dict):
        raise ValueError(f"admission report of {env_id} must be a dict, got {type(report).__name__}")
    try:
        return json.loads(json.dumps(report, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"admission report of {env_id} must be JSON-serialisable "
                         f"(plain dicts, lists, str, finite numbers): {e}") from e


class EnvironmentMemory:
    """Bounded archive of admitted environments (see module docstring for the rules)."""

    def __init__(self, capacity: int = 200, *, staleness_decay: float = 0.95,
                 positive_win_range: tuple[float, float] = (0.15, 0.85),
                 negative_win_bounds: tuple[float, float] = (0.1, 0.9)):
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        if not 0.0 < staleness_decay <= 1.0:
            raise ValueError(f"staleness_decay must be in (0, 1], got {staleness_decay}")
        lo, hi = positive_win_range
        nlo, nhi = negative_win_bounds
        if not (0.0 <= lo <= hi <= 1.0 and 0.0 <= nlo <= nhi <= 1.0):
            raise ValueError("win-rate ranges must be ordered pairs within [0, 1]")
        self.capacity = int(capacity)
        self.staleness_decay = float(staleness_decay)
        self.positive_win_range = (float(lo), float(hi))
        self.negative_win_bounds = (float(nlo), float(nhi))
        self.iteration = 0
        self._next_index = 0
        self._records: dict[str, EnvRecord] = {}
        self._order: dict[str, int] = {}

    # ----- access -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, env_id: str) -> bool:
        return env_id in self._records

    def get(self, env_id: str) -> EnvRecord:
        if env_id not in self._records:
            raise KeyError(f"environment {env_id!r} is not in the memory")
        return self._records[env_id]

    def records(self) -> list[EnvRecord]:
        """All records in insertion order."""
        return list(self._records.values())

    def score(self, record: EnvRecord, now: int | None = None) -> float:
        """Eviction score: regret * staleness_decay ** (now - last_played)."""
        now = self.iteration if now is None else now
        age = max(0, now - record.last_played)
        return (record.regret or 0.0) * self.staleness_decay ** age

    # ----- mutation -----------------------------------------------------------------
    def add(self, code: str, skill: str, *, iteration: int, doc_id: str | None = None,
            win_rate=None, mean_plain=None, mean_hinted=None, regret=None,
            designer_reward=None, admission: dict | None = None, env_id: str | None = None,
            is_seed: bool = False, level: str | None = None, plain_wins=()) -> tuple[str, list[str]]:
        """Adds an admitted environment (played at difficulty ``level``, its plain play outcomes
        ``plain_wins`` so far); returns (its id, ids evicted to stay in capacity)."""
        if not isinstance(code, str) or not code.strip():
            raise ValueError("environment code must be a non-empty string")
        if not isinstance(skill, str) or not skill:
            raise ValueError("skill must be a non-empty string")
        env_id = env_id if env_id is not None else f"env-{self._next_index:06d}"
        if env_id in self._records:
            raise ValueError(f"environment id {env_id!r} is already in the memory")
        stats = {k: _clean_float(k, v) for k, v in zip(
            _STAT_FIELDS, (win_rate, mean_plain, mean_hinted, regret, designer_reward))}
        rec = EnvRecord(env_id=env_id, code=code, skill=skill, doc_id=doc_id,
                        admission=_json_copy(env_id, admission), iteration_added=int(iteration),
                        last_played=int(iteration), is_seed=bool(is_seed), level=level, **stats)
        rec.record_plays(plain_wins)
        self._records[env_id] = rec
        self._order[env_id] = self._next_index
        self._next_index += 1
        self.iteration = max(self.iteration, int(iteration))
        return env_id, self._evict()

    def add_seed(self, code: str, skill: str, *, name: str, iteration: int = 0,
                 admission: dict | None = None) -> str:
        """Adds a handwritten seed environment (unmeasured) under id ``seed-<name>``."""
        env_id, _ = self.add(code, skill, iteration=iteration, admission=admission,
                             env_id=SEED_ID_PREFIX + name, is_seed=True)
        return env_id

    def update(self, env_id: str, *, iteration: int, win_rate, mean_plain, mean_hinted,
               regret, designer_reward=None, plain_wins=()) -> EnvRecord:
        """Records a replay: the statistics become the new measurement (the agent has
        changed since the last one, so older numbers are not averaged in), the new plain
        play outcomes ``plain_wins`` are appended, times_replayed += 1, last_played = iteration."""
        rec = self.get(env_id)
        rec.record_plays(plain_wins)
        for k, v in zip(_STAT_FIELDS, (win_rate, mean_plain, mean_hinted, regret, designer_reward)):
            if k != "designer_reward" or v is not None:
                setattr(rec, k, _clean_float(k, v))
        rec.times_replayed += 1
        rec.last_played = max(rec.last_played, int(iteration))
        self.iteration = max(self.iteration, int(iteration))
        return rec

    def retire_mastered(self, iteration: int, win_rate: float, plays: int) -> list[str]:
        """Retires every active record whose plain win rate over its last ``plays`` plays
        exceeds ``win_rate`` (records with fewer plays are kept); returns their ids."""
        retired = []
        for rec in self._records.values():
            if rec.retired or len(rec.recent_plain) < plays:
                continue
            rate = sum(rec.recent_plain[-plays:]) / plays
            if rate > win_rate:
                rec.retired_iteration = int(iteration)
                rec.retired_reason = (f"mastered: plain win rate {rate:.2f} over the last {plays} plays "
                                      f"> {win_rate:g}")
                retired.append(rec.env_id)
        return retired

    def _evict(self) -> list[str]:
        evicted = []
        while len(self._records) > self.capacity:
            victim = min(self._records.values(), key=lambda r: (
                self.score(r), r.last_played, r.iteration_added, self._order[r.env_id]))
            del self._records[victim.env_id]
            del self._order[victim.env_id]
            evicted.append(victim.env_id)
        return evicted

    # ----- exemplars ----------------------------------------------------------------
    def exemplars(self, rng: np.random.Generator | int | None = None, n_positive: int = 2,
                  n_negative: int = 1) -> list[Exemplar]:
        """Environments to show in a designer prompt: positives first, then negatives.

        Positives are taken tier by tier until ``n_positive`` are found: (1) measured
        records with win rate in ``positive_win_range``; (2) unmeasured records (seeds
        not yet played); (3) measured records that are neither positive nor negative,
        i.e. win rate between the negative bounds but outside the positive range.
        Within a tier records are ranked by regret (highest first) and ``need`` of them
        are drawn uniformly from the top ``2 * need``, so prompts vary while staying
        high-regret. A negative is drawn uniformly among records with win rate below
        or above ``negative_win_bounds``; when none exists, fewer are returned (a record
        is never shown as a negative example unless it is one). Returns [] for an empty
        memory.
        """
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        lo, hi = self.positive_win_range
        nlo, nhi = self.negative_win_bounds
        recs = self.records()
        is_neg = lambda r: r.measured and (r.win_rate < nlo or r.win_rate > nhi)  # noqa: E731
        tiers = [
            [r for r in recs if r.measured and lo <= r.win_rate <= hi],
            [r for r in recs if not r.measured],
            [r for r in recs if r.measured and not (lo <= r.win_rate <= hi) and not is_neg(r)],
        ]
        positives = self._draw(rng, tiers, n_positive, set())
        chosen = {r.env_id for r, _ in positives}
        negatives = self._draw(rng, [[r for r in recs if is_neg(r)]], n_negative, chosen)
        out = [self._exemplar(r, "positive", tier == 0) for r, tier in positives]
        out += [self._exemplar(r, "negative", True) for r, _ in negatives]
        return out

    def _draw(self, rng, tiers, n, taken) -> list[tuple[EnvRecord, int]]:
        picked: list[tuple[EnvRecord, int]] = []
        for i, tier in enumerate(tiers):
            need = n - len(picked)
            if need <= 0:
                break
            cands = sorted((r for r in tier if r.env_id not in taken),
                           key=lambda r: (-(r.regret or 0.0), self._order[r.env_id]))
            pool = cands[: 2 * need]
            if not pool:
                continue
            idx = sorted(rng.choice(len(pool), size=min(need, len(pool)), replace=False))
            for j in idx:
                picked.append((pool[j], i))
                taken.add(pool[j].env_id)
        return picked

    def _exemplar(self, rec: EnvRecord, kind: str, qualified: bool) -> Exemplar:
        if not rec.measured:
            label = "unmeasured"
        elif kind == "negative":
            label = "too easy" if rec.win_rate > self.negative_win_bounds[1] else "too hard"
        else:
            label = "good difficulty" if qualified else "borderline"
        return Exemplar(env_id=rec.env_id, skill=rec.skill,
                        code=rec.code,
                        kind=kind, qualified=qualified, label=label, win_rate=rec.win_rate,
                        regret=rec.regret, doc_id=rec.doc_id)

    # ----- state --------------------------------------------------------------------
    def to_state(self) -> dict:
        """JSON-serialisable snapshot (records in insertion order)."""
        return {
            "version": STATE_VERSION,
            "capacity": self.capacity,
            "staleness_decay": self.staleness_decay,
            "positive_win_range": list(self.positive_win_range),
            "negative_win_bounds": list(self.negative_win_bounds),
            "iteration": self.iteration,
            "next_index": self._next_index,
            "records": [dict(dataclasses.asdict(r), order=self._order[r.env_id])
                        for r in self._records.values()],
        }

    @classmethod
    def from_state(cls, state: dict) -> EnvironmentMemory:
        """Rebuilds a memory saved with `to_state` (also after a JSON round trip)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an EnvironmentMemory state of version {STATE_VERSION}: "
                             f"got version {state.get('version') if isinstance(state, dict) else state!r}")
        mem = cls(int(state["capacity"]), staleness_decay=float(state["staleness_decay"]),
                  positive_win_range=tuple(state["positive_win_range"]),
                  negative_win_bounds=tuple(state["negative_win_bounds"]))
        mem.iteration = int(state["iteration"])
        mem._next_index = int(state["next_index"])
        names = {f.name for f in dataclasses.fields(EnvRecord)}
        for raw in state["records"]:
            fields = {k: v for k, v in raw.items() if k in names}
            rec = EnvRecord(**fields)
            mem._records[rec.env_id] = rec
            mem._order[rec.env_id] = int(raw["order"])
        return mem


__all__ = ["EnvRecord", "EnvironmentMemory", "Exemplar", "MAX_RECENT_PLAYS", "STATE_VERSION"]
