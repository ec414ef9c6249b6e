#!/usr/bin/python3
"""Checks deploy/ the way the tools that read it would, without Docker or a cluster:
systemd-analyze verifies the unit (its binaries pointed at this build), and the compose file,
the Kubernetes manifests and the Dockerfiles are parsed for what operators rely on: no default
secret, metrics on loopback, a health check, one pod evicted at a time, a read-only root, shards
prepared for the config the daemon runs, a runtime directory for the control socket.

usage: check_deploy.py SOURCE_DIR BIN_DIR   (exits 1 naming every problem found)
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml


def check_unit(deploy, bin_dir, problems):
    unit = (deploy / "systemd" / "starlingd.service").read_text()
    if "LoadCredential=peer-secret:/etc/starling/secret" not in unit or \
            "STARLING_PEER_SECRET_FILE=%d/peer-secret" not in unit:
        problems.append("starlingd.service: the secret is not a credential read through STARLING_PEER_SECRET_FILE")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "starlingd.service"
        copy.write_text(unit.replace("/usr/local/bin", str(bin_dir)))
        result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
        # Only what concerns the unit itself: the host's other units are none of this test's business.
        own = [line for line in (result.stdout + result.stderr).splitlines() if "starlingd.service" in line]
        if result.returncode != 0 or own:
            problems.append("systemd-analyze verify: " + "; ".join(own or [f"exit {result.returncode}"]))


def check_start_preparation(deploy, problems):
    """The unit and the entry point prepare the shards of the very config the daemon then reads (so
    with its tokenizer), and the unit owns the /run directory the configs suggest for the socket."""
    unit = (deploy / "systemd" / "starlingd.service").read_text()
    daemon_config = re.search(r"^ExecStart=\S*starlingd --config (\S+)", unit, re.MULTILINE)
    prepare_config = re.search(r"^ExecStartPre=\S*starling data prepare --config (\S+)$", unit, re.MULTILINE)
    if not daemon_config or not prepare_config or daemon_config[1] != prepare_config[1]:
        problems.append("starlingd.service: ExecStartPre does not run `starling data prepare --config` on "
                        "the config ExecStart gives starlingd")
    suggested = {m for f in (deploy.parent / "configs").glob("*.toml")
                 for m in re.findall(r"unix:/run/([a-z]+)/", f.read_text())}
    owned = set(re.findall(r"^RuntimeDirectory=(\S+)$", unit, re.MULTILINE))
    if suggested - owned:
        problems.append(f"starlingd.service: configs suggest sockets in /run/{sorted(suggested - owned)} "
                        f"but the unit's RuntimeDirectory= is {sorted(owned)}")
    entry = (deploy / "docker" / "entrypoint.sh").read_text()
    if not re.search(r'^starling data prepare --config "\$config"$', entry, re.MULTILINE) or \
            not re.search(r'^exec starlingd --config "\$config" ', entry, re.MULTILINE):
        problems.append("entrypoint.sh: the shards are not prepared with the config starlingd runs")


def check_compose(deploy, problems):
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    secret = compose["x-env"]["STARLING_PEER_SECRET"]
    if not re.fullmatch(r"\$\{STARLING_PEER_SECRET:\?.+\}", secret):
        problems.append(f"compose.yaml: the secret {secret!r} has a default instead of refusing to start without one")
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            if not str(port).startswith("127.0.0.1:"):
                problems.append(f"compose.yaml: {name} publishes {port} on every interface")


def check_dockerfiles(deploy, problems):
    for name in ("Dockerfile", "Dockerfile.cpu"):
        text = (deploy / "docker" / name).read_text()
        if not re.search(r'^HEALTHCHECK .*CMD \["starling", "status"\]$', text, re.MULTILINE):
            problems.append(f"{name}: no HEALTHCHECK running starling status")


def check_kubernetes(deploy, problems):
    docs = {d["kind"]: d for d in yaml.safe_load_all((deploy / "kubernetes" / "starling.yaml").read_text())}
    pdb = docs.get("PodDisruptionBudget")
    if not pdb or pdb["spec"].get("maxUnavailable") != 1:
        problems.append("starling.yaml: no PodDisruptionBudget of one pod at a time")
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    if not container["securityContext"].get("readOnlyRootFilesystem"):
        problems.append("starling.yaml: the root filesystem is writable")
    if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
        problems.append("starling.yaml: the nvidia.com/gpu taint is not tolerated")
    if "nvidia.com/gpu" not in container["resources"]["limits"]:
        problems.append("starling.yaml: no GPU asked for")
    if pod["terminationGracePeriodSeconds"] < 90:
        problems.append("starling.yaml: less than 90 s to drain")
    # Every pod seeds through the headless service (all pods' addresses), none through one pod.
    service = docs["Service"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    seeds = json.loads(env.get("STARLING_PEER_SEEDS", "[]"))
    wanted = f'{service["metadata"]["name"]}.$(POD_NAMESPACE).svc.cluster.local:7700'
    if service["spec"].get("clusterIP") != "None" or not service["spec"].get("publishNotReadyAddresses"):
        problems.append("starling.yaml: the service is not headless over every pod, ready or not")
    if seeds != [wanted] or "command" in container or "args" in container:
        problems.append(f"starling.yaml: pods do not all seed through the service ({wanted}): {seeds}")


def main(source_dir, bin_dir):
    deploy = Path(source_dir) / "deploy"
    problems = []
    for check in (lambda p: check_unit(deploy, Path(bin_dir).resolve(), p), lambda p: check_start_preparation(deploy, p), lambda p: check_compose(deploy, p),
                  lambda p: check_dockerfiles(deploy, p), lambda p: check_kubernetes(deploy, p)):
        check(problems)
    for problem in problems:
        print(problem)
    print(f"deploy: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
