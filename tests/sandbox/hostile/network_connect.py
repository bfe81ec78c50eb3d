"""Attack: reach a loopback listener the test runs (kwargs['port']) over TCP and UDP, and the outside world."""

import json
import socket


class NetworkEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.port = kwargs.get("port", 9)

    def reset(self, seed=None):
        results = {}
        for name, address in (("loopback", ("127.0.0.1", self.port)), ("outside", ("1.1.1.1", 53))):
            try:
                socket.create_connection(address, timeout=0.5).close()
                results[name] = "connected"
            except OSError as err:
                results[name] = type(err).__name__
        try:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.sendto(b"pwned", ("127.0.0.1", self.port))
            results["udp"] = "sent"
        except OSError as err:
            results["udp"] = type(err).__name__
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
