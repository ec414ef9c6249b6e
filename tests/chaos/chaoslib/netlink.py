"""The slow link: a network namespace joined to the root namespace by a veth pair, each end shaped
on egress by tc tbf (as bench/exchange_wan shapes its link). One node runs inside; every node
listens and announces on the veth addresses, so what the others exchange with it crosses the shaper.

    root namespace: veth ROOT_IP/24 (the root-side nodes listen here)  <- tbf ->
    namespace NS:   veth NS_IP/24   (the slow node listens here)       <- tbf ->

With `host_ns` the link joins that namespace instead (the NAT topology's internet, chaos
--natted), which routes between it and the rest: the slow namespace's default route leads there.
"""

import ipaddress
import os
import subprocess


def run(*cmd):
    p = subprocess.run(list(cmd), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def taken_networks():
    nets = []
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    out = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        head = line.split()[0] if line.split() else ""
        try:
            if head != "default":
                nets.append(ipaddress.ip_network(head, strict=False))
        except ValueError:
            pass
    return nets


class SlowLink:
    def __init__(self, rate_mbit, host_ns=None):
        tag = os.getpid() % 100000
        self.host_ns = host_ns
        self.ns = f"starling-chaos-{tag}"
        self.root_dev = f"stc{tag}r"  # interface names: 15 characters at most
        self.ns_dev = f"stc{tag}n"
        self.rate_mbit = rate_mbit
        self.root_ip = self.ns_ip = self.net = None
        self.created = False

    def why_unavailable(self):
        if os.geteuid() != 0:
            return "not root (network namespaces and tc need root)"
        for tool in ("ip", "tc"):
            if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
                return f"`{tool}` not found"
        return None

    def _pick_subnet(self):
        taken = taken_networks()
        for third in range(64 + os.getpid() % 128, 256):
            net = ipaddress.ip_network(f"10.251.{third}.0/24")
            if not any(net.overlaps(t) for t in taken):
                return net
        raise RuntimeError("no free 10.251.x.0/24 subnet")

    def setup(self):
        net = self._pick_subnet()
        self.net = net
        hosts = list(net.hosts())
        self.root_ip, self.ns_ip = str(hosts[0]), str(hosts[1])
        self.created = True
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", self.root_dev, "type", "veth", "peer", "name", self.ns_dev)
        run("ip", "link", "set", self.ns_dev, "netns", self.ns)
        if self.host_ns:
            run("ip", "link", "set", self.root_dev, "netns", self.host_ns)
        h = self._in_host("ip")
        run(*h, "addr", "add", f"{self.root_ip}/24", "dev", self.root_dev)
        run(*h, "link", "set", self.root_dev, "up")
        run("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_dev)
        run("ip", "-n", self.ns, "link", "set", self.ns_dev, "up")
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        if self.host_ns:
            run("ip", "-n", self.ns, "route", "add", "default", "via", self.root_ip)
            run(*self._in_host("sysctl"), "-qw", "net.ipv4.ip_forward=1")
        self._shape("add", self.rate_mbit)

    def _in_host(self, *cmd):
        """`cmd` run in the namespace the link's near end is in."""
        return ["ip", "netns", "exec", self.host_ns, *cmd] if self.host_ns else list(cmd)

    def _shape(self, verb, rate_mbit):
        # burst 64 KB covers the largest GSO packets a veth hands over; latency bounds the queue.
        tbf = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "50ms"]
        run(*self._in_host("tc"), "qdisc", verb, "dev", self.root_dev, *tbf)
        run("ip", "netns", "exec", self.ns, "tc", "qdisc", verb, "dev", self.ns_dev, *tbf)

    def set_rate(self, rate_mbit):
        self._shape("change", rate_mbit)
        self.rate_mbit = rate_mbit

    def describe(self):
        return (f"namespace {self.ns}: veth {self.root_ip} ({self.host_ns or 'root'}) <-> {self.ns_ip} ({self.ns}), "
                f"tbf {self.rate_mbit} Mbit/s each way")

    def cleanup(self):
        """Removes the namespace (which takes the veth pair with it) and the root end if left over."""
        if not self.created:
            return
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.root_dev], capture_output=True)
        self.created = False
