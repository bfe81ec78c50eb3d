"""Attack: snoop on other processes through /proc: the command lines and environments of the pids
in kwargs['pids'], the list of all processes, the host's open files (kwargs['host_pid'], its
fd directory and /proc/<host_pid>/fd/0..9 opened again), and this process's own memory map.

Everything read or listed is a breach (even /proc/self/maps, which only tells about this
process: the test wants /proc hidden altogether). What should stop it: a private root
without /proc (or a /proc of the worker's own PID namespace, mounted hidepid).
Observation: JSON, one entry per attempt.
"""

import json
import os


def _read(path):
    with open(path, "rb") as f:
        return f.read(4096)


class ProcSnoopEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.pids = [int(p) for p in kwargs.get("pids", [])]
        self.host_pid = int(kwargs.get("host_pid", 1))

    def reset(self, seed=None):
        results = {}
        for pid in self.pids:
            for part in ("cmdline", "environ"):
                path = f"/proc/{pid}/{part}"
                try:
                    data = _read(path)
                    results[path] = f"BREACH: read {len(data)} bytes"
                except OSError as err:
                    results[path] = type(err).__name__
        try:
            results["/proc"] = f"BREACH: listed {len(os.listdir('/proc'))} entries"
        except OSError as err:
            results["/proc"] = type(err).__name__
        fd_dir = f"/proc/{self.host_pid}/fd"
        try:
            results[fd_dir] = f"BREACH: listed {sorted(os.listdir(fd_dir))[:20]}"
        except OSError as err:
            results[fd_dir] = type(err).__name__
        for n in range(10):
            path = f"{fd_dir}/{n}"
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
                os.close(fd)
                results[path] = "BREACH: opened"
            except OSError as err:
                results[path] = type(err).__name__
        try:
            data = _read("/proc/self/maps")
            results["/proc/self/maps"] = f"BREACH: self maps readable ({len(data)} bytes)"
        except OSError as err:
            results["/proc/self/maps"] = type(err).__name__
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
