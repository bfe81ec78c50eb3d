"""The sandbox host's event loop: a single-threaded supervisor that drives, checks, budgets and kills workers.

``host_start.py`` builds what the loop needs before any config or request exists (isolation,
procfs, the zygote, the pool cgroup: a ``HostBase``) and hands it to ``Host``, which then
serves batched requests (start/step/solution/close/output/stats) from the client's frames
(``protocol.py``):

* a worker per episode, with a socketpair for the protocol (fd 3) and a pipe for its
  stdout/stderr (captured, capped; flooding kills it); the host sends each worker its own
  program and seed, nothing else;
* at most ``num_workers`` calls in flight; every call has a deadline (the call's own, and
  what is left of the episode's ``episode_time_s``), past which the worker (its whole PID
  namespace, or process group without namespaces) is SIGKILLed; between calls every
  worker is stopped (SIGSTOP), so nothing it armed can run while nobody waits for it;
* the pool budget: a cgroup where the machine has one, else the host sums its workers'
  memory (resident growth) while calls run and kills the largest busy worker past the
  budget; without a private tmpfs it also bounds each scratch directory's size the same way;
* every worker message is checked here (``validate.py``) before anything goes back to the
  client, and any failure, including an error of the host's own code while handling a
  message, costs only the episode that caused it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback

from spade_jax.sandbox import isolation, usage, zygote
from spade_jax.sandbox.cgroups import PoolCgroup
from spade_jax.sandbox.protocol import FrameBuffer, ProtocolError, decode_payload, encode_frame, read_frame, write_all
from spade_jax.sandbox.records import SandboxConfig, SolutionResult, StepResult
from spade_jax.sandbox.validate import (ContractViolation, EnvFailure, check_load, check_message, check_reset,
                                        check_solution, check_step, clip_reward, unwrap)
from spade_jax.text import clean_text

_OUTPUT_KEEP_BYTES = 16384
_EXIT_GRACE_S = 0.05
_REAP_TIMEOUT_S = 10.0
_SPAWN_TIMEOUT_S = 30.0
_BUDGET_CHECK_S = 0.05
_MAX_TURN_LIMIT = 1000
_DEFAULT_TURN_LIMIT = 100
_SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclasses.dataclass
class HostBase:
    """What start-up built before the config was read: isolation, procfs, the zygote, the cgroup."""

    plan: isolation.Plan
    proc_fd: int | None
    pidns_fd: int | None
    pool_dir: str | None
    read_paths: list
    sys_path: list
    zygote_pid: int
    zygote_sock: socket.socket
    cgroup: PoolCgroup | None
    cgroup_note: str
    notes: list
    vm_bytes: int
    outer_root: bool


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
    uid: int | None = None
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
    spent_s: float = 0.0
    memory: int = 0
    stopped: bool = False


@dataclasses.dataclass(eq=False)
class _Call:
    ep: _Episode
    kind: str
    index: int
    action: str | None = None
    phase: str = ""
    deadline: float = 0.0
    t0: float = 0.0
    phase_t0: float = 0.0
    limit: str = ""


class HostFailure(Exception):
    """The host cannot go on (its zygote died or hung); it exits and the pool restarts it."""


class Host:
    """The supervisor's state and event loop (one instance per host process)."""

    def __init__(self, config: SandboxConfig, base: HostBase, cmd_fd: int, reply_fd: int):
        self.cfg = config
        self.base = base
        self.plan = base.plan
        self.cmd_fd, self.reply_fd = cmd_fd, reply_fd
        self.episodes: dict[int, _Episode] = {}
        self.by_pid: dict[int, _Episode] = {}
        self.exits: dict[int, int] = {}
        self.inflight: set[_Call] = set()
        self.results: list = []
        self.sel = selectors.DefaultSelector()
        self.sel.register(cmd_fd, selectors.EVENT_READ, None)
        self.sel.register(base.zygote_sock, selectors.EVENT_READ, "zygote")
        self.free_slots = list(range(config.max_live_episodes - 1, -1, -1))
        self.spawned: dict[int, dict] = {}
        self.oom_kills_attributed = base.cgroup.oom_kills() if base.cgroup else 0
        self.next_budget_check = 0.0
        self.zygote_rss = (usage.rss_bytes(base.zygote_pid, base.proc_fd) or 0) if base.proc_fd is not None else 0
        rlimits = isolation.config_rlimits(config, base.vm_bytes)
        self.report = isolation.build_report(
            base.plan, config, rlimits, notes=base.notes, outer_root=base.outer_root, cgroup=base.cgroup,
            cgroup_note=base.cgroup_note, has_procfs=base.proc_fd is not None)
        self.jail = isolation.build_jail(base.plan, config, self.report, rlimits, base.read_paths, base.sys_path)

    # --- request loop ------------------------------------------------------------------------

    def serve(self) -> None:
        """Answers client requests until shutdown, until the client goes away, or a fatal failure."""
        zygote.send(self.base.zygote_sock, {"op": "jail", "jail": self.jail})
        try:
            while True:
                if not self._poll(None):
                    continue
                try:
                    request = read_frame(self.cmd_fd, 1 << 31)
                except (EOFError, OSError, ProtocolError):
                    break
                try:
                    reply = self._handle(request)
                except HostFailure:
                    raise
                except Exception as err:  # a malformed request or a host bug: report it, keep serving
                    traceback.print_exc(file=sys.stderr)
                    reply = {"ok": False, "error": f"sandbox host error: {type(err).__name__}: {err}"}
                try:
                    write_all(self.reply_fd, encode_frame(reply))
                except OSError:
                    break
                if request.get("op") == "shutdown":
                    break
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self._kill_many(list(self.episodes.values()))
        if self.base.cgroup is not None:
            self.base.cgroup.close()
        if self.base.pool_dir:
            shutil.rmtree(self.base.pool_dir, ignore_errors=True)

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
                outputs.append(clean_text(ep.output.decode("utf-8", "replace")) if ep else "")
                if ep:
                    ep.output.clear()
            return {"ok": True, "outputs": outputs}
        if op == "stats":
            return {"ok": True, "live": len(self.by_pid), "records": len(self.episodes),
                    "registered_fds": len(self.sel.get_map()) - 2,
                    "memory_bytes": self._pool_memory()}
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
        call.t0 = time.monotonic()
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
            ep.state = "busy"
            ep.call = call
            self.inflight.add(call)
            self._begin_phase(call, "load")
            self._send(ep, encode_frame({"op": "load", "program": ep.program, "seed": ep.seed,
                                         "max_turns": ep.max_turns, "env_kwargs": ep.env_kwargs}))
            return
        refusal = self._refusal(call)
        if refusal:
            over = ep.state == "dead" or ep.ended
            self._finish(call, self._error(call, refusal, "limit", episode_over=over))
            return
        ep.call = call
        self.inflight.add(call)
        self._begin_phase(call, call.kind)
        message = {"op": "step", "action": call.action} if call.kind == "step" else {"op": "solution"}
        self._send(ep, encode_frame(message))
        self._resume(ep)

    def _begin_phase(self, call: _Call, phase: str) -> None:
        """Starts the clock of one worker call: its own deadline or what is left of the episode's time."""
        now = time.monotonic()
        own = self.cfg.load_timeout_s if phase == "load" else self.cfg.call_timeout_s
        left = self.cfg.episode_time_s - call.ep.spent_s
        call.phase, call.phase_t0 = phase, now
        if left < own:
            call.deadline, call.limit = now + max(0.0, left), "episode"
        else:
            call.deadline, call.limit = now + own, "call"

    def _end_phase(self, call: _Call) -> None:
        call.ep.spent_s += time.monotonic() - call.phase_t0

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
        if self.base.cgroup is None or not self.plan.namespaces:
            deadline = min(deadline, self.next_budget_check)
        return max(0.0, min(1.0, deadline - time.monotonic()))

    # --- workers -----------------------------------------------------------------------------

    def _spawn(self, ep: _Episode) -> None:
        """Has the zygote fork the episode's worker; the child jails itself and waits for ``load``.

        Raises OSError (with nothing leaked) when the fds, the directory or the fork fail.
        """
        fds: list[int] = []
        slot = self.free_slots.pop()
        uid = None if self.plan.uid_base is None else self.plan.uid_base + slot
        try:
            host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            fds += [host_end.detach(), child_end.detach()]
            fds += os.pipe()
            scratch = isolation.SCRATCH if self.plan.namespaces else self._make_scratch_dir(ep, uid)
            zygote.send(self.base.zygote_sock, {"op": "spawn", "slot": slot, "uid": uid, "scratch": scratch},
                        (fds[1], fds[3]))
            pid = self._await_spawn(slot)
        except OSError:
            for fd in fds:
                os.close(fd)
            self.free_slots.append(slot)
            self._remove_scratch(ep)
            raise
        host_fd, child_fd, out_r, out_w = fds
        os.close(child_fd)
        os.close(out_w)
        os.set_blocking(host_fd, False)
        os.set_blocking(out_r, False)
        ep.pid, ep.sock, ep.out_fd, ep.slot, ep.uid = pid, host_fd, out_r, slot, uid
        ep.frames = FrameBuffer(self.cfg.max_message_bytes)
        self.by_pid[pid] = ep
        self.sel.register(host_fd, selectors.EVENT_READ, (ep, "sock"))
        self.sel.register(out_r, selectors.EVENT_READ, (ep, "out"))

    def _await_spawn(self, slot: int) -> int:
        deadline = time.monotonic() + _SPAWN_TIMEOUT_S
        while slot not in self.spawned:
            if time.monotonic() > deadline:
                raise HostFailure("the zygote did not answer a spawn request")
            self._pump_zygote(deadline - time.monotonic())
        reply = self.spawned.pop(slot)
        if "error" in reply:
            raise OSError(f"the zygote could not fork: {reply['error']}")
        return int(reply["pid"])

    def _pump_zygote(self, timeout: float) -> None:
        """Reads the zygote's messages available within ``timeout`` (exits and spawn replies)."""
        sock = self.base.zygote_sock
        sock.settimeout(max(0.0, timeout))
        try:
            while True:
                message, fds = zygote.receive(sock)
                for fd in fds:
                    os.close(fd)
                if message is None:
                    raise HostFailure("the zygote exited")
                if message["op"] == "exited":
                    if message["pid"] in self.by_pid:
                        self.exits[message["pid"]] = message["status"]
                else:
                    self.spawned[message["slot"]] = message
                sock.settimeout(0.0)
        except (BlockingIOError, socket.timeout):
            pass
        finally:
            sock.settimeout(None)

    def _make_scratch_dir(self, ep: _Episode, uid: int | None) -> str:
        path = os.path.join(self.base.pool_dir, f"episode-{ep.eid}")
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, uid)
        ep.scratch_dir = path
        return path

    def _remove_scratch(self, ep: _Episode) -> None:
        if ep.scratch_dir:
            shutil.rmtree(ep.scratch_dir, ignore_errors=True)
            ep.scratch_dir = None

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

    def _stop(self, ep: _Episode) -> None:
        """Freezes an idle worker: no timer, handler or loop of the program runs between calls."""
        if ep.pid and not ep.stopped:
            self._signal(ep.pid, signal.SIGSTOP)
            ep.stopped = True

    def _resume(self, ep: _Episode) -> None:
        """Lets a stopped worker run again (after its request is already in its channel)."""
        if ep.pid and ep.stopped:
            self._signal(ep.pid, signal.SIGCONT)
            ep.stopped = False

    def _poll(self, timeout: float | None) -> bool:
        """Handles events, deadlines and the budget; True when the client has sent a request."""
        client = False
        for key, mask in self.sel.select(timeout):
            if key.data is None:
                client = True
                continue
            if key.data == "zygote":
                self._pump_zygote(0.0)
                continue
            ep, kind = key.data
            if ep.pid == 0:
                continue
            try:
                if kind == "out":
                    self._read_output(ep)
                else:
                    if mask & selectors.EVENT_WRITE:
                        self._flush_writes(ep)
                    if mask & selectors.EVENT_READ and ep.pid:
                        self._read_channel(ep)
            except HostFailure:
                raise
            except Exception as err:  # never let one episode's data take the host down
                traceback.print_exc(file=sys.stderr)
                if ep.pid:
                    self._fail(ep, f"sandbox host error while handling this episode: {type(err).__name__}: "
                                   f"{clean_text(str(err), 300)}")
        now = time.monotonic()
        for call in [c for c in self.inflight if c.deadline <= now]:
            if call in self.inflight:
                self._fail(call.ep, self._timeout_message(call), timed_out=True)
        if self.inflight and now >= self.next_budget_check:
            self.next_budget_check = now + _BUDGET_CHECK_S
            self._check_budget()
        return client

    def _timeout_message(self, call: _Call) -> str:
        if call.limit == "episode":
            return (f"timeout: the episode's time budget of {self.cfg.episode_time_s:g} s "
                    f"(episode_time_s) is spent ({call.phase})")
        limit = self.cfg.load_timeout_s if call.phase == "load" else self.cfg.call_timeout_s
        return f"timeout: {call.phase} took longer than {limit:g} s"

    def _check_budget(self) -> None:
        """The supervisor's share of the budget: pool memory (no cgroup) and scratch size (no tmpfs)."""
        busy = [call.ep for call in self.inflight if call.ep.pid]
        if not self.plan.namespaces:
            for ep in busy:
                reason = self._scratch_problem(ep)
                if reason:
                    self._fail(ep, reason)
        if self.base.cgroup is not None or self.base.proc_fd is None:
            return
        for ep in busy:
            ep.memory = self._memory_of(ep)
        busy = [ep for ep in busy if ep.pid]
        if busy:
            victim = max(busy, key=lambda ep: ep.memory)
            over = self._over_budget(victim)
            if over:
                self._fail(victim, over)

    def _over_budget(self, ep: _Episode) -> str | None:
        """Why ``ep`` (the largest busy worker, or one that just answered) must go, or None."""
        total = self._pool_memory()
        if total <= self.cfg.pool_memory_mb << 20:
            return None
        return (f"memory budget exceeded: the sandbox's episodes together used {total >> 20} MB, more than "
                f"pool_memory_mb={self.cfg.pool_memory_mb} (this episode held {ep.memory >> 20} MB)")

    def _memory_of(self, ep: _Episode) -> int:
        """A worker's own memory: what its resident set grew beyond the zygote's it was forked
        from (statm: one cheap read, allowed on undumpable workers, fit for every answer)."""
        return max(0, (usage.rss_bytes(ep.pid, self.base.proc_fd) or 0) - self.zygote_rss)

    def _pool_memory(self) -> int:
        if self.base.cgroup is not None:
            return self.base.cgroup.memory_bytes()
        return sum(ep.memory for ep in self.by_pid.values())

    def _scratch_problem(self, ep: _Episode) -> str | None:
        if not ep.scratch_dir:
            return None
        used, entries, truncated = usage.tree_usage(ep.scratch_dir, isolation.SCRATCH_INODES)
        if used > self.cfg.disk_mb << 20 or truncated:
            return (f"scratch directory over its budget: {used >> 20} MB in {entries}{'+' if truncated else ''} "
                    f"entries (disk_mb={self.cfg.disk_mb}, at most {isolation.SCRATCH_INODES} entries)")
        return None

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
            reply = check_message(decode_payload(payload))
            if phase == "load":
                ep.meta = check_load(reply)
                if ep.turn_limit is None:
                    ep.turn_limit = min(ep.meta["max_turns"] or _DEFAULT_TURN_LIMIT, _MAX_TURN_LIMIT)
                self._end_phase(call)
                self._begin_phase(call, "reset")
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
                result = vars(SolutionResult(ep.eid, solution=check_solution(value, limit)))
        except ProtocolError as err:
            self._fail(ep, f"protocol error: {err}")
        except EnvFailure as err:
            self._fail(ep, f"loading the program failed: {err}" if phase == "load" else f"{phase}() raised {err}")
        except ContractViolation as err:
            self._fail(ep, f"contract violation: {err}")
        else:
            self._end_phase(call)
            scratch = None if self.plan.namespaces else self._scratch_problem(ep)
            if scratch:
                self._fail(ep, scratch)
                return
            if self.base.cgroup is None and self.base.proc_fd is not None:
                ep.memory = self._memory_of(ep)
                over = self._over_budget(ep)
                if over:
                    self._fail(ep, over)
                    return
            self._stop(ep)
            ep.state, ep.call = "idle", None
            self._finish(call, result)

    def _step_result(self, call: _Call, **fields) -> dict:
        # The fields are already plain values (validated and copied), so no deep copy (asdict) per answer.
        return vars(StepResult(call.ep.eid, turn=call.ep.turn, elapsed_s=time.monotonic() - call.t0, **fields))

    def _error(self, call: _Call, message: str, failed_call: str, timed_out: bool = False,
               episode_over: bool = True) -> dict:
        ep = call.ep
        if call.kind == "solution":
            return vars(SolutionResult(ep.eid, error=message, timed_out=timed_out))
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
        call = ep.call
        if call is not None:
            self._end_phase(call)
        status = self._kill(ep, wait_first=message is None)
        if message is None:
            message = self._describe_exit(status)
        ep.dead_reason = message
        if call is not None:
            self._finish(call, self._error(call, message, call.phase, timed_out=timed_out))

    def _describe_exit(self, status: int | None) -> str:
        text = _describe_exit(status)
        if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL \
                and self.base.cgroup is not None:
            if self.base.cgroup.oom_kills() > self.oom_kills_attributed:  # one OOM kill per unexplained SIGKILL
                self.oom_kills_attributed += 1
                text += (f" (out of memory: the sandbox's budget of pool_memory_mb={self.cfg.pool_memory_mb} "
                         "for all episodes together is spent)")
        return text

    def _kill(self, ep: _Episode, wait_first: bool = False) -> int | None:
        """SIGKILLs the worker (its PID namespace or process group), waits for the zygote to reap
        it, frees fds/slot/dir.

        ``wait_first``: the worker's channel hit EOF, so give it a moment to exit by itself
        and report its own exit status rather than our SIGKILL.
        """
        status = None
        if ep.pid:
            if wait_first:
                status = self._await_exit(ep.pid, _EXIT_GRACE_S)
            if status is None:
                self._signal(ep.pid, signal.SIGKILL)
                status = self._await_exit(ep.pid, _REAP_TIMEOUT_S)
        self._release(ep)
        return status

    def _kill_many(self, eps: list[_Episode]) -> None:
        """Like ``_kill`` for many episodes: signal all first so their teardowns overlap."""
        for ep in eps:
            if ep.pid:
                self._signal(ep.pid, signal.SIGKILL)
        uids = set()
        for ep in eps:
            if ep.pid:
                self._await_exit(ep.pid, _REAP_TIMEOUT_S)
                if ep.uid is not None:
                    uids.add(ep.uid)
            self._release(ep, sweep=False)
        if eps and not self.plan.namespaces:
            self._sweep(uids)

    def _release(self, ep: _Episode, sweep: bool = True) -> None:
        if ep.pid:
            del self.by_pid[ep.pid]
            self.exits.pop(ep.pid, None)
            for fd in (ep.sock, ep.out_fd):
                if fd >= 0:
                    self.sel.unregister(fd)
                    os.close(fd)
            ep.pid, ep.sock, ep.out_fd = 0, -1, -1
            self.free_slots.append(ep.slot)
            if sweep and not self.plan.namespaces:
                self._sweep({ep.uid} if ep.uid is not None else set())
        self._remove_scratch(ep)
        ep.state = "dead"
        if ep.dead_reason is None:
            ep.dead_reason = "closed"

    def _signal(self, pid: int, sig: int) -> None:
        if not self.plan.namespaces:
            try:
                os.killpg(pid, sig)
            except OSError:
                pass
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    def _await_exit(self, pid: int, timeout: float) -> int | None:
        """The worker's exit status once the zygote reports it, or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._pump_zygote(left)
        return self.exits.pop(pid)

    def _sweep(self, uids: set[int]) -> None:
        """Without namespaces: kills processes that escaped a worker's process group, and removes
        what per-episode uids left in shared temporary directories."""
        if self.plan.namespaces:
            return
        for _ in range(50):
            strays = self._find_strays()
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self._pump_zygote(0.01)
        if uids:
            usage.sweep_owned(_SHARED_TMP_DIRS, uids)

    def _find_strays(self) -> list[int]:
        """Processes that are neither a live worker nor the zygote but are the zygote's children
        (orphans it adopted as subreaper) or run under one of our episode uids."""
        proc = self.base.proc_fd
        if proc is None:
            return []
        live = set(self.by_pid) | {self.base.zygote_pid, os.getpid()}
        base_uid = self.plan.uid_base
        uid_range = range(base_uid, base_uid + isolation.UID_SPAN) if base_uid is not None else range(0)
        strays = []
        for name in os.listdir(proc):
            if not name.isdigit() or int(name) in live:
                continue
            try:
                raw = usage.read_proc(int(name), "status", proc)
            except OSError:
                continue
            if raw is None:
                continue
            text = raw.decode(errors="replace")
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            ppid = int(fields.get("PPid", "0").strip() or 0)
            uid = int(fields.get("Uid", "-1").split()[0])
            if ppid == self.base.zygote_pid or uid in uid_range:
                strays.append(int(name))
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
                "stack overflow)", "SIGSYS": " (a forbidden system call)", "SIGKILL": ""}.get(name, "")
        return f"the worker was killed by {name}{hint}"
    return f"the worker exited with code {os.WEXITSTATUS(status)}"
