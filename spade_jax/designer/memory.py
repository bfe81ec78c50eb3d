"""EnvironmentMemory: the bounded archive of admitted environments and prompt exemplars.

Each record holds an environment's code, skill, source document, its measured statistics
(win rate, mean plain and hinted reward, regret, designer reward), the admission report,
the iteration it was added, how often it was replayed and when it was last played.
Handwritten seed environments enter with `add_seed` before they have been measured (their
statistics are None until their first measurement).

The reference (spade-rl/spade) writes a record once, at a regeneration step, for
every game its actor played in that step (spade/slime/spade_rollout.py:705-735), and never
updates it. Its statistics are those of that step's plays (`regeneration_statistics`): the
win rate is the share of plain plays with reward > 0, the regret is the hinted mean minus
the plain mean, unfloored (so it may be negative), 0 when the hint failed
(orchestrator.py:2041-2048). Here `update` records a replay's plays (rotation,
times_replayed) but keeps the statistics of the first measurement.

Eviction, as the reference's (env_memory.py:72-74): when an add exceeds ``capacity`` the
earliest inserted record goes.

Exemplars (designer prompts, env_memory.py:76-123): a slot sees only records of its own
skill. Positives are drawn uniformly from the top max(3 n, 10) by regret among records whose
win rate lies in ``positive_win_range``; when none does, none is shown. A negative is drawn
uniformly among records with win rate below or above ``negative_win_bounds``. See
`EnvironmentMemory.exemplars`.

Difficulty and rotation. A record keeps the difficulty ``level`` calibration chose (replays
play at it) and the outcomes of its latest plain plays (``recent_plain``, 1 = won, at most
MAX_RECENT_PLAYS). `retire_mastered` retires a record whose win rate over its last plays
exceeds a threshold: it stays in the memory (a negative "too easy" exemplar for the
designer, and in the novelty archive so it is not designed again) but is no longer
replayed; ``retired_iteration`` and ``retired_reason`` say when and why.

`to_state()` gives a JSON-serialisable dict and `from_state` rebuilds the memory from
it exactly (records, order, counters, settings); it is part of the checkpoint. A state saved
with one of the retired settings (`RETIRED_SETTINGS`) at another value than today's rule is
refused.
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

    kind: "positive" or "negative"; label: "good difficulty", "too easy" or "too hard";
    code: its source (prompts cut it to their size).
    """

    env_id: str
    skill: str
    code: str
    kind: str
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


def regeneration_statistics(plain_rewards, hinted_rewards=()) -> dict:
    """The statistics the reference stores for a game: those of one step's plays.

    win_rate: the share of plain plays with reward > 0 (spade_rollout.py:722); mean_plain /
    mean_hinted: the plain and hinted means (None without hinted plays); regret: mean_hinted
    - mean_plain, unfloored, over every play of the step, unmatched (orchestrator.py:2046-2048),
    and 0 without hinted plays (the reference's value when the hint failed, :2042-2043).
    The keyword names are those of `EnvironmentMemory.add` and `update`.
    """
    plain = np.asarray(plain_rewards, dtype=np.float64).reshape(-1)
    hinted = np.asarray(hinted_rewards, dtype=np.float64).reshape(-1)
    if plain.size == 0:
        raise ValueError("regeneration_statistics needs at least one plain play reward")
    mean_plain = float(plain.mean())
    mean_hinted = float(hinted.mean()) if hinted.size else None
    return dict(win_rate=float((plain > 0).mean()), mean_plain=mean_plain, mean_hinted=mean_hinted,
                regret=mean_hinted - mean_plain if mean_hinted is not None else 0.0)


POSITIVE_POOL_FACTOR, POSITIVE_POOL_MIN = 3, 10  # positives from the top max(3 n, 10) by regret
_SETTINGS = ("positive_win_range", "negative_win_bounds")
# Settings of spade_jax's earlier memory rules, retired: name -> today's rule, the last commit that had it.
RETIRED_SETTINGS = {
    "eviction": ("fifo", "fcdc4af"), "staleness_decay": (0.95, "fcdc4af"), "refresh_statistics": (False, "fcdc4af"),
    "positive_pool_factor": (3, "fcdc4af"), "positive_pool_min": (10, "fcdc4af"),
    "positive_fallback": (False, "fcdc4af"), "negative_pool_factor": (0, "fcdc4af"),
    "exemplar_skills": ("own", "fcdc4af"), "exemplar_order": ("drawn", "fcdc4af"),
}


class EnvironmentMemory:
    """Bounded archive of admitted environments (see the module docstring for the rules): at
    most ``capacity`` records; positives shown from the win-rate band ``positive_win_range``,
    negatives from outside ``negative_win_bounds`` (the reference's values)."""

    def __init__(self, capacity: int = 200, *, positive_win_range: tuple[float, float] = (0.15, 0.85),
                 negative_win_bounds: tuple[float, float] = (0.1, 0.9)):
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        lo, hi = positive_win_range
        nlo, nhi = negative_win_bounds
        if not (0.0 <= lo <= hi <= 1.0 and 0.0 <= nlo <= nhi <= 1.0):
            raise ValueError("win-rate ranges must be ordered pairs within [0, 1]")
        self.capacity = int(capacity)
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

    def set_designer_reward(self, env_id: str, designer_reward: float) -> None:
        """The designer reward of a record scored after its pool ended (a reward delay)."""
        self.get(env_id).designer_reward = _clean_float("designer_reward", designer_reward)

    def update(self, env_id: str, *, iteration: int, win_rate, mean_plain, mean_hinted,
               regret, designer_reward=None, plain_wins=()) -> EnvRecord:
        """Records a replay: the new plain play outcomes ``plain_wins`` are appended,
        times_replayed += 1, last_played = iteration, and ``designer_reward`` is set when given.

        The statistics are set only when the record is still unmeasured (a seed's first play,
        its analogue of the reference's one write)."""
        rec = self.get(env_id)
        rec.record_plays(plain_wins)
        if not rec.measured:
            for k, v in zip(_STAT_FIELDS[:4], (win_rate, mean_plain, mean_hinted, regret)):
                setattr(rec, k, _clean_float(k, v))
        if designer_reward is not None:
            rec.designer_reward = _clean_float("designer_reward", designer_reward)
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
            victim = min(self._records.values(), key=lambda r: self._order[r.env_id])
            del self._records[victim.env_id]
            del self._order[victim.env_id]
            evicted.append(victim.env_id)
        return evicted

    # ----- exemplars ----------------------------------------------------------------
    def exemplars(self, rng: np.random.Generator | int | None = None, n_positive: int = 2,
                  n_negative: int = 1, skill: str | None = None) -> list[Exemplar]:
        """Environments to show in a designer prompt of ``skill``: positives first, then negatives.

        Only records of ``skill`` count (None: every skill, as the reference's ``skill=None``).
        Positives: measured records with win rate in ``positive_win_range`` ranked by regret
        (highest first, ties by insertion), ``n`` of them drawn uniformly from the top
        max(3 n, 10) (env_memory.py:90-99); fewer, or none, when fewer qualify. Negatives:
        records with win rate below or above ``negative_win_bounds``, drawn uniformly
        (env_memory.py:117-123). Both in the order drawn (the reference's `random.sample`).
        Returns [] for an empty memory.
        """
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        lo, hi = self.positive_win_range
        nlo, nhi = self.negative_win_bounds
        recs = [r for r in self.records() if skill is None or r.skill == skill]
        band = sorted((r for r in recs if r.measured and lo <= r.win_rate <= hi),
                      key=lambda r: (-(r.regret or 0.0), self._order[r.env_id]))
        positives = self._draw(rng, band[: max(POSITIVE_POOL_FACTOR * n_positive, POSITIVE_POOL_MIN)], n_positive)
        negatives = self._draw(rng, [r for r in recs if r.measured and (r.win_rate < nlo or r.win_rate > nhi)],
                               n_negative)
        return [self._exemplar(r, "positive") for r in positives] + [self._exemplar(r, "negative") for r in negatives]

    @staticmethod
    def _draw(rng, pool: list[EnvRecord], n: int) -> list[EnvRecord]:
        """``n`` records (or all) drawn uniformly from ``pool``, in draw order."""
        if not pool or n <= 0:
            return []
        return [pool[j] for j in rng.choice(len(pool), size=min(n, len(pool)), replace=False)]

    def _exemplar(self, rec: EnvRecord, kind: str) -> Exemplar:
        label = "good difficulty" if kind == "positive" else (
            "too easy" if rec.win_rate > self.negative_win_bounds[1] else "too hard")
        return Exemplar(env_id=rec.env_id, skill=rec.skill, code=rec.code, kind=kind, label=label,
                        win_rate=rec.win_rate, regret=rec.regret, doc_id=rec.doc_id)

    # ----- state --------------------------------------------------------------------
    def to_state(self) -> dict:
        """JSON-serialisable snapshot (records in insertion order)."""
        settings = {name: getattr(self, name) for name in _SETTINGS}
        return {
            "version": STATE_VERSION,
            "capacity": self.capacity,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
            "iteration": self.iteration,
            "next_index": self._next_index,
            "records": [dict(dataclasses.asdict(r), order=self._order[r.env_id])
                        for r in self._records.values()],
        }

    @classmethod
    def from_state(cls, state: dict) -> EnvironmentMemory:
        """Rebuilds a memory saved with `to_state` (also after a JSON round trip). A state saved
        with a retired setting at another value than today's rule raises ValueError."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an EnvironmentMemory state of version {STATE_VERSION}: "
                             f"got version {state.get('version') if isinstance(state, dict) else state!r}")
        for name, (rule, commit) in RETIRED_SETTINGS.items():
            if name in state and state[name] != rule:
                raise ValueError(f"this memory was saved with {name}={state[name]!r}, a rule spade_jax no longer has "
                                 f"(retired after commit {commit}); resume it with spade_jax at that commit")
        settings = {k: tuple(v) if isinstance(v, list) else v for k, v in state.items() if k in _SETTINGS}
        mem = cls(int(state["capacity"]), **settings)
        mem.iteration = int(state["iteration"])
        mem._next_index = int(state["next_index"])
        names = {f.name for f in dataclasses.fields(EnvRecord)}
        for raw in state["records"]:
            fields = {k: v for k, v in raw.items() if k in names}
            rec = EnvRecord(**fields)
            mem._records[rec.env_id] = rec
            mem._order[rec.env_id] = int(raw["order"])
        return mem


__all__ = ["EnvRecord", "EnvironmentMemory", "Exemplar", "MAX_RECENT_PLAYS", "RETIRED_SETTINGS", "STATE_VERSION",
           "regeneration_statistics"]
