"""Plain dataclasses exchanged with the sandbox: its config, episode specs, results, isolation report.

Standard library only (the host process imports this, and it must stay JAX-free).
"""

from __future__ import annotations

import dataclasses
import json

ISOLATION_LEVELS = ("auto", "strict", "namespaces", "rlimits")
# Every protection the isolation report lists (see ``IsolationReport``), in the order ``missing`` names them.
PROTECTIONS = ("zygote", "idle_stop", "seccomp", "private_root", "pid_namespace", "network_namespace",
               "ipc_namespace", "per_episode_uid", "process_limit", "landlock_filesystem", "landlock_network",
               "landlock_scopes", "memory_cgroup", "pids_cgroup", "scratch_tmpfs")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """How a SandboxPool runs episodes.

    num_workers: how many episode calls (start/step/solution) run at once; each live
      episode still owns its own worker process. Roughly the CPU cores to spend.
    max_live_episodes: live worker processes allowed at once (starts beyond get an error).
    isolation: "auto" uses every protection the machine allows and says at start-up which
      are missing; "strict" refuses to start (IsolationUnavailable) unless every protection
      of ``IsolationReport.protections`` is in force; "namespaces" demands the namespaces
      (private root, PID, network, IPC) and fails closed without them; "rlimits" does not
      try namespaces (seccomp, Landlock and the budgets still apply).
    user_namespace: None creates a user namespace only when not root; True/False force it.
    host_uid / host_gid: run the sandbox host and its workers as this uid/gid (the client
      must be root to switch; gid defaults to the uid): an unprivileged account for the
      whole sandbox when the trainer runs as root.
    load_timeout_s: deadline for forking a worker, running the program's module code and
      instantiating the class. call_timeout_s: deadline for each reset/step/solution call.
      episode_time_s: the time all calls of one episode may take together (a program whose
      every call stays just under call_timeout_s still ends).
    pool_memory_mb / pool_processes: the budget of the whole sandbox (every worker
      together): a cgroup enforces it where the machine has writable cgroups, else the host
      sums its workers' memory and kills the largest busy one past the budget.
    cpu_seconds, memory_mb (address space on top of the preloaded interpreter), disk_mb
      (private scratch filesystem and largest file), open_files, max_processes (RLIMIT_NPROC;
      1 forbids fork and threads): per-episode resource limits.
    output_limit_bytes: stdout+stderr an episode may write before it is killed.
    max_observation_chars / max_message_bytes: size caps on what a worker may return.
    restrict_imports: enforce the import policy at run time inside workers as well.
    timeout_reward: reward reported for a step that timed out (DESIGN: episode reward).
    """

    num_workers: int = 2
    max_live_episodes: int = 2048
    isolation: str = "auto"
    user_namespace: bool | None = None
    host_uid: int | None = None
    host_gid: int | None = None
    load_timeout_s: float = 10.0
    call_timeout_s: float = 5.0
    episode_time_s: float = 120.0
    pool_memory_mb: int = 4096
    pool_processes: int = 4096
    cpu_seconds: int = 120
    memory_mb: int = 1024
    disk_mb: int = 16
    open_files: int = 64
    max_processes: int = 1
    output_limit_bytes: int = 1 << 20
    max_observation_chars: int = 65536
    max_message_bytes: int = 4 << 20
    restrict_imports: bool = True
    timeout_reward: float = -0.5
    host_start_timeout_s: float = 60.0

    def __post_init__(self):
        if self.isolation not in ISOLATION_LEVELS:
            raise ValueError(f"SandboxConfig.isolation must be one of {ISOLATION_LEVELS}, got {self.isolation!r}")
        for name in ("num_workers", "max_live_episodes", "cpu_seconds", "memory_mb", "disk_mb",
                     "open_files", "max_processes", "output_limit_bytes", "max_observation_chars",
                     "max_message_bytes", "pool_memory_mb", "pool_processes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"SandboxConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("load_timeout_s", "call_timeout_s", "episode_time_s", "host_start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_live_episodes > 65536:
            raise ValueError("SandboxConfig.max_live_episodes must be at most 65536 (one uid each)")
        for name in ("host_uid", "host_gid"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"SandboxConfig.{name} must be a non-negative int or None, got {value!r}")
        if self.host_gid is not None and self.host_uid is None:
            raise ValueError("SandboxConfig.host_gid needs host_uid")
        if self.open_files < 8:
            raise ValueError("SandboxConfig.open_files must be at least 8 (the worker needs a few itself)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SandboxConfig":
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode to start: the program's source, the reset seed and the env's max_turns.

    ``max_turns`` goes to the constructor (None: the class's own default); ``env_kwargs``
    too (JSON-serialisable). ``turn_limit`` is the number of steps after which the sandbox
    itself truncates the episode: by default max_turns, else the env's ``self.max_turns``
    (at most 1000), else 100.
    """

    program: str
    seed: int | None = 0
    max_turns: int | None = None
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    turn_limit: int | None = None

    def __post_init__(self):
        if not isinstance(self.program, str):
            raise ValueError(f"EpisodeSpec.program must be the source text (str), got {type(self.program).__name__}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"EpisodeSpec.seed must be an int or None, got {self.seed!r}")
        if self.max_turns is not None and (not isinstance(self.max_turns, int) or self.max_turns < 1):
            raise ValueError(f"EpisodeSpec.max_turns must be a positive int or None, got {self.max_turns!r}")
        if self.turn_limit is not None and (not isinstance(self.turn_limit, int) or self.turn_limit < 1):
            raise ValueError(f"EpisodeSpec.turn_limit must be a positive int or None, got {self.turn_limit!r}")
        try:
            json.dumps(self.env_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"EpisodeSpec.env_kwargs must be JSON-serialisable: {err}") from None


@dataclasses.dataclass
class StepResult:
    """What one start (reset) or step call produced for one episode.

    ``reward`` is clipped to [-1, 1] (``raw_reward`` is what the env returned); a step that
    timed out reports ``timeout_reward``. When ``error`` is set the episode is over
    (``truncated`` is True) and ``failed_call`` names the call that failed: "load"
    (module code or constructor), "reset", "step" or "limit" (sandbox-side refusal).
    ``env_class``, ``tools`` (the tool names a ToolUseEnv declares) and ``turn_limit``
    (steps after which the sandbox truncates) are set on start results; ``turn`` counts
    the steps taken.
    """

    episode_id: int
    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False
    raw_reward: float = 0.0
    turn: int = 0
    failed_call: str | None = None
    env_class: str | None = None
    tools: list[str] = dataclasses.field(default_factory=list)
    turn_limit: int | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @classmethod
    def from_dict(cls, data: dict) -> "StepResult":
        return cls(**data)


@dataclasses.dataclass
class SolutionResult:
    """The reference solution of one episode (None when the env has none or the call failed).

    ``failed_call`` is "host" when the sandbox host died during the call, as for StepResult.
    """

    episode_id: int
    solution: str | None = None
    error: str | None = None
    timed_out: bool = False
    failed_call: str | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "SolutionResult":
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class IsolationReport:
    """The isolation actually in force for a pool's workers.

    method: "namespaces" (root), "user-namespaces" (unprivileged) or "rlimits".
    protections: each name of ``PROTECTIONS`` -> whether it is in force:
      zygote: workers are forked from a template process that never held a request, a
        config or another program (always); idle_stop: a worker is stopped (SIGSTOP)
        between calls, so nothing it armed runs while the host is not waiting (always);
      seccomp: the syscall filter of ``seccomp.py`` (no exec, sockets, memfd, IPC, timers,
        calls aimed at other processes);
      private_root: a mount namespace holding only the read-only Python runtime and a
        private scratch directory; pid_namespace: each episode is init of its own PID
        namespace; network_namespace / ipc_namespace: each episode has its own (empty);
      per_episode_uid: each live episode runs as its own unprivileged uid; process_limit:
        RLIMIT_NPROC binds (not for uid 0 without per-episode uids);
      landlock_filesystem / landlock_network / landlock_scopes: Landlock limits reads to
        the runtime, writes to the scratch directory, denies TCP, and scopes abstract unix
        sockets and signals to the episode;
      memory_cgroup / pids_cgroup: the pool budget is a cgroup limit (else the host's
        supervisor enforces the memory budget and rlimits bound processes);
      scratch_tmpfs: the scratch directory is a size-limited tmpfs (else the host checks
        its size after every call and while calls run).
    rlimits: the limits applied to each worker (cpu_s, address_space_mb, file_size_mb,
      open_files, processes).
    budget: the whole pool's budget and what enforces it.
    notes: why a protection is not in force, and other caveats.
    """

    method: str
    protections: dict
    rlimits: dict
    budget: dict = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def missing(self) -> list[str]:
        """Protections not in force, in ``PROTECTIONS`` order."""
        return [name for name in PROTECTIONS if not self.protections.get(name)]

    @property
    def full(self) -> bool:
        return not self.missing

    @property
    def per_episode_uid(self) -> bool:
        return bool(self.protections.get("per_episode_uid"))

    @property
    def syscall_filter(self) -> bool:
        return bool(self.protections.get("seccomp"))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["notes"] = list(self.notes)
        data["missing"] = self.missing
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "IsolationReport":
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        return cls(**kwargs)
