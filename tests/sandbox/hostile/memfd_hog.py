"""Attack: take memory the address-space limit does not count: a 300 MB memfd and a 300 MB shared mapping.

Writing into a memfd (os.memfd_create) fills RAM without mapping anything, so RLIMIT_AS never
sees it; a MAP_SHARED anonymous mapping is shmem. What should stop them: the file-size
limit or the syscall filter for the memfd, RLIMIT_AS or a memory cgroup for the mapping.
Both are kept for the life of the episode. Observation: JSON, one entry per attempt.
"""

import json
import mmap
import os
import signal

SIZE_MB = 300


class MemfdHogEnv:
    def __init__(self, max_turns=5, **kwargs):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead
        self.fd = None
        self.shared = None

    def reset(self, seed=None):
        results = {}
        try:
            self.fd = os.memfd_create("x")
            results["memfd_create"] = "created"
        except (OSError, AttributeError) as err:
            results["memfd_create"] = type(err).__name__
        if self.fd is not None:
            chunk, written = b"M" * (1 << 20), 0
            try:
                for _ in range(SIZE_MB):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(self.fd, view):]
                    written += 1
                results["memfd_write"] = f"BREACH: wrote {written} MB to a memfd"
            except OSError as err:
                results["memfd_write"] = f"{type(err).__name__} after {written} MB"
        else:
            results["memfd_write"] = "no memfd"
        touched = 0
        try:
            self.shared = mmap.mmap(-1, SIZE_MB << 20, flags=mmap.MAP_SHARED)
            for offset in range(0, SIZE_MB << 20, 4096):
                self.shared[offset] = 1
                touched += 4096
            results["shared_mmap"] = f"BREACH: touched {touched >> 20} MB of a shared mapping"
        except (OSError, MemoryError, ValueError) as err:
            results["shared_mmap"] = f"{type(err).__name__} after {touched >> 20} MB"
        return json.dumps(results), {}

    def step(self, action):
        return "still holding", 0.0, False, False, {}
