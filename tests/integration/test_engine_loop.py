"""examples/engine_loop.py, the example of docs/serving-loop.md, run as a user
runs it: in the static split, option-2 elastic and the row space it must serve its requests with every index reading
what its position expects, and a wrong table entry or a skipped row copy must
fail it."""
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engine_loop.py"


def run_example(*args):
    """(exit status, PASS or FAIL, the outcome line's counts)."""
    proc = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=600)
    first = proc.stdout.splitlines()[0].split() if proc.stdout else []
    assert first[:1] == ["engine_loop:"], proc.stdout + proc.stderr[-3000:]
    counts = dict(field.split("=", 1) for field in first[2:])
    return proc.returncode, first[1], counts


@pytest.mark.parametrize("layout", ["static", "elastic", "row_space"])
def test_every_index_reads_what_its_position_expects(layout):
    status, verdict, counts = run_example("--layout", layout)
    assert (status, verdict) == (0, "PASS"), counts
    assert counts["layout"] == layout and int(counts["requests"]) == 24
    assert int(counts["checked_indices"]) > 1_000_000 and int(counts["mismatches"]) == 0
    # What the loop is there to exercise under its memory pressure.
    assert int(counts["preemptions"]) > 0 and int(counts["hit_tokens"]) > 0
    if layout == "row_space":
        assert int(counts["moved_rows"]) > 0


@pytest.mark.parametrize("layout, fault", [("static", "table"), ("elastic", "table"), ("row_space", "table"),
                                           ("row_space", "skip-row-copies")])
def test_the_check_fails_on_a_wrong_index(layout, fault):
    status, verdict, counts = run_example("--layout", layout, "--fault", fault)
    assert (status, verdict) == (1, "FAIL"), counts
    assert int(counts["mismatches"]) > 0


@pytest.mark.gpu
def test_the_loop_passes_on_cuda():
    status, verdict, counts = run_example("--device", "cuda")
    assert (status, verdict) == (0, "PASS"), counts


@pytest.mark.parametrize("layout", ["static", "elastic", "row_space"])
def test_restored_prefixes_read_what_their_positions_expect(layout):
    """With the host tier, admissions load prefixes the HBM cache lost, and every index into them checks."""
    status, verdict, counts = run_example("--layout", layout, "--tier", "host")
    assert (status, verdict) == (0, "PASS"), counts
    assert int(counts["loaded_tokens"]) > 0 and int(counts["mismatches"]) == 0
    assert int(counts["requests"]) == 24


def test_the_check_fails_when_loaded_rows_are_not_written():
    status, verdict, counts = run_example("--tier", "host", "--fault", "skip-tier-rows")
    assert (status, verdict) == (1, "FAIL"), counts
    assert int(counts["loaded_tokens"]) > 0 and int(counts["mismatches"]) > 0
