"""tp_consistency.py (next to this file) under torchrun: both tensor-parallel
patterns agree on 1 and 2 CPU ranks (gloo), on every GPU with NCCL, and a
perturbed table on one rank fails the run with the perturbed entry named."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ukv_torch

PROGRAM = Path(__file__).with_name("tp_consistency.py")


def torchrun(nproc, *args, gpu=False):
    """Launch the program; the ranks import the ukv_torch this test imported."""
    env = dict(os.environ)
    package_root = str(Path(ukv_torch.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU, even on a GPU host
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(PROGRAM),
           "--json", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, summaries[-1] if summaries else None


def assert_both_patterns_agree(proc, summary, world, backend, steps):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (summary["world_size"], summary["backend"], summary["failed_checks"]) == (world, backend, 0)
    assert summary["steps"] == {"replicated": steps, "scheduler": steps}
    c = summary["counts"]
    assert c["replicated_table_checks"] == c["scheduler_table_checks"] == steps
    assert c["index_checks"] == c["reference_checks"] > steps // 2  # most steps decode
    assert c["decode_tokens"] > c["index_checks"]  # batches of several sequences
    # The workload really admits, preempts and completes (the same in both patterns: same calls).
    assert c["replicated_preemptions"] == c["scheduler_preemptions"] >= 1
    assert c["replicated_completed"] == c["scheduler_completed"] >= 5
    return c


@pytest.mark.parametrize("nproc", [1, 2])
def test_cpu_ranks_agree_in_both_patterns(nproc):
    proc, summary = torchrun(nproc, "--steps", "300")
    assert_both_patterns_agree(proc, summary, nproc, "gloo", 300)


@pytest.mark.parametrize("nproc,pattern,detected_by", [
    (2, "replicated", "staged tables differ"),
    (2, "scheduler", "indices differ across ranks"),
    (1, "scheduler", "indices differ from the reference"),
])
def test_a_perturbed_table_on_one_rank_fails_the_run(nproc, pattern, detected_by):
    proc, summary = torchrun(nproc, "--patterns", pattern, "--steps", "300", "--perturb-step", "40")
    assert proc.returncode != 0
    perturbed = re.search(rf"{pattern} step (\d+): perturbed row 0, SWA table, column (\d+)", proc.stderr)
    assert perturbed, proc.stderr[-3000:]
    step, col = perturbed.groups()
    assert int(step) >= 40 and summary["steps"] == {pattern: int(step) + 1}  # every rank stopped there
    assert summary["failed_checks"] > 0
    assert f"{pattern} step {step}: {detected_by}" in proc.stderr
    if nproc > 1:  # the table check names the entry the perturbation changed
        assert f"staged tables differ: row 0, SWA table, column {col}:" in proc.stderr


@pytest.mark.gpu
def test_every_gpu_rank_agrees_and_replays_the_captured_step():
    world = torch.cuda.device_count()
    proc, summary = torchrun(world, "--steps", "300", gpu=True)
    counts = assert_both_patterns_agree(proc, summary, world, "nccl", 300)
    assert counts["graph_replays_checked"] == counts["index_checks"]


@pytest.mark.gpu
def test_a_perturbed_table_fails_the_gpu_run():
    proc, summary = torchrun(torch.cuda.device_count(), "--patterns", "scheduler", "--perturb-step", "40", gpu=True)
    assert proc.returncode != 0 and summary["failed_checks"] > 0
    assert "indices differ" in proc.stderr
