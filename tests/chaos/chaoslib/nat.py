"""Nodes without an open port, behind real NAT and firewalls built from network namespaces.

A namespace of its own plays the internet (not the root namespace, whose default route may lead
to a gateway that accepts any connection): a bridge with a public /24 where reachable nodes
listen. Each hidden node has a namespace of its own behind a router namespace:

    internet:   bridge BR, PUB.1/24                   <- reachable nodes listen on PUB.1
    router k:   veth on BR, PUB.(10+k)/24; veth PRIV_k.1/24; nftables (below)
    node k:     veth PRIV_k.2/24, default route via PRIV_k.1

Kinds of router:
  "nat"       masquerade: the node's connections leave from PUB.(10+k), and nothing from outside
              reaches it (Linux conntrack keeps the port where it can and lets in only replies to
              a connection the node opened: endpoint-dependent filtering, a port-restricted NAT)
  "cone"      masquerade that keeps the node's port, and lets in anything sent to a port the
              node has used outbound, from any host (endpoint-independent mapping and filtering:
              a full-cone NAT)
  "symmetric" masquerade that draws a fresh port for each connection (endpoint-dependent
              mapping), and lets in only replies
  "firewall"  no translation: the node keeps its own routable address (the internet routes
              PRIV_k through the router), but inbound connections (SYNs) are dropped
  "open"      no translation and no filter: a routable node any host can dial, behind the same
              hops as the others (the direct path the exchange bench compares them with)

attach_root() joins the root namespace to the bridge as one more host of the internet (PUB.2),
for the chaos suite's --natted, whose public nodes run there.
"""

import ipaddress
import os
import shutil
import subprocess

from chaoslib.netlink import run, taken_networks

KINDS = ("nat", "firewall")  # the kinds that hide a node (chaos --natted takes them in turn)
ALL_KINDS = KINDS + ("cone", "symmetric", "open")
TRANSLATING = ("nat", "cone", "symmetric")  # seen outside at the router's address
ROUTABLE = ("firewall", "open")  # the internet routes the node's own address to its router

RULES = {
    "nat": """
table ip starling_nat {{
  chain postrouting {{
    type nat hook postrouting priority 100;
    oifname "{pub}" masquerade
  }}
}}
""",
    # The ports the node has sent from are kept in a set: a connection from outside to one of
    # them goes to the node, whoever sends it.
    "cone": """
table ip starling_nat {{
  set used {{
    type inet_service; flags timeout; timeout 300s;
  }}
  chain prerouting {{
    type nat hook prerouting priority -100;
    iifname "{pub}" tcp dport @used dnat to {node}
  }}
  chain outbound {{
    type filter hook forward priority -10;
    iifname "{priv}" meta l4proto tcp update @used {{ tcp sport }}
  }}
  chain postrouting {{
    type nat hook postrouting priority 100;
    oifname "{pub}" masquerade
  }}
}}
""",
    "symmetric": """
table ip starling_nat {{
  chain postrouting {{
    type nat hook postrouting priority 100;
    oifname "{pub}" masquerade random
  }}
}}
""",
    "firewall": "",
    "open": "",
}

# Every kind lets the node out and only replies back in (and, in a full cone, what its
# prerouting sent to the node). A connection from outside to the router itself is dropped, not
# answered with a reset, as routers with no service open do: a reset would also end the router's
# record of the node's own connection to the same address and port, which a hole punch needs.
FORWARD = """
table ip starling_filter {{
  chain forwarding {{
    type filter hook forward priority 0; policy drop;
    iifname "{priv}" accept
    ct state established,related accept
    ct status dnat accept
  }}
  chain input {{
    type filter hook input priority 0;
    iifname "{pub}" ct state new tcp flags & (syn | ack) == syn drop
  }}
}}
"""


def why_unavailable():
    if os.geteuid() != 0:
        return "not root (network namespaces and nftables need root)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (scripts/setup installs iproute2 and nftables)"
    return None


class Hidden:
    def __init__(self, index, kind, tag):
        self.index = index
        self.kind = kind
        self.router_ns = f"stn{tag}r{index}"
        self.ns = f"stn{tag}n{index}"
        self.pub_dev = f"stn{tag}p{index}"  # the router's public end; its peer joins the bridge
        self.bridge_dev = f"stn{tag}b{index}"
        self.priv_dev = f"stn{tag}i{index}"  # the router's private end
        self.node_dev = f"stn{tag}v{index}"
        self.router_public_ip = None
        self.net = None
        self.ip = None  # the node's own address
        self.nodes_held = 0  # chaos --natted: the nodes this slot has held, each on a port of its own

    def describe(self):
        seen = self.router_public_ip if self.kind in TRANSLATING else self.ip
        return f"{self.ns}: {self.ip} behind {self.kind} router {self.router_ns} (seen outside as {seen})"


class NatTopology:
    def __init__(self, kinds):
        for k in kinds:
            if k not in ALL_KINDS:
                raise ValueError(f"unknown router kind {k!r}: one of {', '.join(ALL_KINDS)}")
        tag = os.getpid() % 10000
        self.tag = tag
        self.public_ns = f"stn{tag}w"
        self.bridge = f"stn{tag}br"
        self.public_ip = None
        self.public_net = None
        self.hidden = [Hidden(i, k, tag) for i, k in enumerate(kinds)]
        self.root_dev = f"stn{tag}h"  # the root's end of attach_root's veth pair
        self.root_ip = None
        self.root_unreachable = []  # routes attach_root added to the root namespace
        self.created = False

    def _free_nets(self, count):
        taken = taken_networks()
        found = []
        for third in range(16 + os.getpid() % 128, 256):
            net = ipaddress.ip_network(f"10.252.{third}.0/24")
            if not any(net.overlaps(t) for t in taken + found):
                found.append(net)
                if len(found) == count:
                    return found
        raise RuntimeError(f"no {count} free 10.252.x.0/24 subnets")

    def setup(self):
        nets = self._free_nets(1 + len(self.hidden))
        self.public_net = nets[0]
        self.public_ip = str(self.public_net.network_address + 1)
        self.created = True
        run("ip", "netns", "add", self.public_ns)
        w = ["ip", "-n", self.public_ns]
        run(*w, "link", "set", "lo", "up")
        run(*w, "link", "add", self.bridge, "type", "bridge")
        run(*w, "addr", "add", f"{self.public_ip}/24", "dev", self.bridge)
        run(*w, "link", "set", self.bridge, "up")
        for h, net in zip(self.hidden, nets[1:]):
            self._add(h, net)
        # Every router knows the way to a routable node's network too, over the bridge.
        for h in self.hidden:
            if h.kind not in ROUTABLE:
                continue
            for g in self.hidden:
                if g is not h:
                    run("ip", "-n", g.router_ns, "route", "add", str(h.net), "via", h.router_public_ip)
        return self

    def _add(self, h, net):
        h.net = net
        h.router_public_ip = str(self.public_net.network_address + 10 + h.index)
        router_private_ip = str(net.network_address + 1)
        h.ip = str(net.network_address + 2)
        run("ip", "netns", "add", h.router_ns)
        run("ip", "netns", "add", h.ns)
        run("ip", "link", "add", h.pub_dev, "type", "veth", "peer", "name", h.bridge_dev)
        run("ip", "link", "set", h.bridge_dev, "netns", self.public_ns)
        run("ip", "-n", self.public_ns, "link", "set", h.bridge_dev, "master", self.bridge)
        run("ip", "-n", self.public_ns, "link", "set", h.bridge_dev, "up")
        run("ip", "link", "set", h.pub_dev, "netns", h.router_ns)
        run("ip", "link", "add", h.priv_dev, "type", "veth", "peer", "name", h.node_dev)
        run("ip", "link", "set", h.priv_dev, "netns", h.router_ns)
        run("ip", "link", "set", h.node_dev, "netns", h.ns)
        r = ["ip", "-n", h.router_ns]
        run(*r, "addr", "add", f"{h.router_public_ip}/24", "dev", h.pub_dev)
        run(*r, "addr", "add", f"{router_private_ip}/24", "dev", h.priv_dev)
        for dev in (h.pub_dev, h.priv_dev, "lo"):
            run(*r, "link", "set", dev, "up")
        n = ["ip", "-n", h.ns]
        run(*n, "addr", "add", f"{h.ip}/24", "dev", h.node_dev)
        for dev in (h.node_dev, "lo"):
            run(*n, "link", "set", dev, "up")
        run(*n, "route", "add", "default", "via", router_private_ip)
        run("ip", "netns", "exec", h.router_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        if h.kind != "open":
            rules = (RULES[h.kind].format(pub=h.pub_dev, priv=h.priv_dev, node=h.ip)
                     + FORWARD.format(pub=h.pub_dev, priv=h.priv_dev))
            p = subprocess.run(["ip", "netns", "exec", h.router_ns, "nft", "-f", "-"], input=rules,
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"nft in {h.router_ns} failed: {p.stderr.strip()}")
        if h.kind in ROUTABLE:
            # Routable: the internet knows the way to the node's own address.
            run("ip", "-n", self.public_ns, "route", "add", str(net), "via", h.router_public_ip)

    def attach_root(self):
        """Joins the root namespace to the internet's bridge and returns the root's address there.
        A NATed node's network is unreachable from the root (rather than sent to its default
        gateway), a firewalled or open one's routed through its router, as on the bridge."""
        bridge_end = f"stn{self.tag}hb"
        run("ip", "link", "add", self.root_dev, "type", "veth", "peer", "name", bridge_end)
        run("ip", "link", "set", bridge_end, "netns", self.public_ns)
        run("ip", "-n", self.public_ns, "link", "set", bridge_end, "master", self.bridge)
        run("ip", "-n", self.public_ns, "link", "set", bridge_end, "up")
        self.root_ip = str(self.public_net.network_address + 2)
        run("ip", "addr", "add", f"{self.root_ip}/{self.public_net.prefixlen}", "dev", self.root_dev)
        run("ip", "link", "set", self.root_dev, "up")
        for h in self.hidden:
            if h.kind in ROUTABLE:
                run("ip", "route", "add", str(h.net), "via", h.router_public_ip)
            else:
                run("ip", "route", "add", "unreachable", str(h.net))
                self.root_unreachable.append(str(h.net))
        return self.root_ip

    def route_to(self, net):
        """Sends the root's and every router's traffic for `net` (one more network the internet's
        namespace is joined to: the chaos slow link's) through the internet's namespace."""
        run("ip", "route", "add", str(net), "via", self.public_ip)
        for h in self.hidden:
            run("ip", "-n", h.router_ns, "route", "add", str(net), "via", self.public_ip)

    def describe(self):
        lines = [f"{self.public_ns} (the internet): bridge {self.bridge} {self.public_ip}/{self.public_net.prefixlen}"]
        if self.root_ip:
            lines.append(f"root namespace: {self.root_ip} on the bridge")
        lines += [h.describe() for h in self.hidden]
        return "\n".join(lines)

    def cleanup(self):
        """Removes the namespaces, which takes their interfaces with them."""
        if not self.created:
            return
        for h in self.hidden:
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
            subprocess.run(["ip", "netns", "del", h.router_ns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.public_ns], capture_output=True)
        if self.root_ip:
            subprocess.run(["ip", "link", "del", self.root_dev], capture_output=True)
            for net in self.root_unreachable:
                subprocess.run(["ip", "route", "del", "unreachable", net], capture_output=True)
        self.created = False
