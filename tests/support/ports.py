"""Ports for the daemons a test starts, as tests/integration/process.cpp's free_port picks them.

Every outgoing connection's local port comes from the kernel's ephemeral range, so a port taken
from it (a bind to port 0) and freed again can be a connection's by the time a daemon listens on
it: under load it was (real_prometheus.py: "[control].listen: cannot listen on 127.0.0.1:P:
Address already in use", once Prometheus's scrapes and the first daemon's connections were out).
So ports come from below that range, each process walking its own block first, each checked free
by binding it and never handed out twice.
"""
import os
import socket

FIRST_PORT = 10000
BLOCK = 64


def first_ephemeral_port():
    """The lowest port the kernel hands to outgoing connections (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


class PortPicker:
    def __init__(self):
        self.last = first_ephemeral_port()
        if self.last - FIRST_PORT < BLOCK:
            raise RuntimeError("no ports below the ephemeral range")
        blocks = (self.last - FIRST_PORT) // BLOCK
        self.next = FIRST_PORT + (os.getpid() % blocks) * BLOCK
        self.given = set()

    def free_port(self, host="127.0.0.1"):
        """A port on `host` that nothing listens on now and that this picker has not given out."""
        for _ in range(self.last - FIRST_PORT):
            port = self.next
            self.next = port + 1 if port + 1 < self.last else FIRST_PORT
            if port not in self.given and bindable(host, port):
                self.given.add(port)
                return port
        raise RuntimeError(f"no free port on {host} below the ephemeral range")
