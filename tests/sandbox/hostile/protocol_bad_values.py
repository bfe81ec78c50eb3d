"""Attack: hand-written replies on the protocol channel (fd 3) that are valid frames but bad values.

kwargs['variant'] picks one: "bigint" (default) a step tuple whose reward is a 4000-digit
integer literal; "marker" a tuple marker that wraps a number, {"__tuple__": 5}; "utf8" raw
invalid UTF-8 bytes (ff fe) inside a JSON string; "okstr" {"ok": "yes"}.
What should stop it: the host checks every decoded value (exact types, bounded numbers, the
marker's shape, strict UTF-8) and answers a protocol error or a contract violation.
"""

import os

FRAMES = {
    "bigint": b'{"ok":true,"value":{"__tuple__":["big",1' + b"0" * 3999 + b',false,false,{}]}}',
    "marker": b'{"ok":true,"value":{"__tuple__":5}}',
    "utf8": b'{"ok":true,"value":{"__tuple__":["bad \xff\xfe bytes",0.0,false,false,{}]}}',
    "okstr": b'{"ok":"yes"}',
}


class BadValuesEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.payload = FRAMES[kwargs.get("variant", "bigint")]

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        view = memoryview(len(self.payload).to_bytes(4, "big") + self.payload)
        while view:
            view = view[os.write(3, view):]
        return "genuine", 0.0, False, False, {}
