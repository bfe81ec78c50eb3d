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
(orchestrator.py:2041-2048). Here `update` records a replay's plays (rotation, staleness,
times_replayed) but keeps the statistics of the first measurement; ``refresh_statistics``
replaces them at every update instead (this code's earlier behaviour).

Eviction (``eviction``). "fifo" (the reference, env_memory.py:72-74): when an add exceeds
``capacity`` the earliest inserted record goes. "regret_staleness" (this code's earlier
rule): the record with the lowest

    score = regret * staleness_decay ** (now - last_played)

goes, where ``now`` is the latest iteration the memory has seen and an unmeasured regret
counts as 0; ties evict the least recently played first, then the oldest added, then the
earliest inserted, and the record just added can be the one evicted.

Exemplars (designer prompts, env_memory.py:76-123): a slot sees only records of its own
skill (``exemplar_skills``). Positives are drawn uniformly from the top
max(``positive_pool_factor`` * n, ``positive_pool_min``) by regret among records whose win
rate lies in ``positive_win_range``; when none does, none is shown (``positive_fallback``
turns on this code's earlier fallbacks). A negative is drawn uniformly among records with
win rate below or above ``negative_win_bounds`` (``negative_pool_factor`` restricts it to
the highest-regret ones, as this code did before). See `EnvironmentMemory.exemplars`.

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


EVICTIONS = ("fifo", "regret_staleness")
EXEMPLAR_SKILLS = ("own", "all")
EXEMPLAR_ORDERS = ("drawn", "regret")
_SETTINGS = ("eviction", "staleness_decay", "refresh_statistics", "positive_win_range", "negative_win_bounds",
             "positive_pool_factor", "positive_pool_min", "positive_fallback", "negative_pool_factor",
             "exemplar_skills", "exemplar_order")


class EnvironmentMemory:
    """Bounded archive of admitted environments (see the module docstring for the rules).

    The defaults are the reference's; each other value is this code's earlier behaviour:
    eviction: "fifo" (earliest inserted goes) or "regret_staleness" (lowest decayed regret,
      decayed by ``staleness_decay`` per unplayed iteration).
    refresh_statistics: False keeps a record's first measurement; True replaces it at every
      `update`.
    positive_pool_factor / positive_pool_min: positives come from the top
      max(factor * n, min) by regret (the reference 3 and 10; earlier 2 and 0).
    positive_fallback: when too few records are in the band, fill up with unmeasured ones,
      then with borderline ones (between the negative bounds, outside the band).
    negative_pool_factor: 0 draws a negative among all of them; k > 0 among the top k * n
      by regret (earlier 2).
    exemplar_skills: "own" shows a slot only records of its skill, "all" every skill.
    exemplar_order: "drawn" shows the drawn records in the order drawn (the reference's
      `random.sample`), "regret" highest regret first.
    """

    def __init__(self, capacity: int = 200, *, eviction: str = "fifo", staleness_decay: float = 0.95,
                 refresh_statistics: bool = False,
                 positive_win_range: tuple[float, float] = (0.15, 0.85),
                 negative_win_bounds: tuple[float, float] = (0.1, 0.9),
                 positive_pool_factor: int = 3, positive_pool_min: int = 10, positive_fallback: bool = False,
                 negative_pool_factor: int = 0, exemplar_skills: str = "own", exemplar_order: str = "drawn"):
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")
        if not 0.0 < staleness_decay <= 1.0:
            raise ValueError(f"staleness_decay must be in (0, 1], got {staleness_decay}")
        lo, hi = positive_win_range
        nlo, nhi = negative_win_bounds
        if not (0.0 <= lo <= hi <= 1.0 and 0.0 <= nlo <= nhi <= 1.0):
            raise ValueError("win-rate ranges must be ordered pairs within [0, 1]")
        if positive_pool_factor < 1 or positive_pool_min < 0 or negative_pool_factor < 0:
            raise ValueError("positive_pool_factor must be >= 1, positive_pool_min and negative_pool_factor >= 0")
        if exemplar_skills not in EXEMPLAR_SKILLS:
            raise ValueError(f"exemplar_skills must be one of {EXEMPLAR_SKILLS}, got {exemplar_skills!r}")
        if exemplar_order not in EXEMPLAR_ORDERS:
            raise ValueError(f"exemplar_order must be one of {EXEMPLAR_ORDERS}, got {exemplar_order!r}")
        self.capacity = int(capacity)
        self.eviction = eviction
        self.staleness_decay = float(staleness_decay)
        self.refresh_statistics = bool(refresh_statistics)
        self.positive_win_range = (float(lo), float(hi))
        self.negative_win_bounds = (float(nlo), float(nhi))
        self.positive_pool_factor = int(positive_pool_factor)
        self.positive_pool_min = int(positive_pool_min)
        self.positive_fallback = bool(positive_fallback)
        self.negative_pool_factor = int(negative_pool_factor)
        self.exemplar_skills = exemplar_skills
        self.exemplar_order = exemplar_order
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
        """Eviction score under "regret_staleness": regret * staleness_decay ** (now - last_played)."""
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

    def set_designer_reward(self, env_id: str, designer_reward: float) -> None:
        """The designer reward of a record scored after its pool ended (a reward delay)."""
        self.get(env_id).designer_reward = _clean_float("designer_reward", designer_reward)

    def update(self, env_id: str, *, iteration: int, win_rate, mean_plain, mean_hinted,
               regret, designer_reward=None, plain_wins=()) -> EnvRecord:
        """Records a replay: the new plain play outcomes ``plain_wins`` are appended,
        times_replayed += 1, last_played = iteration, and ``designer_reward`` is set when given.

        The statistics are set only when the record is still unmeasured (a seed's first play,
        its analogue of the reference's one write) or under ``refresh_statistics``; there the
        new measurement replaces the old one (the agent has changed since, so older numbers
        are not averaged in)."""
        rec = self.get(env_id)
        rec.record_plays(plain_wins)
        if self.refresh_statistics or not rec.measured:
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
        fifo = self.eviction == "fifo"
        while len(self._records) > self.capacity:
            victim = min(self._records.values(), key=lambda r: (self._order[r.env_id],) if fifo else (
                self.score(r), r.last_played, r.iteration_added, self._order[r.env_id]))
            del self._records[victim.env_id]
            del self._order[victim.env_id]
            evicted.append(victim.env_id)
        return evicted

    # ----- exemplars ----------------------------------------------------------------
    def exemplars(self, rng: np.random.Generator | int | None = None, n_positive: int = 2,
                  n_negative: int = 1, skill: str | None = None) -> list[Exemplar]:
        """Environments to show in a designer prompt of ``skill``: positives first, then negatives.

        Only records of ``skill`` count under ``exemplar_skills`` "own" (None: every skill, as
        the reference's ``skill=None``). Positives: measured records with win rate in
        ``positive_win_range`` ranked by regret (highest first, ties by insertion), ``n`` of
        them drawn uniformly from the top max(positive_pool_factor * n, positive_pool_min)
        (env_memory.py:90-99); fewer, or none, when fewer qualify. With ``positive_fallback``
        the shortfall is filled tier by tier from unmeasured records (seeds not yet played),
        then from measured ones between the negative bounds but outside the band, each tier
        drawn the same way. Negatives: records with win rate below or above
        ``negative_win_bounds``, drawn uniformly (env_memory.py:117-123), or among the top
        negative_pool_factor * n by regret; a record is never shown as a negative unless it is
        one. Returns [] for an empty memory.
        """
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        lo, hi = self.positive_win_range
        nlo, nhi = self.negative_win_bounds
        recs = self.records()
        if skill is not None and self.exemplar_skills == "own":
            recs = [r for r in recs if r.skill == skill]
        is_neg = lambda r: r.measured and (r.win_rate < nlo or r.win_rate > nhi)  # noqa: E731
        tiers = [[r for r in recs if r.measured and lo <= r.win_rate <= hi]]
        if self.positive_fallback:
            tiers += [[r for r in recs if not r.measured],
                      [r for r in recs if r.measured and not (lo <= r.win_rate <= hi) and not is_neg(r)]]
        positives = self._draw(rng, tiers, n_positive, set(), self.positive_pool_factor, self.positive_pool_min)
        chosen = {r.env_id for r, _ in positives}
        negatives = self._draw(rng, [[r for r in recs if is_neg(r)]], n_negative, chosen,
                               self.negative_pool_factor, 0)
        out = [self._exemplar(r, "positive", tier == 0) for r, tier in positives]
        out += [self._exemplar(r, "negative", True) for r, _ in negatives]
        return out

    def _draw(self, rng, tiers, n, taken, factor, minimum) -> list[tuple[EnvRecord, int]]:
        """Per tier, the ``need`` still missing drawn uniformly from its top max(factor * need,
        minimum) by regret (factor 0: from all of it), in draw order or by regret."""
        picked: list[tuple[EnvRecord, int]] = []
        for i, tier in enumerate(tiers):
            need = n - len(picked)
            if need <= 0:
                break
            cands = sorted((r for r in tier if r.env_id not in taken),
                           key=lambda r: (-(r.regret or 0.0), self._order[r.env_id]))
            pool = cands[: max(factor * need, minimum)] if factor else cands
            if not pool:
                continue
            idx = rng.choice(len(pool), size=min(need, len(pool)), replace=False)
            for j in (sorted(idx) if self.exemplar_order == "regret" else idx):
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
        """Rebuilds a memory saved with `to_state` (also after a JSON round trip); a setting the
        state lacks (saved before it existed) takes its default."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an EnvironmentMemory state of version {STATE_VERSION}: "
                             f"got version {state.get('version') if isinstance(state, dict) else state!r}")
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


__all__ = ["EVICTIONS", "EXEMPLAR_ORDERS", "EXEMPLAR_SKILLS", "EnvRecord", "EnvironmentMemory", "Exemplar",
           "MAX_RECENT_PLAYS", "STATE_VERSION", "regeneration_statistics"]
