"""Attack: two episodes talk to each other over unix sockets.

kwargs['role'] is "listen" or "connect", kwargs['name'] names the rendezvous. The listener
binds an abstract unix socket "\\0<name>" and a filesystem one, <dir>/<name>.sock (kwargs
'dir', default "."), in reset and tries to accept on both (0.5 s timeout) in step; the
connector tries to connect to both in reset. Any accepted or established connection is a
breach. What should stop it: a network namespace (and so an abstract socket namespace) per
episode, a private filesystem, or a syscall filter that refuses unix sockets.
Observation: JSON, one entry per attempt.
"""

import json
import os
import socket


class CrossEpisodeSocketEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.role = kwargs.get("role", "listen")
        name = str(kwargs.get("name", "spade-rendezvous"))
        self.addresses = {"abstract": "\0" + name,
                          "path": os.path.join(str(kwargs.get("dir", ".")), name + ".sock")}
        self.listeners = {}

    def reset(self, seed=None):
        results = {}
        for kind, address in self.addresses.items():
            sock = None
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(0.5)
                if self.role == "listen":
                    sock.bind(address)
                    sock.listen(4)
                    self.listeners[kind] = sock
                    results[f"{kind}_bind"] = "bound (accept comes in step)"
                    sock = None
                else:
                    sock.connect(address)
                    results[f"{kind}_connect"] = f"BREACH: connected to the {kind} socket"
            except OSError as err:
                results[f"{kind}_{'bind' if self.role == 'listen' else 'connect'}"] = type(err).__name__
            finally:
                if sock is not None:
                    sock.close()
        return json.dumps(results), {}

    def step(self, action):
        if self.role != "listen":
            return "done", 0.0, True, False, {}
        results = {}
        for kind in self.addresses:
            sock = self.listeners.get(kind)
            if sock is None:
                results[f"{kind}_accept"] = "not bound"
                continue
            try:
                conn, _ = sock.accept()
                conn.close()
                results[f"{kind}_accept"] = f"BREACH: accepted a connection on the {kind} socket"
            except OSError as err:  # socket.timeout is an OSError
                results[f"{kind}_accept"] = type(err).__name__
        return json.dumps(results), 0.0, True, False, {}
