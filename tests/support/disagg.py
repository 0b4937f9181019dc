"""Running the two sides of a transfer in tests: a receiver served on a
thread while the test sends from the main one, and a peer process (see
disagg_peer.py) for the sides that die."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.mooncake_master import require_mooncake

PEER = Path(__file__).with_name("disagg_peer.py")
#: the longest a test waits for a side to answer or give up
BOUND_S = 60.0


class Served:
    """receiver.poll on a thread until it reports ``count`` events or BOUND_S passes."""

    def __init__(self, receiver, count: int = 1):
        self.events = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(receiver, count), daemon=True)
        self._thread.start()

    def _run(self, receiver, count):
        deadline = time.monotonic() + BOUND_S
        while len(self.events) < count and time.monotonic() < deadline and not self._stop.is_set():
            self.events += receiver.poll(0.05)

    def wait(self):
        """The events, once ``count`` came (or BOUND_S passed)."""
        self._thread.join(BOUND_S + 5)
        assert not self._thread.is_alive(), "the receiver still polls"
        return self.events

    def stop(self):
        """The events so far, polling stopped (before the receiver is closed)."""
        self._stop.set()
        return self.wait()


def stopped(process: subprocess.Popen) -> bool:
    """Whether the process is stopped (SIGSTOP), as /proc reads its state."""
    with open(f"/proc/{process.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def peer(*args) -> subprocess.Popen:
    require_mooncake()
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(PEER.parent)]))
    return subprocess.Popen([sys.executable, str(PEER), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
