"""A real Ray cluster on loopback for the Ray executor tests: a head node and worker nodes
started with `ray start --block`, each in a process group of its own so that a test can
kill one node whole (a machine that dies) and teardown can stop exactly what it started.

Every node runs on 127.0.0.2 (Ray turns 127.0.0.1 into the machine's outward address),
with one CPU and a small object store; the head's health checks are fast, so that a
killed node is declared dead within about a second."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IP = "127.0.0.2"
RAY = str(Path(sys.executable).with_name("ray"))
ENTRY_POINTS = ("[opdiff_snap.backends]\n"
                "special = helpers.ray.backends:SpecialBackend\n"
                "doomed = helpers.ray.backends:DoomedBackend\n"
                "nowhere = helpers.ray.backends:NowhereBackend\n"
                "sleepy = helpers.ray.backends:SleepyBackend\n")
# The cluster's token, for its nodes and for every driver that joins it (this process
# and the CLI's): in the environment, so nothing is written to ~/.ray.
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
                      "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((IP, 0))
        return s.getsockname()[1]


class Cluster:
    """Nodes started by `ray start`; `env` is what their workers see (PYTHONPATH with the
    test plugins), so the jobs' code and plugins import there as in the parent."""

    def __init__(self, env: dict[str, str]):
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0", **AUTH}
        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))   # short: unix socket paths
        self.port = free_port()
        self.address = f"{IP}:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.temp / f"{name}.log", "w")
        self.nodes[name] = subprocess.Popen(
            [RAY, "start", "--block", "--node-ip-address", IP, "--num-cpus", "1",
             "--object-store-memory", "100000000", "--disable-usage-stats", *args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_head(self) -> None:
        self._start("head", ["--head", "--port", str(self.port), "--include-dashboard", "false",
                             "--temp-dir", str(self.temp), "--system-config", json.dumps(FAST_HEALTH_CHECKS)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((IP, self.port)) == 0:
                    return
            if self.nodes["head"].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the Ray head did not start: {(self.temp / 'head.log').read_text()[-2000:]}")

    def add_node(self, name: str, resources: dict[str, float]) -> None:
        self._start(name, ["--address", self.address, "--resources", json.dumps(resources)])

    def wait_for(self, ray, alive: int, timeout: float = 120) -> None:
        """Until `alive` nodes are up (through the caller's Ray connection)."""
        deadline = time.monotonic() + timeout
        while sum(1 for n in ray.nodes() if n["Alive"]) < alive:
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-1500:] for p in self.temp.glob("*.log")}
                raise RuntimeError(f"only {sum(1 for n in ray.nodes() if n['Alive'])} of {alive} Ray nodes "
                                   f"came up: {logs}")
            time.sleep(0.2)

    def node_id(self, ray, resource: str) -> str:
        """The id of the live node advertising `resource`."""
        (found,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource)]
        return found

    def kill(self, name: str) -> None:
        """The node dies at once, as a machine would: its whole process group, SIGKILL."""
        proc = self.nodes.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)

    def stop(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            if name in self.nodes:
                self.kill(name)
        shutil.rmtree(self.temp, ignore_errors=True)
