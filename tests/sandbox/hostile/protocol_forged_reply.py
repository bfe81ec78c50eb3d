"""Attack: forge a 'successful' step reply with an enormous reward, then reply again.

The forged values are still checked and clipped on the trusted side; the second, genuine
reply is an unsolicited message, so the episode dies at the next event.
"""

import json
import os


class ForgedReplyEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        forged = json.dumps({"ok": True, "value": {"__tuple__": ["forged", 1e9, True, False, {}]}}).encode()
        os.write(3, len(forged).to_bytes(4, "big") + forged)
        return "genuine", 0.0, False, False, {}
