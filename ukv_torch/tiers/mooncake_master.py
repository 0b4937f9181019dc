"""A local `mooncake_master` process: what `--tier mooncake` starts when no
master is given, and what the tests run for real.

The master serves its own HTTP metadata (no etcd) and binds every port it
opens to one host, loopback by default, so a local store reaches nothing
beyond this machine. `kill` and `start` again on the same ports are how a
master that died and came back looks to its clients.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional

#: the longest `start` waits for a new master to answer (it takes about a
#: second on a 2-core machine)
START_TIMEOUT_S = 30.0
#: the longest `stop` waits for a master asked to stop before killing it
STOP_TIMEOUT_S = 10.0
#: attempts at finding free ports; another process may take a port between
#: our probe and the master's bind
PORT_ATTEMPTS = 3


def master_executable() -> Path:
    """The `mooncake_master` binary the Mooncake wheel ships beside its
    modules (the console script of the same name execs it)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "mooncake is not installed: pip install 'ukv_torch[mooncake]' "
            "(the mooncake-transfer-engine wheel, -non-cuda on machines without a GPU)")
    path = Path(spec.origin).parent / "mooncake_master"
    if not path.is_file():
        raise FileNotFoundError(f"the mooncake wheel has no mooncake_master at {path}")
    return path


def free_ports(host: str, count: int) -> List[int]:
    """`count` distinct ports that nothing listens on now (held open together,
    so the kernel hands out different ones)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class MooncakeMaster:
    """A `mooncake_master` on `host` (see the module docstring). Ports are
    chosen free at the first `start` and kept across restarts, so clients that
    knew the old master find the new one."""

    def __init__(self, host: str = "127.0.0.1", log_path: Optional[str] = None):
        if not isinstance(host, str) or not host:
            raise ValueError(f"MooncakeMaster: host must be a non-empty address string, got {host!r}")
        self.host = host
        self.log_path = log_path
        self._executable = master_executable()
        self._ports: Optional[List[int]] = None
        self._process: Optional[subprocess.Popen] = None

    # -- addresses clients use -------------------------------------------------
    @property
    def master_address(self) -> str:
        return f"{self.host}:{self._port(0)}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self._port(1)}/metadata"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self._port(2)}/metrics"

    def _port(self, which: int) -> int:
        if self._ports is None:
            raise RuntimeError("MooncakeMaster: not started yet; call start() first")
        return self._ports[which]

    # -- life cycle -------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> "MooncakeMaster":
        """Start the master and return once it serves RPC and metadata. The
        first start picks free ports (retrying where another process took
        one first); later starts reuse them."""
        if self.running:
            return self
        attempts = PORT_ATTEMPTS if self._ports is None else 1
        for attempt in range(attempts):
            if self._ports is None or attempt > 0:
                self._ports = free_ports(self.host, 3)
            if self._launch():
                return self
        raise RuntimeError(f"mooncake_master did not come up on {self.host} "
                           f"(ports {self._ports}); its output:\n{self._log_tail()}")

    def stop(self) -> None:
        """Ask the master to stop (SIGTERM), kill it if it does not in time."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """Kill the master at once (SIGKILL), as a crash would."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------
    def _arguments(self) -> List[str]:
        rpc, metadata, metrics = self._ports
        return [str(self._executable),
                f"--rpc_address={self.host}", f"--rpc_port={rpc}",
                "--enable_http_metadata_server=true",
                f"--http_metadata_server_host={self.host}", f"--http_metadata_server_port={metadata}",
                f"--metrics_host={self.host}", f"--metrics_port={metrics}",
                # the periodic metric log lines only add noise to the output
                "--enable_metric_reporting=false"]

    def _launch(self) -> bool:
        """One start on the current ports; False if the master exited or did
        not become ready within START_TIMEOUT_S (it is killed then)."""
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self._process = subprocess.Popen(self._arguments(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        finally:
            if self.log_path:
                log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if self._ready():
                return True
            time.sleep(0.05)
        self.kill()
        return False

    def _ready(self) -> bool:
        """The master says it serves, and its metadata server answers (404 for
        a key nobody wrote is an answer)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self._ports[2]}/health", timeout=1) as r:
                if not json.loads(r.read()).get("service_ready", False):
                    return False
        except (OSError, ValueError):
            return False
        try:
            urllib.request.urlopen(f"{self.metadata_url}?key=ukv_probe", timeout=1).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def _log_tail(self, chars: int = 4000) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return "(no log_path given)"
        with open(self.log_path, "rb") as f:
            return f.read()[-chars:].decode(errors="replace")
