"""The zygote: the clean template process every sandbox worker is forked from.

The host forks it right after preloading the interpreter (stdlib modules, numpy, the
worker code) and building its isolation, and before it reads its config or any request.
So the zygote's memory, and with it every worker's, holds no ``SandboxConfig``, no start
request, no other episode's program or seed: a program that walks frames, the garbage
collector or raw memory finds only the code every worker shares.

It talks to the host over one SOCK_SEQPACKET socket, a JSON message each:

* host -> zygote ``{"op": "jail", "jail": {...}}`` once: how workers confine themselves
  (``isolation.jail_worker``) and what a worker needs to run (``isolation.build_jail``);
* host -> zygote ``{"op": "spawn", "slot": n, "uid": u|null, "scratch": path}`` with two
  file descriptors attached (the worker's end of its protocol socketpair and the write
  end of its output pipe); the zygote forks, answers ``{"op": "spawned", "slot": n,
  "pid": p}`` (or ``"error"``), and the child jails itself and waits for its ``load``
  request on fd 3, which only the host sends;
* zygote -> host ``{"op": "exited", "pid": p, "status": s}`` for every child it reaps
  (it is their parent, and without PID namespaces also the subreaper of their orphans).

It exits when the host closes the socket (killing what it forked first). Never runs
environment code itself. Standard library only (+ the preloaded modules).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import sys

from spade_jax.sandbox import isolation, worker
from spade_jax.sandbox.protocol import encode_frame, write_all

MAX_MESSAGE = 1 << 16


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and its fds; (None, []) when the peer closed the socket."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


class Zygote:
    """The zygote's state: its socket to the host, the jail description and its children."""

    def __init__(self, control: socket.socket, proc_fd: int | None, pidns_fd: int | None):
        self.control = control
        self.proc_fd = proc_fd
        self.pidns_fd = pidns_fd
        self.jail: dict | None = None
        self.children: set[int] = set()

    def run(self) -> None:
        """Serves the host until it goes away; never returns."""
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(self.control, selectors.EVENT_READ, "control")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        try:
            while True:
                for key, _ in sel.select():
                    if key.data == "wake":
                        while True:
                            try:
                                if not os.read(wake_r, 4096):
                                    break
                            except BlockingIOError:
                                break
                        self._reap()
                    else:
                        message, fds = receive(self.control)
                        if message is None:
                            return
                        self._handle(message, fds)
        finally:
            for pid in self.children:
                _kill_quietly(pid)
            os._exit(0)

    def _handle(self, message: dict, fds: list[int]) -> None:
        if message["op"] == "jail":
            self.jail = message["jail"]
            return
        slot = message["slot"]
        try:
            if self.jail is None or len(fds) != 2:
                raise OSError("spawn before the jail was set, or without its two fds")
            pid = self._fork(message["uid"], message["scratch"], *fds)
        except OSError as err:
            send(self.control, {"op": "spawned", "slot": slot, "error": str(err)})
        else:
            self.children.add(pid)
            send(self.control, {"op": "spawned", "slot": slot, "pid": pid})
        finally:
            for fd in fds:
                os.close(fd)

    def _fork(self, uid: int | None, scratch: str, channel_fd: int, out_fd: int) -> int:
        """Forks one worker (init of a new PID namespace when namespaces are on)."""
        new_pid_ns = bool(self.jail["namespaces"])
        if new_pid_ns:
            isolation.unshare(isolation.CLONE_NEWPID)
        try:
            pid = os.fork()
        except OSError:
            if new_pid_ns:
                isolation.setns(self.pidns_fd, isolation.CLONE_NEWPID)
            raise
        if pid == 0:
            self._become_worker(uid, scratch, channel_fd, out_fd)
        if new_pid_ns:
            isolation.setns(self.pidns_fd, isolation.CLONE_NEWPID)
        return pid

    def _become_worker(self, uid: int | None, scratch: str, channel_fd: int, out_fd: int) -> None:
        """Child side of the fork: forget the zygote's state, wire fds, jail, serve. Never returns.

        fds afterwards: 0 /dev/null, 1 and 2 the output pipe, 3 the protocol channel,
        nothing else (the procfs fd, used once for the OOM score, is closed before the jail ends).
        """
        jail = self.jail
        self.children.clear()
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (channel_fd, out_fd)]
            proc_fd = None if self.proc_fd is None else fcntl.fcntl(self.proc_fd, fcntl.F_DUPFD, 64)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(high[1], 1)
            os.dup2(high[1], 2)
            os.dup2(high[0], worker.CHANNEL_FD)
            keep = worker.CHANNEL_FD + 1
            if proc_fd is not None:
                os.dup2(proc_fd, keep)
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            os.closerange(keep + (1 if proc_fd is not None else 0), limit)
            isolation.jail_worker(jail, scratch, uid, keep if proc_fd is not None else None)
            if proc_fd is not None:
                os.close(keep)
            os.environ.clear()
            os.environ.update({"HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", "PATH": ""})
            sys.path[:] = jail["sys_path"]
            sys.argv[:] = ["env"]
            sys.orig_argv[:] = ["env"]
            _reseed_numpy()
            worker.install_virtual_clock()
            worker.serve(jail["restrict_imports"], jail["max_message_bytes"])
        except BaseException as err:
            try:
                write_all(worker.CHANNEL_FD, encode_frame({"ok": False, "error": f"sandbox setup failed: {err}"}))
            except BaseException:
                pass
        finally:
            os._exit(0)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            send(self.control, {"op": "exited", "pid": pid, "status": status})


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _reseed_numpy() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "big"))
