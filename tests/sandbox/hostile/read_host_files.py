"""Attack: read the trainer's files: a secret file (kwargs['secret_path']), the repo, /etc, /proc, home."""

import json
import os


class ReadHostEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.targets = [kwargs.get("secret_path", "/tmp/secret"), kwargs.get("repo_file", "/work/main/README.md"),
                        "/etc/passwd", "/etc/hostname", "/proc/1/environ", "/proc/self/environ", "/root/.bashrc"]

    def reset(self, seed=None):
        results = {}
        for target in self.targets:
            try:
                with open(target) as f:
                    results[target] = f.read(200)
            except OSError as err:
                results[target] = type(err).__name__
        listing = {}
        for directory in ("/", "/tmp", "/home", "/root", "/work"):
            try:
                listing[directory] = sorted(os.listdir(directory))
            except OSError as err:
                listing[directory] = type(err).__name__
        return json.dumps({"files": results, "dirs": listing}), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
