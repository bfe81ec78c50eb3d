"""``SandboxPool``: the trainer-side client of a sandbox host process.

The pool never runs environment code itself: it starts ``python -m spade_jax.sandbox.host_start``
(JAX-free, scrubbed environment, own session) and sends it batched requests. Every call
returns per-episode results in the order asked; failures of one episode are reported in
its result and never raise. A host that dies or hangs anyway is killed and started
again: the calls in flight and every episode it held then fail (``failed_call="host"``),
nothing else does. Only a host that cannot be started again raises ``SandboxError``.
Not thread-safe: use one pool per thread (or process).

    with SandboxPool(SandboxConfig(num_workers=4)) as pool:
        print(pool.isolation)
        first = pool.start([EpisodeSpec(program=src, seed=s, max_turns=8) for s in range(16)])
        ids = [r.episode_id for r in first]
        results = pool.step(ids, actions)
        pool.close(ids)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import select
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Sequence

import spade_jax
from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.protocol import HEADER_BYTES, ProtocolError, decode_payload, encode_frame, write_all
from spade_jax.sandbox.records import EpisodeSpec, IsolationReport, SandboxConfig, SolutionResult, StepResult

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_PASSTHROUGH = ("SPADE_SANDBOX_NO_NAMESPACES",)
_REPLY_MARGIN_S = 30.0


class SandboxError(RuntimeError):
    """The sandbox host could not be started (again), or refused a malformed request."""


class _NamespaceSetupFailed(SandboxError):
    """The host entered namespaces but could not build its private root."""


def host_environment() -> dict[str, str]:
    """The whole environment the host (and so every worker) starts with: no secrets from ours."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(spade_jax.__file__)))
    env = {"PYTHONPATH": package_root, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "LANG": "C.UTF-8", "PATH": os.defpath}
    env.update({name: "1" for name in _THREAD_VARS})
    env.update({name: os.environ[name] for name in _PASSTHROUGH if name in os.environ})
    return env


def host_command(config: SandboxConfig) -> list[str]:
    """How the host is started: the settings isolation needs before any config is read."""
    user_ns = {None: "auto", True: "yes", False: "no"}[config.user_namespace]
    command = [sys.executable, "-m", "spade_jax.sandbox.host_start", "--isolation", config.isolation,
               "--user-namespace", user_ns, "--pool-memory-mb", str(config.pool_memory_mb),
               "--pool-processes", str(config.pool_processes)]
    if config.host_uid is not None:
        gid = config.host_gid if config.host_gid is not None else config.host_uid
        command += ["--uid", str(config.host_uid), "--gid", str(gid)]
    return command


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class SandboxPool:
    """Runs environment episodes in isolated worker processes behind one sandbox host."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self._next_id = 0
        self._live: set[int] = set()
        self._lost: dict[int, str] = {}
        self.host_restarts = 0
        self.isolation = self._start()
        if self.isolation.missing:
            warnings.warn(f"sandbox protections not in force: {', '.join(self.isolation.missing)} "
                          f"({'; '.join(self.isolation.notes)})", RuntimeWarning, stacklevel=2)

    def _start(self) -> IsolationReport:
        try:
            return self._start_host(self.config)
        except _NamespaceSetupFailed as err:
            # the probe passed but building the private root did not: "auto" accepts less
            report = self._start_host(dataclasses.replace(self.config, isolation="rlimits"))
            return dataclasses.replace(report, notes=(
                f"namespaces were granted but setting them up failed ({err}); running without them",
                *report.notes[1:]))

    def _start_host(self, config: SandboxConfig) -> IsolationReport:
        self._closed = False
        self._proc = subprocess.Popen(
            host_command(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=host_environment(), cwd="/", close_fds=True, start_new_session=True)
        self._finalizer = weakref.finalize(self, _terminate, self._proc)
        self._wfd, self._rfd = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        try:
            write_all(self._wfd, encode_frame(config.to_dict()))
            hello = self._read(time.monotonic() + config.host_start_timeout_s)
        except BaseException:
            self._shutdown_host()
            raise
        if not hello.get("ok"):
            self._shutdown_host()
            error = hello.get("error", "the sandbox host failed to start")
            if hello.get("kind") == "isolation":
                raise IsolationUnavailable(error)
            if hello.get("kind") == "setup" and config.isolation == "auto":
                raise _NamespaceSetupFailed(error)
            raise SandboxError(error)
        return IsolationReport.from_dict(hello["isolation"])

    # --- public API --------------------------------------------------------------------------

    @property
    def host_pid(self) -> int:
        """Process id of the host (the outermost process of this pool's tree)."""
        return self._proc.pid

    def start(self, specs: Sequence[EpisodeSpec]) -> list[StepResult]:
        """Starts one episode per spec (fork, load, instantiate, reset), concurrently.

        Each result carries the new ``episode_id`` and the reset observation and info;
        on failure ``error`` (and ``timed_out``) is set and the episode is not live.
        ``close`` every id you get back, failed ones included (the host keeps a small
        record of each until then).
        """
        if not specs:
            return []
        programs, episodes = {}, []
        for spec in specs:
            if not isinstance(spec, EpisodeSpec):
                raise TypeError(f"start() takes EpisodeSpec objects, got {type(spec).__name__}")
            digest = hashlib.sha256(spec.program.encode("utf-8", "surrogatepass")).hexdigest()
            programs[digest] = spec.program
            episodes.append({"id": self._next_id, "program": digest, "seed": spec.seed,
                             "max_turns": spec.max_turns, "turn_limit": spec.turn_limit,
                             "env_kwargs": spec.env_kwargs})
            self._next_id += 1
        ids = [e["id"] for e in episodes]
        self._live.update(ids)
        budget = self.config.load_timeout_s + self.config.call_timeout_s
        reply = self._request({"op": "start", "programs": programs, "episodes": episodes}, len(specs), budget)
        if reply is None:
            return [self._lost_result(StepResult, eid) for eid in ids]
        return [StepResult.from_dict(r) for r in reply["results"]]

    def step(self, episode_ids: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        """Steps each episode with its action, concurrently; results in the order asked."""
        ids = _ids(episode_ids)
        if len(actions) != len(ids):
            raise ValueError(f"step() got {len(ids)} episode ids but {len(actions)} actions")
        return self._per_episode("step", ids, list(actions), StepResult)

    def solution_results(self, episode_ids: Sequence[int]) -> list[SolutionResult]:
        """Calls ``solution()`` on each episode's env; errors and timeouts are in the results."""
        return self._per_episode("solution", _ids(episode_ids), None, SolutionResult)

    def _per_episode(self, op: str, ids: list[int], actions: list[str] | None, kind) -> list:
        """One batched call for the episodes the host holds; lost episodes are answered here."""
        asked = [i for i, eid in enumerate(ids) if eid not in self._lost]
        message = {"op": op, "ids": [ids[i] for i in asked]}
        if actions is not None:
            message["actions"] = [actions[i] for i in asked]
        reply = self._request(message, len(asked), self.config.call_timeout_s) if asked else None
        results = [self._lost_result(kind, eid) for eid in ids]
        for i, raw in zip(asked, reply["results"] if reply else ()):
            results[i] = kind.from_dict(raw)
        return results

    def solution(self, episode_ids: Sequence[int]) -> list[str | None]:
        """Reference action sequences (one action per line); None where unavailable (see solution_results)."""
        return [r.solution for r in self.solution_results(episode_ids)]

    def close(self, episode_ids: Sequence[int]) -> None:
        """Ends episodes: their workers are killed and reaped, their ids forgotten."""
        ids = _ids(episode_ids)
        for eid in ids:
            self._lost.pop(eid, None)
        asked = [eid for eid in ids if eid in self._live]
        self._live.difference_update(asked)
        if asked:
            self._request({"op": "close", "ids": asked}, 1, 1.0)

    def output(self, episode_ids: Sequence[int]) -> list[str]:
        """What each episode's env printed since the last call (the last 16 KiB at most)."""
        ids = _ids(episode_ids)
        if not ids:
            return []
        reply = self._request({"op": "output", "ids": ids}, 1, 1.0)
        return reply["outputs"] if reply else [""] * len(ids)

    def stats(self) -> dict:
        """Live worker count, episode records held, fds registered by the host and the pool's
        memory (the cgroup's usage, or the sum of its workers' resident growth as last measured)."""
        reply = self._request({"op": "stats"}, 1, 1.0)
        if reply is None:
            return {"live": 0, "records": 0, "registered_fds": 0, "memory_bytes": 0}
        return {k: reply[k] for k in ("live", "records", "registered_fds", "memory_bytes")}

    def close_all(self) -> None:
        """Kills every episode and stops the host. Idempotent."""
        if self._closed:
            return
        try:
            if self._proc.poll() is None:
                self._exchange({"op": "shutdown"}, time.monotonic() + 5.0)
        except (OSError, EOFError, ProtocolError, SandboxError):
            pass
        self._shutdown_host()

    shutdown = close_all

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *_) -> None:
        self.close_all()

    # --- host channel ------------------------------------------------------------------------

    def _request(self, message: dict, calls: int, per_call_s: float) -> dict | None:
        """The host's reply, or None when the host died on this request (it is restarted, and
        every episode it held is lost)."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        waves = math.ceil(calls / self.config.num_workers)
        deadline = time.monotonic() + waves * (per_call_s + 0.5) + _REPLY_MARGIN_S
        try:
            reply = self._exchange(message, deadline)
        except (OSError, EOFError, ProtocolError, SandboxError) as err:
            self._restart(f"{type(err).__name__}: {err}")
            return None
        if not reply.get("ok"):
            raise SandboxError(reply.get("error", "the sandbox host refused the request"))
        return reply

    def _exchange(self, message: dict, deadline: float) -> dict:
        write_all(self._wfd, encode_frame(message))
        return self._read(deadline)

    def _restart(self, why: str) -> None:
        """Replaces a dead or hung host; every episode it held is lost."""
        self._shutdown_host()
        code = self._proc.poll()
        reason = f"the sandbox host died ({why}; exit code {code}) and was restarted: this episode is lost"
        self._lost.update({eid: reason for eid in self._live})
        self._live.clear()
        warnings.warn(reason.replace(": this episode is lost", f"; {len(self._lost)} episodes lost"), RuntimeWarning,
                      stacklevel=3)
        try:
            self.isolation = self._start()
        except (OSError, SandboxError, IsolationUnavailable) as err:
            self._closed = True
            raise SandboxError(f"the sandbox host died ({why}) and could not be started again: {err}") from None
        self.host_restarts += 1

    def _lost_result(self, kind, eid: int):
        """The result (StepResult or SolutionResult) of a call on an episode the host took with it."""
        over = {"truncated": True} if kind is StepResult else {}
        return kind(eid, error=self._lost.get(eid, f"the sandbox host died; episode {eid} is lost"),
                    failed_call="host", **over)

    def _read(self, deadline: float) -> dict:
        header = self._read_exact(HEADER_BYTES, deadline)
        return decode_payload(self._read_exact(int.from_bytes(header, "big"), deadline))

    def _read_exact(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not select.select([self._rfd], [], [], timeout)[0]:
                self._shutdown_host()
                raise SandboxError("the sandbox host did not answer in time; it was killed")
            chunk = os.read(self._rfd, min(left, 1 << 20))
            if not chunk:
                raise EOFError("the sandbox host closed its channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _shutdown_host(self) -> None:
        self._closed = True
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._finalizer()
        if getattr(self, "isolation", None) is not None:
            _remove_cgroups(self.isolation.budget.get("cgroup_paths", ()))


def _remove_cgroups(paths: Sequence[str], timeout_s: float = 2.0) -> None:
    """Removes the pool cgroup a host left behind (its outer guard removes it unless it was
    killed); its last processes may take a moment to leave."""
    deadline = time.monotonic() + timeout_s
    for path in paths:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


def _ids(episode_ids: Sequence[int]) -> list[int]:
    ids = list(episode_ids)
    for eid in ids:
        if isinstance(eid, bool) or not isinstance(eid, int):
            raise TypeError(f"episode ids are ints, got {eid!r}")
    return ids
