"""The demo's integrity check on a tiny configuration, and proof that it can fail."""
import json
import re
import subprocess
import sys

import pytest

TINY = ["--conversations", "6", "--steps", "120", "--budget-mib", "64", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512", "--index-topk", "64", "--plot", ""]


def run_demo(*extra):
    proc = subprocess.run([sys.executable, "-m", "ukv_torch.demo", *TINY, *extra], capture_output=True, text=True,
                          timeout=600)
    return proc


def test_tiny_run_has_no_mismatch_and_unified_admits_at_least_as_much():
    proc = run_demo("--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    layouts = {row["layout"]: row for row in json.loads(proc.stdout)["layouts"]}
    static = layouts["static split"]
    for name, row in layouts.items():
        assert row["mismatches"] == 0, name
        assert row["checked_indices"] > 100_000, name  # the check really ran
        assert row["requests_completed"] >= static["requests_completed"], name
    assert layouts["unified (elastic sizing)"]["logical_blocks"] > static["logical_blocks"]
    # Served work is the workload's, whatever the layout: with every turn
    # completed, the layouts differ only in the steps they took.
    if all(row["requests_completed"] == static["requests_completed"] for row in layouts.values()):
        assert len({row["tokens_served"] for row in layouts.values()}) == 1
        for row in layouts.values():
            assert row["tokens_per_step"] == round(row["tokens_served"] / row["steps"], 1)


def test_step_sized_swa_pool_serves_with_no_mismatch():
    proc = run_demo("--json", "--swa-sizing", "step")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["swa_sizing"] == "step"
    for row in out["layouts"]:
        assert row["mismatches"] == 0 and row["checked_indices"] > 100_000, row["layout"]
        if row["layout"].startswith("row space"):
            continue  # one space of rows: SWA has no pool of its own to size
        assert row["swa_blocks"] == 8 * 2 + 512 // 128, row["layout"]  # 8 windows of 2 blocks + one step's chunks


@pytest.mark.parametrize("layout", ["static", "elastic", "row_space"])
def test_a_corrupted_table_entry_fails_the_run(layout):
    proc = run_demo("--layouts", layout, "--inject-fault", "40")
    assert proc.returncode == 1
    assert "INTEGRITY MISMATCH" in proc.stderr
    assert ": FAIL" in proc.stdout.split("| layout |")[0]


def test_row_space_reads_its_kv_through_prefix_hits_and_relocations():
    """A budget tight enough that the row space moves units to make room, over
    enough turns that follow-ups hit their cached prefixes: every index still
    reads the content its position expects."""
    proc = subprocess.run([sys.executable, "-m", "ukv_torch.demo", "--conversations", "12", "--steps", "300",
                           "--budget-mib", "16", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
                           "--index-topk", "64", "--plot", "", "--layouts", "row_space", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row, tiered = json.loads(proc.stdout)["layouts"]
    assert row["moved_bytes_per_step_max"] > 0 and row["prefix_hit_rate"] > 0.1
    assert row["mismatches"] == 0 and row["checked_indices"] > 1_000_000
    # Beside it, the row space with the host tier (on by default): it loads what the HBM
    # cache lost, computes less, and every index into the restored rows checks.
    assert tiered["layout"] == "row space + host tier 8x"
    assert tiered["loaded_tokens"] > 0 and tiered["hit_rate_with_tier"] > row["hit_rate_with_tier"]
    assert tiered["computed_tokens_per_step"] < row["computed_tokens_per_step"]
    assert tiered["mismatches"] == 0 and tiered["checked_indices"] > 1_000_000


def test_the_text_report_leads_with_the_outcome():
    proc = run_demo("--layouts", "static,row_space")
    assert proc.returncode == 0, proc.stderr[-2000:]
    head = proc.stdout.split("| layout |")[0]  # before the table
    ratio = re.search(r"against the static split in the same 64 MiB: row space (\d+\.\d\d)x", head)
    verdict = re.search(r"^0 index mismatches in ([\d,]+) checked: PASS$", head, re.M)
    assert ratio and verdict, head
    rows = {line.split("|")[1].strip(): line.split("|") for line in proc.stdout.splitlines()
            if line.startswith("| static split") or line.startswith("| row space")}
    served = [float(rows[name][5]) for name in ("static split", "row space")]  # the served tok/step column
    assert float(ratio.group(1)) == pytest.approx(served[1] / served[0], abs=0.006)
    assert int(verdict.group(1).replace(",", "")) > 100_000


def test_help_shows_defaults_layouts_and_the_workload_format():
    proc = subprocess.run([sys.executable, "-m", "ukv_torch.demo", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "(default: 64.0)" in proc.stdout and "row_space" in proc.stdout
    assert '"turns"' in proc.stdout and "system_prompts" in proc.stdout


@pytest.mark.gpu
def test_cuda_run_replays_a_captured_decode_graph_with_no_mismatch():
    proc = run_demo("--device", "cuda", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in json.loads(proc.stdout)["layouts"]:
        assert row["mismatches"] == 0, row["layout"]
        assert row["decode_graph_replays"] > 50, row["layout"]  # decode steps really came from the graph


@pytest.mark.gpu
def test_cuda_graph_reads_the_persistent_tables_so_corruption_is_caught():
    proc = run_demo("--device", "cuda", "--layouts", "elastic", "--inject-fault", "40")
    assert proc.returncode == 1
    assert "INTEGRITY MISMATCH" in proc.stderr


def test_unknown_swa_sizing_is_refused_by_name():
    from ukv_torch.demo.__main__ import plan_layout
    with pytest.raises(ValueError, match="swa_sizing"):
        plan_layout(64 << 20, [0, 4, 128], "elastic", max_num_seqs=8, max_num_batched_tokens=512, swa_sizing="tight")


def test_the_mooncake_tier_starts_its_own_master_and_reads_restored_rows_correctly():
    from support.mooncake_master import require_mooncake
    require_mooncake()
    proc = run_demo("--layouts", "row_space", "--tier", "mooncake", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row, tiered = json.loads(proc.stdout)["layouts"]
    assert tiered["layout"] == "row space + mooncake tier 8x"
    assert tiered["mismatches"] == 0 and tiered["checked_indices"] > 100_000
