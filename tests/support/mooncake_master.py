"""A real mooncake_master for the tests that need Mooncake, on free loopback
ports, with its output in the test's tmp_path.

Without Mooncake installed such a test is skipped on a developer's machine
(with the install line), but fails under CI=true: CI installs it through
`make test`, so a missing wheel there is a broken install, not a reason to
skip.
"""
import importlib.util
import os

import pytest

from ukv_torch.tiers.mooncake_master import MooncakeMaster

# Mooncake logs every connection and segment at INFO; the tests' output keeps its errors only
# (read when Mooncake starts, so set before any test makes a client or an engine).
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


def require_mooncake() -> None:
    if importlib.util.find_spec("mooncake") is not None:
        return
    message = ("mooncake is not installed: `make test` installs it, or "
               "pip install mooncake-transfer-engine-non-cuda (mooncake-transfer-engine on a GPU host) "
               "and apt-get install libibverbs1")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def started_master(folder):
    require_mooncake()
    return MooncakeMaster(log_path=str(folder / "mooncake_master.log")).start()


@pytest.fixture
def mooncake_master(tmp_path):
    """A master of this test's own: it may kill and restart it, and count
    what the master holds."""
    with started_master(tmp_path) as master:
        yield master


@pytest.fixture(scope="module")
def shared_mooncake_master(tmp_path_factory):
    """One master for a module's tests that neither stop it nor count what
    it holds (a start costs about a second)."""
    with started_master(tmp_path_factory.mktemp("mooncake")) as master:
        yield master
