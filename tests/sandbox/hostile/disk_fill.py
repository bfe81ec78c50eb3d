"""Attack: fill the disk from the private directory (tmpfs size and file size limits)."""

import json
import signal


class DiskFillEnv:
    def __init__(self, max_turns=5, **kwargs):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def reset(self, seed=None):
        written, error = 0, None
        chunk = b"D" * (1 << 20)
        try:
            for i in range(1024):
                with open(f"fill{i}.bin", "wb") as f:
                    for _ in range(1024):
                        f.write(chunk)
                        f.flush()
                        written += len(chunk)
        except OSError as err:
            error = type(err).__name__ + ": " + (err.strerror or "")
        return json.dumps({"written_mb": written >> 20, "error": error}), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
