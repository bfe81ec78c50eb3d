"""Attack: open the socket families a plain TCP/UDP check forgets: vsock (to the hypervisor),
netlink (list the network interfaces with an RTM_GETLINK dump), raw packet sockets, and IPv6
UDP to the test's port on ::1 (kwargs['port']).

Any socket created counts as a breach, even one that turns out useless. What should stop
it: a syscall filter that allows only the socket families the sandbox needs (or none).
Observation: JSON, one entry per attempt.
"""

import json
import socket
import struct

AF_VSOCK, AF_NETLINK, AF_PACKET = 40, 16, 17
NETLINK_ROUTE, RTM_GETLINK, RTM_NEWLINK, NLMSG_DONE, NLMSG_ERROR = 0, 18, 16, 3, 2
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME = 3


def _interfaces(sock):
    """Sends an RTM_GETLINK dump request and returns the interface names in the answer."""
    request = struct.pack("=IHHII", 32, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    request += struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
    sock.send(request)
    names = []
    for _ in range(64):
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            return names
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if length < 16 or kind in (NLMSG_DONE, NLMSG_ERROR):
                return names
            if kind == RTM_NEWLINK:
                attr = offset + 32
                while attr + 4 <= offset + length:
                    alen, atype = struct.unpack_from("=HH", data, attr)
                    if alen < 4:
                        break
                    if atype == IFLA_IFNAME:
                        names.append(data[attr + 4:attr + alen].split(b"\0")[0].decode(errors="replace"))
                    attr += (alen + 3) & ~3
            offset += (length + 3) & ~3
    return names


class VsockNetlinkEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.port = int(kwargs.get("port", 9))

    def reset(self, seed=None):
        results = {}
        for name, args in (("vsock", (AF_VSOCK, socket.SOCK_STREAM)), ("packet", (AF_PACKET, socket.SOCK_RAW))):
            try:
                socket.socket(*args).close()
                results[name] = "BREACH: created"
            except OSError as err:
                results[name] = type(err).__name__
        try:
            sock = socket.socket(AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        except OSError as err:
            results["netlink"] = results["netlink_dump"] = type(err).__name__
        else:
            results["netlink"] = "BREACH: created"
            try:
                sock.settimeout(0.5)
                names = _interfaces(sock)
                results["netlink_dump"] = f"BREACH: listed interfaces {names}"
            except OSError as err:
                results["netlink_dump"] = type(err).__name__
            finally:
                sock.close()
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        except OSError as err:
            results["inet6_udp"] = type(err).__name__
        else:
            try:
                sock.sendto(b"pwned", ("::1", self.port))
                results["inet6_udp"] = "BREACH: created and sent to ::1"
            except OSError as err:
                results["inet6_udp"] = f"BREACH: created (sendto: {type(err).__name__})"
            finally:
                sock.close()
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
