"""Disaggregated transfer (ukv_torch.disagg) against the raw transfer engine
moving the same bytes, in the same run, between two processes on loopback.

One V4-Pro sequence of 32K and of 128K tokens (MODEL_PRESETS["v4-pro"]:
fp8 NoPE, bf16 RoPE, CSA indexer) goes from a prefill pool (row space) to a
decode pool (elastic) in another process, which frees it after each arrival
and forgets its cache, so every round moves every byte. "Raw" writes the same
number of bytes from one contiguous registered buffer into one of the
receiver's, with the same slicing and batching (TransferEndpoint.write).
Rounds alternate raw and ukv_torch. Each transferred sequence is checked:
the receiver's gather_sequence of it must hash like the sender's. Three ways:
"staged" (both sides with a registered buffer as large as the largest
sequence: the sender gathers piece k + 1 while piece k is written, the
receiver scatters piece k while k + 1 lands, each using its buffer where
its rows are short), "staged 64 MiB" (the same through buffers smaller than
either sequence, the pieces going through them in turn) and "direct" (every
row written straight into the receiver's rows: in the row space ~150
requests of a few KiB per block, which TCP moves at ~17K a second).

Reports, medians over the rounds: GB/s of the whole send (offer to
acknowledgement) and of its write phase, beside raw; host cost per sequence
on each side (describing, checking and joining rows; admitting and staging).
The % of raw is the median of each round's own ratio (its send against the
raw write just before it), so a drift of the host's speed between rounds,
which on a small VM moves raw by 1.5x, cancels out. "Cores busy": the
host's CPU time (every process, from /proc/stat) over the wall time of the
raw write and of the send. Over loopback TCP the transfer engine's own
copies take most of a small host's cores, and a staged send adds a gather
and a scatter of every byte: where raw keeps nearly all cores busy, the
send's time is bounded by its CPU time over the cores, not by the engine.

With --device cuda both pools' KV is on the GPU (two processes sharing it):
every piece is gathered on the GPU into the sender's device mirror of its
staging, copied to the page-locked staging the transfer engine reads, and on
the receiver copied from its staging to the device and scattered there; raw
still moves host buffers, so the ratio prices those copies.

Run: python benchmarks/bench_disagg.py [--rounds N] [--modes staged,staged64,direct] [--device cuda] [--json]
(prints a markdown table; --json: one JSON object with the host's CPU count and the rows' figures).
On a host without network, benchmarks/offline_mooncake.sh brings Mooncake from carried files.
"""
import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from ukv_torch import (KvManager, MODEL_PRESETS, ModelKvSpec, ServeConfig, allocate_unified_kv, apply_row_copies,
                       gather_sequence, plan_kv_layout, transfer_bytes)
from ukv_torch.disagg import Arrival, Channel, KvReceiver, KvSender, TransferEndpoint

TOKENS = (32 * 1024, 128 * 1024)
#: each mode's staging_bytes on both sides (None: the largest sequence's bytes)
MODES = {"staged": None, "staged64": 64 << 20, "direct": 0}
LABELS = {"staged": "staged", "staged64": "staged 64 MiB", "direct": "direct"}
MAX_TOKENS = max(TOKENS) + 256


def busy_seconds() -> float:
    """The CPU time every process of the host has used so far, in seconds (Linux's /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def side(layout: str, device: str):
    config = ServeConfig(layout=layout, window=128, max_num_seqs=2, max_num_batched_tokens=8192,
                         max_blocks_per_seq=MAX_TOKENS // 128 + 2, swa_page_tokens=64 if layout == "row_space" else 0)
    model = ModelKvSpec(layer_ratios=MODEL_PRESETS["v4-pro"])
    plan = plan_kv_layout(1 << 30, model, config)
    kv = allocate_unified_kv(plan, device=device)
    return plan, kv, manager(plan, kv)


def manager(plan, kv) -> KvManager:
    device = kv.kv[0].device
    return KvManager(plan, device=device if device.type != "cpu" else None)


def digest(plan, kv, mgr, seq_id) -> str:
    export = mgr.describe_sequence(seq_id)
    buffer = torch.empty(transfer_bytes(plan, kv, export), dtype=torch.uint8, device=kv.kv[0].device)
    gather_sequence(plan, kv, export, buffer, manager=mgr)
    return hashlib.blake2b(buffer.cpu().numpy(), digest_size=16).hexdigest()


def receiver_process(report_port: int, mode: str, device: str) -> None:
    """The decode side: prints where it listens, then serves until told to stop."""
    plan, kv, mgr = side("elastic", device)
    endpoint, raw = endpoint_and_raw_buffer(plan, kv)
    receiver = KvReceiver(mgr, plan, kv, endpoint, timeout_s=120, staging_bytes=staging_bytes(mode, raw))
    report_to = None
    print("READY", *receiver.address, endpoint.name, raw.data_ptr(), flush=True)
    while True:
        for event in receiver.poll(0.05):
            assert isinstance(event, Arrival), event
            report_to = report_to or Channel.connect(("127.0.0.1", report_port), 30)
            report_to.send(dict(digest=digest(plan, kv, mgr, event.seq_id), host=receiver.host_seconds))
            receiver.host_seconds = 0.0
            mgr.deallocate(event.seq_id)
            mgr.clear_cache()
        if report_to is not None and report_to.ready(0):  # told to stop
            return


def staging_bytes(mode: str, raw) -> int:
    return raw.numel() if MODES[mode] is None else MODES[mode]


def prefill(plan, kv, mgr, seq_id, prompt) -> None:
    """The prompt in chunks of a step's token budget, the row space's moves applied each step."""
    assert mgr.allocate(seq_id, prompt) == 0
    step = plan.config.max_num_batched_tokens
    for start in range(0, len(prompt), step):
        n = min(step, len(prompt) - start)
        mgr.ensure_for_tokens([seq_id], [n])
        mgr.stage([seq_id])
        mgr.upload(1)
        if kv.planes:
            apply_row_copies(list(kv.planes), mgr.row_copies, mgr.row_copy_counts)
        mgr.commit_prefill([seq_id], [n])
    mgr.commit_prefill([seq_id], [0], [5])


def endpoint_and_raw_buffer(plan, kv):
    """A transfer engine and, registered with it, a buffer for the raw writes (the largest sequence's bytes)."""
    endpoint = TransferEndpoint()
    raw = torch.zeros(max_bytes(plan, kv), dtype=torch.uint8)
    endpoint.register([(raw.data_ptr(), raw.numel())])
    return endpoint, raw


def max_bytes(plan, kv) -> int:
    """Bytes of the largest sequence's transfer."""
    mgr = manager(plan, kv)
    prefill(plan, kv, mgr, 0, list(range(max(TOKENS))))
    return transfer_bytes(plan, kv, mgr.describe_sequence(0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", help="of " + ", ".join(MODES) + ", comma-separated (default: all, or all staged "
                        "ones with --device cuda)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--device", default="cpu", help="where both sides' KV is (cuda: through host staging)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    modes = args.modes.split(",") if args.modes else [mode for mode in MODES if args.device == "cpu" or MODES[mode] != 0]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes must name modes of {', '.join(MODES)}, got {', '.join(unknown)}")
    if args.device != "cpu" and "direct" in modes:
        parser.error("--modes: KV on a GPU goes through host staging, so it has no direct mode")
    plan, kv, mgr = side("row_space", args.device)
    for t in kv.planes:  # random bytes, so a row in the wrong place shows in the digest
        t.view(torch.uint8).random_(0, 256, generator=torch.Generator(device=t.device).manual_seed(t.numel()))
    rows = [row for mode in modes for row in run(plan, kv, mgr, mode, args.rounds, args.device)]
    if args.json:
        print(json.dumps(dict(cpus=os.cpu_count(), processor=platform.processor() or platform.machine(),
                              mooncake=mooncake_version(), device=args.device, rounds=args.rounds, rows=rows)))
        return
    lines = ["| rows | sequence | MiB | send GB/s | write GB/s | raw GB/s | send % of raw | write % of raw | "
             "sender host ms | receiver host ms | send ms | cores busy: raw / send |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {LABELS[r['mode']]} | {r['tokens'] // 1024}K tokens | {r['mib']:.0f} | {r['send_gbps']:.2f} | "
                     f"{r['write_gbps']:.2f} | {r['raw_gbps']:.2f} | {r['send_pct_of_raw']:.0f}% | "
                     f"{r['write_pct_of_raw']:.0f}% | {r['sender_host_ms']:.1f} | {r['receiver_host_ms']:.1f} | "
                     f"{r['send_ms']:.0f} | {r['raw_cores_busy']:.2f} / {r['send_cores_busy']:.2f} of {os.cpu_count()} |")
    print("\n".join(lines))


def mooncake_version() -> str:
    for name in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def run(plan, kv, mgr, mode: str, rounds: int, device: str):
    reports = socket.create_server(("127.0.0.1", 0))
    peer = subprocess.Popen([sys.executable, __file__, "--receiver", str(reports.getsockname()[1]), mode, device],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = []
    try:
        _, host, port, engine_name, raw_address = peer.stdout.readline().split()
        endpoint, raw = endpoint_and_raw_buffer(plan, kv)
        alive = Channel.connect((host, int(port)), 30)
        sender = KvSender(mgr, plan, kv, endpoint, timeout_s=120, staging_bytes=staging_bytes(mode, raw))
        reports_channel = None
        rng = np.random.default_rng(0)
        for tokens in TOKENS:
            sends, writes, raws, sender_host, receiver_host, raw_cores, send_cores = [], [], [], [], [], [], []
            for r in range(rounds):
                seq_id = len(sends) + 100 * r
                prompt = rng.integers(0, 32000, tokens).tolist()
                prefill(plan, kv, mgr, seq_id, prompt)
                expected = digest(plan, kv, mgr, seq_id)
                nbytes = transfer_bytes(plan, kv, mgr.describe_sequence(seq_id))
                alive.ping(30)  # a raw write's handshake, like a send's, follows the receiver's answer to a ping
                endpoint.mark_alive(engine_name)
                busy, started = busy_seconds(), time.perf_counter()
                assert endpoint.write(engine_name, np.array([[raw.data_ptr(), int(raw_address), nbytes]]))
                elapsed = time.perf_counter() - started
                raws.append(nbytes / elapsed)
                raw_cores.append((busy_seconds() - busy) / elapsed)
                busy, started = busy_seconds(), time.perf_counter()
                result = sender.send(seq_id, (host, int(port)))
                elapsed = time.perf_counter() - started
                send_cores.append((busy_seconds() - busy) / elapsed)
                assert result.status == "sent" and result.nbytes == nbytes, result
                reports_channel = reports_channel or Channel(reports.accept()[0])
                report = reports_channel.receive(120)
                assert report["digest"] == expected, "the receiver's bytes differ"
                sends.append(nbytes / elapsed)
                writes.append(nbytes / result.write_seconds)
                sender_host.append(result.host_seconds)
                receiver_host.append(report["host"])
            m = statistics.median
            rows.append(dict(mode=mode, tokens=tokens, mib=round(nbytes / 2**20, 1),
                             send_gbps=round(m(sends) / 1e9, 3), write_gbps=round(m(writes) / 1e9, 3),
                             raw_gbps=round(m(raws) / 1e9, 3),
                             send_pct_of_raw=round(100 * m([s / r for s, r in zip(sends, raws)]), 1),
                             write_pct_of_raw=round(100 * m([w / r for w, r in zip(writes, raws)]), 1),
                             sender_host_ms=round(1e3 * m(sender_host), 2),
                             receiver_host_ms=round(1e3 * m(receiver_host), 2),
                             send_ms=round(1e3 * nbytes / m(sends), 1),
                             raw_cores_busy=round(m(raw_cores), 2), send_cores_busy=round(m(send_cores), 2)))
        reports_channel.send(dict(stop=True))
        alive.close()
        sender.close()
        endpoint.close()
    finally:
        try:
            peer.wait(60)
        except subprocess.TimeoutExpired:
            peer.kill()
        reports.close()
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        receiver_process(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
