"""Attack: fill the scratch directory with many small files (up to 100,000 of 64 KB each), each
well under the file-size limit, until the first OSError.

What should stop it: the scratch filesystem's own size and inode limits (a bounded tmpfs),
or the host killing the episode at its deadline and removing what it wrote.
Observation: JSON {"files", "written_mb", "stopped_by"}.
"""

import json

MAX_FILES = 100_000
FILE_BYTES = 64 << 10


class DiskFillManyEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        block = b"F" * FILE_BYTES
        files, stopped_by = 0, None
        try:
            for i in range(MAX_FILES):
                with open(f"many{i:06d}.bin", "wb") as f:
                    f.write(block)
                files += 1
        except OSError as err:
            stopped_by = type(err).__name__
        report = {"files": files, "written_mb": round(files * FILE_BYTES / (1 << 20), 2), "stopped_by": stopped_by}
        return json.dumps(report), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
