"""Attack: leave things behind that outlive the episode: files in /tmp, /var/tmp and /dev/shm
(spade-litter-<kwargs tag>), a System V shared memory segment (shmget, never removed) and a
POSIX named semaphore (sem_open, never unlinked).

Each one created is reported as a breach and left in place; the test checks that nothing of
it remains once the episode is closed. What should stop it: a private root whose writable
places are the episode's own scratch (removed with it), and an IPC namespace per episode.
Observation: JSON, one entry per attempt.
"""

import ctypes
import errno
import json
import os

IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def _errno_name():
    code = ctypes.get_errno()
    return errno.errorcode.get(code, f"errno {code}")


class LitterEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.name = f"spade-litter-{kwargs.get('tag', 'x')}"

    def reset(self, seed=None):
        results = {}
        for directory in ("/tmp", "/var/tmp", "/dev/shm"):
            path = os.path.join(directory, self.name)
            try:
                with open(path, "wb") as f:
                    f.write(b"x")
                results[path] = "BREACH: created"
            except OSError as err:
                results[path] = type(err).__name__
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError as err:
            results["shmget"] = results["sem_open"] = f"no libc: {type(err).__name__}"
            return json.dumps(results), {}
        try:
            libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
            libc.shmget.restype = ctypes.c_int
            shmid = libc.shmget(IPC_PRIVATE, 4096, 0o1600 | IPC_CREAT)
            if shmid >= 0:
                results["shmget"] = f"BREACH: created segment {shmid}"
            else:
                results["shmget"] = _errno_name()
        except AttributeError as err:
            results["shmget"] = type(err).__name__
        try:
            libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
            libc.sem_open.restype = ctypes.c_void_p
            sem = libc.sem_open(("/" + self.name).encode(), os.O_CREAT, 0o600, 1)
            if sem:
                results["sem_open"] = f"BREACH: created semaphore /{self.name}"
            else:
                results["sem_open"] = _errno_name()
        except AttributeError as err:
            results["sem_open"] = type(err).__name__
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
