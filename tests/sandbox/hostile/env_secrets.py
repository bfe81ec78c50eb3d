"""Attack: read secrets from environment variables."""

import json
import os


class EnvSecretsEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return json.dumps(dict(os.environ)), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
