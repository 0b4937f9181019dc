"""Two engine processes (examples/engine_loop.py) share one Mooncake Store: the
second one's repeats of the first one's prompts hit in the store, and every
index into the rows it restored from there reads what its position expects."""
import subprocess
import sys

from support.mooncake_master import mooncake_master  # noqa: F401  (fixture)
from test_engine_loop import EXAMPLE, run_example


def test_a_second_engine_reads_the_first_engines_prefixes_from_the_store(mooncake_master):  # noqa: F811
    m = mooncake_master
    store = ["--tier", "mooncake", "--mooncake-master", m.master_address, "--mooncake-metadata", m.metadata_url,
             "--mooncake-segment-kib", str(64 << 10), "--requests", "12"]
    # The first engine stays up (its store memory holds what it saved) until the second one is done.
    first = subprocess.Popen([sys.executable, str(EXAMPLE), *store, "--linger"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = first.stdout.readline().split()
        assert line[:2] == ["engine_loop:", "PASS"], line
        status, verdict, second = run_example(*store)  # the same seed: the same prompts
    finally:
        first.communicate(input="", timeout=120)
    assert (status, verdict) == (0, "PASS"), second
    assert int(second["store_objects"]) > 0 and int(second["loaded_tokens"]) > 0
    assert int(second["mismatches"]) == 0 and int(second["checked_indices"]) > 100_000
    assert first.returncode == 0
