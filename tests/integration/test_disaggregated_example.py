"""examples/disaggregated.py end to end on loopback: a router, a prefill and a
decode engine in three processes, sequences moved over Mooncake's transfer
engine between slot and row-space layouts (rows straight into rows, or
staged), every index both engines build checked against the tagged KV. And
the check is real: with transfers that move no byte, the decode engine's
reads fail it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.mooncake_master import require_mooncake

ROOT = Path(__file__).resolve().parents[2]


def run_example(*args):
    require_mooncake()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "examples" / "disaggregated.py"), *args],
                          capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.parametrize("prefill, decode, staging_kib", [
    ("row_space", "elastic", "0"), ("static", "row_space", "256"), ("row_space", "row_space", "0"),
    ("elastic", "static", "256")])
def test_requests_move_from_prefill_to_decode_and_read_right(prefill, decode, staging_kib):
    out = run_example("--prefill-layout", prefill, "--decode-layout", decode, "--staging-kib", staging_kib,
                      "--requests", "12", "--seed", "1")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("router: PASS requests=12 transferred=12"), out.stdout
    assert any(line.startswith("decode: arrived=12 PASS") and " mismatches=0 " in line for line in lines), out.stdout


def test_transfers_that_move_nothing_fail_the_check():
    out = run_example("--requests", "4", "--fault", "no-bytes")
    assert out.returncode == 1
    decode = next(line for line in out.stdout.splitlines() if line.startswith("decode:"))
    assert " FAIL " in decode and " mismatches=0 " not in decode, out.stdout
