"""Attack: hold a large but individually allowed amount of memory for the whole episode.

Each episode stays under its own address-space limit (kwargs['mb'], default 150 MB, every
page touched), but many live episodes at once add up. What should stop it: an aggregate
bound on the workers' memory (a cgroup for all of them, or a cap on live episodes times the
per-episode limit that fits the machine), killing or refusing episodes rather than the host.
"""


class AggregateMemoryEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.mb = int(kwargs.get("mb", 150))
        self.block = None

    def reset(self, seed=None):
        size = self.mb << 20
        block = bytearray(size)
        block[::4096] = b"\x01" * len(range(0, size, 4096))
        self.block = block
        return f"holding {self.mb} MB", {}

    def step(self, action):
        return "still holding", 0.0, False, False, {}
