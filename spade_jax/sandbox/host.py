"""The sandbox host: a JAX-free supervisor that forks, jails, drives and kills episode workers.

``SandboxPool`` starts it as ``python -m spade_jax.sandbox.host`` with a scrubbed
environment and talks to it in frames (``protocol.py``) over the host's stdin/stdout.
The first frame is the ``SandboxConfig``; the host probes the kernel, enters namespaces
when it can (becoming init of a new PID namespace, so every worker dies with it), preloads
numpy and the allowed stdlib modules, pivots into the private root and answers with the
``IsolationReport``. Then it serves batched requests (start/step/solution/close/output)
in one single-threaded event loop:

* a worker per episode, forked from this preloaded process (pages are shared), each in
  its own PID namespace, with a socketpair for the protocol (fd 3) and a pipe for its
  stdout/stderr (captured, capped; flooding kills it);
* at most ``num_workers`` calls in flight; every call has a deadline, past which the
  worker (its whole PID namespace, or process group without namespaces) is SIGKILLed;
* replies are checked here (``validate.py``) before anything goes back to the client;
  any failure costs only the episode that caused it.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib
import os
import random
import resource
import selectors
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import time
import traceback

from spade_jax.sandbox import isolation, worker
from spade_jax.sandbox.policy import ALLOWED_MODULES
from spade_jax.sandbox.protocol import (FrameBuffer, ProtocolError, decode_payload, encode_frame, read_frame,
                                        write_all)
from spade_jax.sandbox.records import IsolationReport, SandboxConfig, SolutionResult, StepResult
from spade_jax.sandbox.validate import (ContractViolation, EnvFailure, check_load, check_reset, check_solution,
                                        check_step, clip_reward, unwrap)

_PRELOAD_EXTRA = ("numpy.random", "numpy.linalg", "numpy.fft", "numpy.polynomial")
_OUTPUT_KEEP_BYTES = 16384
_UID_SPAN = 1 << 16
_EXIT_GRACE_S = 0.05
_MAX_TURN_LIMIT = 1000
_DEFAULT_TURN_LIMIT = 100


@dataclasses.dataclass
class _Plan:
    """The isolation the host will set up, decided by probing before committing to it."""

    namespaces: bool
    user_namespace: bool = False
    notes: list = dataclasses.field(default_factory=list)
    error: str | None = None
    uid_base: int | None = None
    uid_lock: socket.socket | None = None


def claim_uid_range() -> tuple[int, socket.socket]:
    """A block of _UID_SPAN uids no other sandbox on this machine uses, for per-episode uids.

    The claim is an abstract unix socket named after the block: bound while this process
    (or its forked host) lives, released by the kernel when they exit, nothing on disk.
    Must run in the machine's network namespace, i.e. before entering ours.
    """
    rng = random.SystemRandom()
    for _ in range(256):
        base = rng.randrange(0x4000, 0x7FFF) * _UID_SPAN
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0spade-sandbox-uids-{base:x}")
        except OSError:
            lock.close()
            continue
        lock.set_inheritable(False)
        return base, lock
    raise OSError("no free uid block for per-episode uids")


def choose_isolation(config: SandboxConfig) -> _Plan:
    """Probes namespaces (unless disabled) and applies the config's demand; fails closed when asked."""
    if config.isolation == "rlimits":
        return _Plan(False, notes=["namespaces not requested (isolation='rlimits')"])
    if os.environ.get("SPADE_SANDBOX_NO_NAMESPACES") == "1":
        reason = "disabled by SPADE_SANDBOX_NO_NAMESPACES=1"
    elif sys.platform != "linux":
        reason = f"not Linux ({sys.platform})"
    else:
        if config.user_namespace is not None:
            order = [config.user_namespace]
        else:
            order = [False, True] if os.geteuid() == 0 else [True]
        attempts = []
        for user_ns in order:
            why = isolation.probe(user_ns)
            if why is None:
                return _Plan(True, user_namespace=user_ns)
            attempts.append(f"{'with a user namespace' if user_ns else 'as root'}: {why}")
        reason = "; ".join(attempts)
    if config.isolation == "namespaces":
        return _Plan(False, error=(
            f"isolation='namespaces' is required but namespaces are not available ({reason}). "
            "Run as root, or enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; "
            "on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0), or accept process limits "
            "only with SandboxConfig(isolation='auto')."))
    return _Plan(False, notes=[f"namespaces unavailable ({reason}): workers share the host's network and files"])


@dataclasses.dataclass(eq=False)
class _Episode:
    eid: int
    program: str | None
    seed: int | None
    max_turns: int | None
    turn_limit: int | None
    env_kwargs: dict
    pid: int = 0
    sock: int = -1
    out_fd: int = -1
    slot: int = -1
    scratch_dir: str | None = None
    state: str = "new"
    frames: FrameBuffer | None = None
    wbuf: bytearray = dataclasses.field(default_factory=bytearray)
    call: "_Call | None" = None
    turn: int = 0
    ended: bool = False
    meta: dict = dataclasses.field(default_factory=dict)
    output: bytearray = dataclasses.field(default_factory=bytearray)
    output_total: int = 0
    dead_reason: str | None = None


@dataclasses.dataclass(eq=False)
class _Call:
    ep: _Episode
    kind: str
    index: int
    action: str | None = None
    phase: str = ""
    deadline: float = 0.0
    t0: float = 0.0


class Host:
    """The supervisor's state and event loop (one instance per host process)."""

    def __init__(self, config: SandboxConfig, plan: _Plan, cmd_fd: int, reply_fd: int, devnull: int):
        self.cfg = config
        self.plan = plan
        self.cmd_fd, self.reply_fd, self.devnull = cmd_fd, reply_fd, devnull
        self.episodes: dict[int, _Episode] = {}
        self.by_pid: dict[int, _Episode] = {}
        self.statuses: dict[int, int] = {}
        self.inflight: set[_Call] = set()
        self.results: list = []
        self.sel = selectors.DefaultSelector()
        self.sel.register(cmd_fd, selectors.EVENT_READ, None)
        self.free_slots = list(range(config.max_live_episodes - 1, -1, -1))
        self.pool_dir: str | None = None
        self.scratch = isolation.SCRATCH
        self.pidns_fd = -1
        self.uid_base: int | None = None
        self.report: IsolationReport | None = None

    # --- setup -------------------------------------------------------------------------------

    def setup(self) -> IsolationReport:
        """Preloads modules, enters the private root (namespaces) or a private temp dir, raises fd limits."""
        for name in sorted(ALLOWED_MODULES - {"__future__"}) + list(_PRELOAD_EXTRA):
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        vm_bytes = _vm_size_bytes()
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        euid = os.geteuid()
        outer_root = euid == 0 and (not self.plan.user_namespace or _outer_uid_is_root())
        notes = list(self.plan.notes)
        if self.plan.namespaces:
            self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            isolation.build_private_root(_runtime_dirs())
            isolation.sethostname("sandbox")
            method = "user-namespaces" if self.plan.user_namespace else "namespaces"
            notes.append("episodes share one empty network namespace (no interfaces up)")
        else:
            isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
            self.pool_dir = tempfile.mkdtemp(prefix="spade_sandbox_")
            os.chmod(self.pool_dir, 0o711)
            method = "rlimits"
        self.uid_base = self.plan.uid_base
        if self.plan.user_namespace:
            notes.append("one uid for all episodes (only root is mapped in the user namespace); "
                         "capabilities are dropped")
        self.syscall_filter = isolation.probe_syscall_filter()
        if not self.syscall_filter:
            notes.append("no seccomp filter (unsupported architecture or kernel)")
        self.rlimits = isolation.worker_rlimits(
            self.cfg.cpu_seconds, vm_bytes + self.cfg.memory_mb * (1 << 20), self.cfg.disk_mb * (1 << 20),
            self.cfg.open_files, self.cfg.max_processes)
        processes_enforced = self.uid_base is not None or not outer_root
        if not processes_enforced:
            notes.append("the process limit is not enforced for root's uid: fork is not blocked")
        self.report = IsolationReport(
            method=method,
            network="none" if self.plan.namespaces else "host",
            filesystem="private-root" if self.plan.namespaces else "host",
            pid_namespace=self.plan.namespaces,
            per_episode_uid=self.uid_base is not None,
            syscall_filter=self.syscall_filter,
            rlimits={"cpu_s": self.cfg.cpu_seconds, "address_space_mb": self.rlimits[resource.RLIMIT_AS][0] >> 20,
                     "file_size_mb": self.cfg.disk_mb, "open_files": self.cfg.open_files,
                     "processes": self.cfg.max_processes},
            processes_enforced=processes_enforced,
            notes=tuple(notes))
        stdlib = sysconfig.get_paths()["stdlib"]
        self.worker_sys_path = [p for p in sys.path if p == stdlib or p.startswith(stdlib + "/")]
        gc.collect()
        gc.freeze()
        return self.report

    # --- request loop ------------------------------------------------------------------------

    def serve(self) -> None:
        """Answers client requests until shutdown or until the client goes away."""
        while True:
            if not self._poll(None):
                continue
            try:
                request = read_frame(self.cmd_fd, 1 << 31)
            except (EOFError, OSError, ProtocolError):
                break
            try:
                reply = self._handle(request)
            except Exception as err:  # a host bug: report it, keep serving
                traceback.print_exc(file=sys.stderr)
                reply = {"ok": False, "error": f"sandbox host error: {type(err).__name__}: {err}"}
            try:
                write_all(self.reply_fd, encode_frame(reply))
            except OSError:
                break
            if request.get("op") == "shutdown":
                break
        self.shutdown()

    def shutdown(self) -> None:
        self._kill_many(list(self.episodes.values()))
        if self.pool_dir:
            self._sweep_strays()
            shutil.rmtree(self.pool_dir, ignore_errors=True)

    def _handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "start":
            programs = request["programs"]
            calls = []
            for index, item in enumerate(request["episodes"]):
                eid = item["id"]
                if eid in self.episodes:
                    raise ValueError(f"episode id {eid} is already in use")
                ep = _Episode(eid, programs[item["program"]], item["seed"], item["max_turns"],
                              item.get("turn_limit") or item["max_turns"], item["env_kwargs"])
                self.episodes[eid] = ep
                calls.append(_Call(ep, "start", index))
            return {"ok": True, "results": self._run(calls)}
        if op in ("step", "solution"):
            ids = request["ids"]
            actions = request.get("actions") or [None] * len(ids)
            if len(actions) != len(ids):
                raise ValueError("step needs one action per episode id")
            return {"ok": True, "results": self._run([self._call_for(op, i, eid, action)
                                                      for i, (eid, action) in enumerate(zip(ids, actions))])}
        if op == "close":
            closing = [self.episodes.pop(eid) for eid in request["ids"] if eid in self.episodes]
            self._kill_many(closing)
            return {"ok": True}
        if op == "output":
            outputs = []
            for eid in request["ids"]:
                ep = self.episodes.get(eid)
                outputs.append(ep.output.decode("utf-8", "replace") if ep else "")
                if ep:
                    ep.output.clear()
            return {"ok": True, "outputs": outputs}
        if op == "stats":
            return {"ok": True, "live": len(self.by_pid), "records": len(self.episodes),
                    "registered_fds": len(self.sel.get_map()) - 1}
        if op == "shutdown":
            return {"ok": True}
        return {"ok": False, "error": f"unknown request {op!r}"}

    def _call_for(self, kind: str, index: int, eid: int, action) -> _Call:
        ep = self.episodes.get(eid)
        if ep is None:
            ep = _Episode(eid, None, None, None, None, {}, state="dead", dead_reason=f"unknown episode id {eid}")
        return _Call(ep, kind, index, action=action)

    # --- batches -----------------------------------------------------------------------------

    def _run(self, calls: list[_Call]) -> list[dict]:
        """Runs calls with at most num_workers in flight; results in the order of ``calls``."""
        self.results = [None] * len(calls)
        pending = collections.deque(calls)
        busy = set()
        while pending or self.inflight:
            while pending and len(self.inflight) < self.cfg.num_workers:
                call = pending.popleft()
                if call.ep in busy:
                    self._finish(call, self._error(call, "the same episode appears twice in one request", "limit",
                                                   episode_over=False))
                    continue
                busy.add(call.ep)
                self._dispatch(call)
            if self.inflight:
                self._poll(self._next_timeout())
        return self.results

    def _dispatch(self, call: _Call) -> None:
        ep = call.ep
        now = time.monotonic()
        call.t0 = now
        if call.kind == "start":
            if len(self.by_pid) >= self.cfg.max_live_episodes:
                ep.state, ep.dead_reason = "dead", "too many live episodes"
                self._finish(call, self._error(call, f"too many live episodes (max_live_episodes="
                                                     f"{self.cfg.max_live_episodes}); close finished episodes", "limit"))
                return
            try:
                self._spawn(ep)
            except OSError as err:
                ep.state, ep.dead_reason = "dead", f"could not start a worker: {err}"
                self._finish(call, self._error(call, ep.dead_reason, "load"))
                return
            call.phase, call.deadline = "load", now + self.cfg.load_timeout_s
            ep.state = "busy"
        else:
            refusal = self._refusal(call)
            if refusal:
                over = ep.state == "dead" or ep.ended
                self._finish(call, self._error(call, refusal, "limit", episode_over=over))
                return
            call.phase = call.kind
            call.deadline = now + self.cfg.call_timeout_s
            message = {"op": "step", "action": call.action} if call.kind == "step" else {"op": "solution"}
            self._send(ep, encode_frame(message))
        ep.call = call
        self.inflight.add(call)

    def _refusal(self, call: _Call) -> str | None:
        """Why a step/solution call is answered without asking the worker, or None."""
        ep = call.ep
        if ep.state == "dead":
            return f"episode {ep.eid} is not live: {ep.dead_reason}"
        if call.kind == "step":
            if not isinstance(call.action, str):
                return "the action must be a str"
            if ep.ended:
                return f"episode {ep.eid} has already ended"
        elif not ep.meta.get("has_solution"):
            return "the environment defines no solution()"
        return None

    def _next_timeout(self) -> float:
        deadline = min(call.deadline for call in self.inflight)
        return max(0.0, min(1.0, deadline - time.monotonic()))

    # --- workers -----------------------------------------------------------------------------

    def _spawn(self, ep: _Episode) -> None:
        """Forks the episode's worker; the child jails itself and runs ``worker.serve``.

        Raises OSError (with nothing leaked) when the fds, the directory or the fork fail.
        """
        fds: list[int] = []
        slot = self.free_slots.pop()
        new_pid_ns = False
        try:
            host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            fds += [host_end.detach(), child_end.detach()]
            fds += os.pipe()
            uid = None if self.uid_base is None else self.uid_base + slot
            scratch = self.scratch if self.plan.namespaces else self._make_scratch_dir(ep, uid)
            if self.plan.namespaces:
                isolation.unshare(isolation.CLONE_NEWPID)
                new_pid_ns = True
            pid = os.fork()
        except OSError:
            if new_pid_ns:
                isolation.setns(self.pidns_fd, isolation.CLONE_NEWPID)
            for fd in fds:
                os.close(fd)
            self.free_slots.append(slot)
            if ep.scratch_dir:
                shutil.rmtree(ep.scratch_dir, ignore_errors=True)
                ep.scratch_dir = None
            raise
        host_fd, child_fd, out_r, out_w = fds
        if pid == 0:
            self._become_worker(ep, child_fd, out_w, scratch, uid)
        if new_pid_ns:
            isolation.setns(self.pidns_fd, isolation.CLONE_NEWPID)
        os.close(child_fd)
        os.close(out_w)
        os.set_blocking(host_fd, False)
        os.set_blocking(out_r, False)
        ep.pid, ep.sock, ep.out_fd, ep.slot = pid, host_fd, out_r, slot
        ep.frames = FrameBuffer(self.cfg.max_message_bytes)
        ep.program = None
        self.by_pid[pid] = ep
        self.sel.register(host_fd, selectors.EVENT_READ, (ep, "sock"))
        self.sel.register(out_r, selectors.EVENT_READ, (ep, "out"))

    def _make_scratch_dir(self, ep: _Episode, uid: int | None) -> str:
        path = os.path.join(self.pool_dir, f"episode-{ep.eid}")
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, uid)
        ep.scratch_dir = path
        return path

    def _become_worker(self, ep: _Episode, channel_fd: int, out_w: int, scratch: str, uid: int | None):
        """Child side of the fork: wire fds, jail, run the worker. Never returns."""
        try:
            os.dup2(self.devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.dup2(channel_fd, 3)
            os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            isolation.jail_worker(self.plan.namespaces, scratch, uid, self.rlimits, self.cfg.disk_mb << 20,
                                  self.syscall_filter)
            os.environ.clear()
            os.environ.update({"HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", "PATH": ""})
            sys.path[:] = self.worker_sys_path
            _reseed_numpy()
            worker.serve(ep.program, ep.seed, ep.max_turns, ep.env_kwargs, self.cfg.restrict_imports,
                         self.cfg.max_message_bytes)
        except BaseException as err:
            try:
                write_all(3, encode_frame({"ok": False, "error": f"sandbox setup failed: {err}"}))
            except BaseException:
                pass
        finally:
            os._exit(0)

    def _send(self, ep: _Episode, frame: bytes) -> None:
        ep.wbuf += frame
        self._flush_writes(ep)

    def _flush_writes(self, ep: _Episode) -> None:
        try:
            while ep.wbuf:
                sent = os.write(ep.sock, ep.wbuf)
                del ep.wbuf[:sent]
        except BlockingIOError:
            pass
        except OSError:
            ep.wbuf.clear()  # the worker is gone; its EOF reports it
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if ep.wbuf else 0)
        self.sel.modify(ep.sock, events, (ep, "sock"))

    def _poll(self, timeout: float | None) -> bool:
        """Handles worker events and expired deadlines; True when the client has sent a request."""
        client = False
        for key, mask in self.sel.select(timeout):
            if key.data is None:
                client = True
                continue
            ep, kind = key.data
            if ep.pid == 0:
                continue
            if kind == "out":
                self._read_output(ep)
            else:
                if mask & selectors.EVENT_WRITE:
                    self._flush_writes(ep)
                if mask & selectors.EVENT_READ and ep.pid:
                    self._read_channel(ep)
        now = time.monotonic()
        for call in [c for c in self.inflight if c.deadline <= now]:
            if call in self.inflight:
                limit = self.cfg.load_timeout_s if call.phase == "load" else self.cfg.call_timeout_s
                self._fail(call.ep, f"timeout: {call.phase} took longer than {limit:g} s", timed_out=True)
        return client

    def _read_channel(self, ep: _Episode) -> None:
        try:
            data = os.read(ep.sock, 1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._fail(ep, None)
            return
        if ep.call is None:  # never buffer for idle workers: host memory stays num_workers * max_message_bytes
            self._fail(ep, "protocol error: data from the worker while no call was pending")
            return
        try:
            payloads = ep.frames.feed(data)
        except ProtocolError as err:
            self._fail(ep, f"protocol error: {err}")
            return
        for payload in payloads:
            if ep.pid == 0:
                return
            self._on_message(ep, payload)

    def _read_output(self, ep: _Episode) -> None:
        try:
            data = os.read(ep.out_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(ep.out_fd)
            os.close(ep.out_fd)
            ep.out_fd = -1
            return
        ep.output_total += len(data)
        ep.output += data
        del ep.output[:-_OUTPUT_KEEP_BYTES]
        if ep.output_total > self.cfg.output_limit_bytes:
            self._fail(ep, f"output limit exceeded: wrote more than {self.cfg.output_limit_bytes} bytes "
                           "to stdout/stderr")

    def _on_message(self, ep: _Episode, payload: bytes) -> None:
        call = ep.call
        if call is None:
            self._fail(ep, "protocol error: message from the worker while no call was pending")
            return
        phase = call.phase
        limit = self.cfg.max_observation_chars
        try:
            reply = decode_payload(payload)
            if phase == "load":
                ep.meta = check_load(reply)
                if ep.turn_limit is None:
                    ep.turn_limit = min(ep.meta["max_turns"] or _DEFAULT_TURN_LIMIT, _MAX_TURN_LIMIT)
                call.phase, call.deadline = "reset", time.monotonic() + self.cfg.call_timeout_s
                return
            value = unwrap(reply)
            if phase == "reset":
                observation, info = check_reset(value, limit)
                result = self._step_result(call, observation=observation, info=info, env_class=ep.meta["class"],
                                           tools=list(ep.meta["tools"]), turn_limit=ep.turn_limit)
            elif phase == "step":
                observation, reward, terminated, truncated, info = check_step(value, limit)
                ep.turn += 1
                truncated = truncated or (not terminated and ep.turn >= ep.turn_limit)
                ep.ended = terminated or truncated
                result = self._step_result(call, observation=observation, reward=clip_reward(reward),
                                           raw_reward=reward, terminated=terminated, truncated=truncated, info=info)
            else:
                result = dataclasses.asdict(SolutionResult(ep.eid, solution=check_solution(value, limit)))
        except ProtocolError as err:
            self._fail(ep, f"protocol error: {err}")
        except EnvFailure as err:
            self._fail(ep, f"loading the program failed: {err}" if phase == "load" else f"{phase}() raised {err}")
        except ContractViolation as err:
            self._fail(ep, f"contract violation: {err}")
        else:
            ep.state, ep.call = "idle", None
            self._finish(call, result)

    def _step_result(self, call: _Call, **fields) -> dict:
        return dataclasses.asdict(StepResult(call.ep.eid, turn=call.ep.turn,
                                             elapsed_s=time.monotonic() - call.t0, **fields))

    def _error(self, call: _Call, message: str, failed_call: str, timed_out: bool = False,
               episode_over: bool = True) -> dict:
        ep = call.ep
        if call.kind == "solution":
            return dataclasses.asdict(SolutionResult(ep.eid, error=message, timed_out=timed_out))
        reward = self.cfg.timeout_reward if timed_out and failed_call == "step" else 0.0
        return self._step_result(call, error=message, timed_out=timed_out, truncated=episode_over, reward=reward,
                                 raw_reward=reward, failed_call=failed_call, env_class=ep.meta.get("class"))

    def _finish(self, call: _Call, result: dict) -> None:
        self.results[call.index] = result
        self.inflight.discard(call)
        if call.ep.call is call:
            call.ep.call = None

    def _fail(self, ep: _Episode, message: str | None, timed_out: bool = False) -> None:
        """Kills the episode's worker; answers its pending call (if any) with ``message``."""
        status = self._kill(ep, wait_first=message is None)
        if message is None:
            message = _describe_exit(status)
        ep.dead_reason = message
        call = ep.call
        if call is not None:
            self._finish(call, self._error(call, message, call.phase, timed_out=timed_out))

    def _kill(self, ep: _Episode, wait_first: bool = False) -> int | None:
        """SIGKILLs the worker (its PID namespace or process group), reaps it, frees fds/slot/dir.

        ``wait_first``: the worker's channel hit EOF, so give it a moment to exit by itself
        and report its own exit status rather than our SIGKILL.
        """
        status = None
        if ep.pid:
            if wait_first:
                status = self._wait_exit(ep.pid)
            if status is None:
                self._signal(ep.pid)
                status = self._reap(ep.pid)
        self._release(ep)
        return status

    def _kill_many(self, eps: list[_Episode]) -> None:
        """Like ``_kill`` for many episodes: signal all first so their teardowns overlap."""
        for ep in eps:
            if ep.pid:
                self._signal(ep.pid)
        swept = False
        for ep in eps:
            if ep.pid:
                self._reap(ep.pid)
                swept = True
            self._release(ep, sweep=False)
        if swept and not self.plan.namespaces:
            self._sweep_strays()

    def _release(self, ep: _Episode, sweep: bool = True) -> None:
        if ep.pid:
            del self.by_pid[ep.pid]
            for fd in (ep.sock, ep.out_fd):
                if fd >= 0:
                    self.sel.unregister(fd)
                    os.close(fd)
            ep.pid, ep.sock, ep.out_fd = 0, -1, -1
            self.free_slots.append(ep.slot)
            if sweep and not self.plan.namespaces:
                self._sweep_strays()
        if ep.scratch_dir:
            shutil.rmtree(ep.scratch_dir, ignore_errors=True)
            ep.scratch_dir = None
        ep.state = "dead"
        if ep.dead_reason is None:
            ep.dead_reason = "closed"

    def _signal(self, pid: int) -> None:
        if not self.plan.namespaces:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def _wait_exit(self, pid: int) -> int | None:
        """The exit status if the worker exits by itself within a short grace period (EOF seen)."""
        end = time.monotonic() + _EXIT_GRACE_S
        while True:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return self.statuses.pop(pid, None)
            if got:
                return status
            if time.monotonic() > end:
                return None
            time.sleep(0.001)

    def _reap(self, pid: int) -> int | None:
        while True:
            try:
                return os.waitpid(pid, 0)[1]
            except ChildProcessError:
                return self.statuses.pop(pid, None)
            except InterruptedError:
                continue

    def _sweep_strays(self) -> None:
        """Without PID namespaces: kills and reaps processes that escaped a worker's process group.

        They are reparented to this host (a child subreaper) or, with per-episode uids, run
        under a uid this host owns; both are found in /proc. Repeats until a scan finds none,
        since killing a stray can reparent its own children to us.
        """
        for _ in range(50):
            strays = self._find_strays()
            if not strays:
                break
            for pid, _ in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for pid, ours in strays:
                if ours:
                    self._reap(pid)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.by_pid:
                self.statuses[pid] = status

    def _find_strays(self) -> list[tuple[int, bool]]:
        """(pid, is our child) of processes that are neither this host nor a live worker but
        are our children or run under one of our episode uids."""
        me = os.getpid()
        uid_range = range(self.uid_base, self.uid_base + _UID_SPAN) if self.uid_base is not None else range(0)
        strays = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in self.by_pid or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            ppid = int(fields.get("PPid", "0").strip() or 0)
            uid = int(fields.get("Uid", "-1").split()[0])
            if ppid == me or uid in uid_range:
                strays.append((int(name), ppid == me))
        return strays


def _describe_exit(status: int | None) -> str:
    if status is None:
        return "the worker closed its channel"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)", "SIGSEGV": " (crash, e.g. "
                "stack overflow)", "SIGKILL": ""}.get(name, "")
        return f"the worker was killed by {name}{hint}"
    return f"the worker exited with code {os.WEXITSTATUS(status)}"


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmSize not found in /proc/self/status")


def _outer_uid_is_root() -> bool:
    with open("/proc/self/uid_map") as f:
        first = f.read().split()
    return len(first) >= 2 and first[1] == "0"


def _runtime_dirs() -> list[str]:
    """What the preloaded interpreter needs: stdlib, numpy, and the directories of loaded libraries.

    Never the interpreter's site-packages as a whole (only numpy from it).
    """
    paths = sysconfig.get_paths()
    site = {os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])}
    dirs = {paths["stdlib"]}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        package = os.path.dirname(numpy.__file__)
        dirs.update({package, package + ".libs"})
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and ".so" in os.path.basename(path):
                dirs.add(os.path.dirname(path))
    return [d for d in dirs if os.path.realpath(d) not in site]


def _reseed_numpy() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "big"))


def main() -> None:
    """Entry point: read the config, choose and enter isolation, hand-shake, serve."""
    cmd_fd, reply_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    for fd in (cmd_fd, reply_fd, devnull):
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = SandboxConfig.from_dict(read_frame(cmd_fd, 1 << 20))
    except (EOFError, ProtocolError, TypeError, ValueError) as err:
        write_all(reply_fd, encode_frame({"ok": False, "error": f"bad sandbox config: {err}"}))
        sys.exit(2)
    plan = choose_isolation(config)
    if plan.error:
        write_all(reply_fd, encode_frame({"ok": False, "error": plan.error, "kind": "isolation"}))
        sys.exit(3)
    if os.geteuid() == 0 and not plan.user_namespace:
        plan.uid_base, plan.uid_lock = claim_uid_range()
    if plan.namespaces:
        isolation.enter_host_namespaces(plan.user_namespace)
        child = os.fork()
        if child:
            for fd in (cmd_fd, reply_fd):
                os.close(fd)
            while True:
                try:
                    _, status = os.waitpid(child, 0)
                    break
                except InterruptedError:
                    continue
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)
    host = Host(config, plan, cmd_fd, reply_fd, devnull)
    try:
        report = host.setup()
    except Exception as err:
        traceback.print_exc(file=sys.stderr)
        kind = "setup" if plan.namespaces else "fatal"
        write_all(reply_fd, encode_frame({"ok": False, "error": f"sandbox host setup failed: {err}", "kind": kind}))
        sys.exit(4)
    write_all(reply_fd, encode_frame({"ok": True, "isolation": report.to_dict()}))
    host.serve()


if __name__ == "__main__":
    main()
