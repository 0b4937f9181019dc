"""KV tier throughput: saving and loading a prefix's tier objects through
pinned host memory, against a pinned copy of the same bytes in the same run;
the host time per block; and a decode step's time with saves in flight.

    python benchmarks/bench_tiers.py [--device cuda|cpu] [--prefixes 32768,131072] [--repeats 5] [--json]

The model is DeepSeek-V4-Pro (62 layers, fp8 latent rows, bf16 RoPE, the CSA
indexer), the layout the row space with 32-token pages. A prefix is prefilled
in 8,192-token chunks (no model runs: the KV is whatever the rows hold) with
a TierCache over a HostTier saving every published block (the host time of
each chunk's save() is the host cost per block); "save" is then the whole
prefix saved again into an empty tier, from save() until every object is in
the tier (flush): the throughput of saves back to back, "load" a fresh
manager's admission of the same prompt until its rows are written (admit:
find, copy to the GPU, write the rows once the copies land, verify there; then
the first chunk staged, as an engine's step does), the prompt given as the
int64 tensor the manager takes ("load_gbps_list_prompt": given as a list of
ints, whose conversion any admission pays, with a tier or without). Bytes are the objects' (headers
included). Each figure is the median of --repeats timed runs after an unmeasured one of the same (a
process's first save and load also take their device and pinned buffers from the driver), each run
with the garbage collector collected before and held off during it (freeing an earlier run's
page-locked buffers unregisters them, which waits for the device: an engine's steady state makes
and frees no TierCache). The reference copies the same number of bytes between one pinned host buffer and
the GPU; "arena_*_gbps" copies them into a HostTier arena as large as the saves' (the
one the in-flight saves filled) and out of the one the loads read (where an arena's pages
lie can make its copies slower than a fresh buffer's). The decode step is a stand-in of fixed GPU work
(bf16 matmuls), timed with CUDA events over --steps steps, alone and while
the saves of a whole prefix are in flight on the side stream.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
from typing import List, NamedTuple

import torch

from ukv_torch import KvManager, ServeConfig, allocate_unified_kv, apply_row_copies, plan_kv_layout
from ukv_torch.manager.kv_manager import token_tensor
from ukv_torch.plan.planning import MODEL_PRESETS
from ukv_torch.tiers import HostTier, ObjectLayout, TierCache

BS, CHUNK = 128, 8192


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def setup(prefix: int, device):
    config = ServeConfig(layout="row_space", window=128, block_size=BS, compress_ratios=(4, 128), max_num_seqs=4,
                         max_num_batched_tokens=CHUNK, max_blocks_per_seq=prefix // BS + 2, swa_sizing="step",
                         swa_page_tokens=32)
    ratios = MODEL_PRESETS["v4-pro"]
    sizes = ObjectLayout(plan_kv_layout(1 << 30, ratios, config))
    # Room for the prefix, with slack for the whole-chunk SWA reserve a tier turns on (a chunk of SWA pages).
    budget = int((prefix // BS + 64) * sizes.object_bytes(0) * 1.25) + (1 << 30)
    plan = plan_kv_layout(budget, ratios, config)
    kv = allocate_unified_kv(plan, dtype=torch.uint8, device=device)
    return plan, kv


def prefill(mgr, kv, tiers, seq_id, tokens, timings):
    cached = tiers.admit(mgr, seq_id, tokens)
    events = []
    while cached < len(tokens):
        chunk = min(CHUNK, len(tokens) - cached)
        mgr.ensure_for_tokens([seq_id], [chunk])
        mgr.stage([seq_id])
        if kv.planes:
            apply_row_copies(list(kv.planes), mgr.row_copies, mgr.row_copy_counts)
        mgr.commit_prefill([seq_id], [chunk], [1] if cached + chunk == len(tokens) else [-1])
        step_events = mgr.take_events()
        events += step_events
        t0 = time.perf_counter()
        tiers.save(mgr, step_events)  # host work only: the copies run on the side stream
        timings["save_host_s"] += time.perf_counter() - t0
        tiers.flush()
        cached += chunk
    return events


@contextlib.contextmanager
def quiet():
    """A timed run with no garbage collection in it (see the module docstring)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pinned_copy_gbps(nbytes: int, device, to_device: bool, repeats: int, host=None) -> float:
    """A copy of ``nbytes`` between pinned host memory (a fresh buffer, or the first bytes of
    ``host``) and the device."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda") if host is None else host[:nbytes]
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if to_device else (dev, host)
    dst.copy_(src, non_blocking=True)  # warm-up
    seconds = []
    for _ in range(repeats):
        with quiet():
            sync(device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            sync(device)
            seconds.append(time.perf_counter() - t0)
    return nbytes / statistics.median(seconds) / 1e9


def load_first_chunk(mgr, kv, loader, prompt) -> int:
    """The load bench_tiers times: ``loader.admit`` of ``prompt`` (find, copy, write the rows, verify:
    it waits for the copy), then the first chunk staged, as an engine's step does; the cached tokens."""
    cached = loader.admit(mgr, 1, prompt)
    mgr.ensure_for_tokens([1], [min(CHUNK, len(prompt) - cached)])
    mgr.stage([1])
    if kv.planes:
        apply_row_copies(list(kv.planes), mgr.row_copies, mgr.row_copy_counts)
    return cached


def time_load(plan, kv, backends, staging: int, prompt, device, repeats: int):
    """A fresh manager's admission of ``prompt`` through the tiers until its rows are written, and
    its first chunk staged: (seconds, host seconds, cached tokens, bytes loaded), the medians of
    ``repeats`` runs after an unmeasured one; one TierCache for all, as an engine has one (its
    streams' device memory is then cached, as in an engine's steady state)."""
    loader = TierCache(plan, kv, backends, staging_bytes=staging)
    load_s, host_s = [], []
    for run in range(1 + repeats):
        mgr = KvManager(plan, device=device if device.type == "cuda" else None)
        before = loader.stats()["loaded_bytes"]
        with quiet():
            sync(device)
            t0 = time.perf_counter()
            cached = load_first_chunk(mgr, kv, loader, prompt)
            host = time.perf_counter() - t0
            sync(device)
            if run:
                load_s.append(time.perf_counter() - t0)
                host_s.append(host)
        mgr.deallocate([1])
    return statistics.median(load_s), statistics.median(host_s), cached, loader.stats()["loaded_bytes"] - before


def decode_steps_ms(device, steps: int) -> float:
    """Mean time of a stand-in decode step (fixed matmul work), CUDA events."""
    n = 4096 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(steps):
            a @ a
        return (time.perf_counter() - t0) / steps * 1e3
    for _ in range(4):  # warm-up: the first matmuls pick and load their kernels
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        for _ in range(4):
            a @ a
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


class Saved(NamedTuple):
    """A prefix prefilled with a TierCache saving every published block into a HostTier."""
    plan: object
    kv: object
    tokens: List[int]
    staging: int       # staging bytes: the whole prefix's objects (it bounds a load's length)
    tier_bytes: int    # a tier's capacity: three times that
    saver: TierCache
    mgr: KvManager     # the manager that prefilled it (the sequence is 0)
    events: list       # the KV events of the prefill
    save_host_s: float  # the host time of the prefill's save() calls


def saved_prefix(prefix: int, device) -> Saved:
    plan, kv = setup(prefix, device)
    tokens = torch.randint(0, 100000, (prefix + 1,), generator=torch.Generator().manual_seed(prefix)).tolist()
    sizes = ObjectLayout(plan)
    staging = (prefix // BS + 2) * (sizes.object_bytes(0) + sizes.object_bytes(1))
    saver = TierCache(plan, kv, [HostTier(3 * staging)], staging_bytes=staging)
    timings = dict(save_host_s=0.0)
    mgr = KvManager(plan, device=device if device.type == "cuda" else None)
    events = prefill(mgr, kv, saver, 0, tokens, timings)
    return Saved(plan, kv, tokens, staging, 3 * staging, saver, mgr, events, timings["save_host_s"])


def run_prefix(prefix: int, device, steps: int, repeats: int) -> dict:
    plan, kv, tokens, staging, tier_bytes, saver, mgr, events, save_host_s = saved_prefix(prefix, device)
    # The whole prefix saved again, into an empty tier: saves back to back. Once unmeasured first, as an
    # engine's steady state is: the first save of a process also pays for the device and pinned memory
    # its buffers take from the driver (on an H100 host about half the save's time).
    mgr.stage([0])
    save_runs = []
    for run in range(1 + repeats):
        again = TierCache(plan, kv, [HostTier(tier_bytes)], staging_bytes=staging)
        with quiet():
            sync(device)
            t0 = time.perf_counter()
            again.save(mgr, events)
            again.flush()
            sync(device)
            if run:
                save_runs.append(time.perf_counter() - t0)
        saved = again.stats()
        del again
    save_s = statistics.median(save_runs)
    # Load: a fresh manager over the same tier (and the same tensors: the rows are written again), the prompt
    # as the int64 tensor the manager takes, and as a list (whose conversion any admission pays, tier or not).
    load_s, load_host_s, cached, load_bytes = time_load(plan, kv, saver.backends, staging, token_tensor(tokens), device,
                                                        repeats)
    load_list_s = time_load(plan, kv, saver.backends, staging, tokens, device, repeats)[0]
    # Decode steps alone, then with the whole prefix's saves in flight (into an empty tier).
    alone = decode_steps_ms(device, steps)
    busy_tier = TierCache(plan, kv, [HostTier(tier_bytes)], staging_bytes=int(saved["saved_bytes"] * 1.2) + (64 << 20))
    busy_tier.save(mgr, events)
    in_flight = decode_steps_ms(device, steps)
    busy_tier.flush()
    # The reference copies again, between the device and the tiers' own page-locked arenas (HostTier
    # lends its buffer: peek), which may lie elsewhere in the host's memory than a fresh pinned buffer.
    load_arena = saver.backends[0].peek([])[0]
    save_arena = busy_tier.backends[0].peek([])[0]
    save_bytes = saved["saved_bytes"]
    blocks = prefix // BS
    return {
        "prefix_tokens": prefix, "repeats": repeats, "objects_saved": saved["saved_objects"], "saved_bytes": save_bytes,
        "save_gbps": round(save_bytes / save_s / 1e9, 3),
        "pinned_d2h_gbps": round(pinned_copy_gbps(save_bytes, device, False, repeats), 3),
        "loaded_tokens": cached, "loaded_bytes": load_bytes, "load_gbps": round(load_bytes / load_s / 1e9, 3),
        "load_gbps_list_prompt": round(load_bytes / load_list_s / 1e9, 3),
        "pinned_h2d_gbps": round(pinned_copy_gbps(load_bytes, device, True, repeats), 3),
        "arena_d2h_gbps": round(pinned_copy_gbps(save_bytes, device, False, repeats, host=save_arena), 3),
        "arena_h2d_gbps": round(pinned_copy_gbps(load_bytes, device, True, repeats, host=load_arena), 3),
        "host_us_per_block_saved": round(save_host_s / blocks * 1e6, 1),
        "host_us_per_block_loaded": round(load_host_s / max(1, cached // BS) * 1e6, 1),
        "decode_step_ms": round(alone, 4), "decode_step_ms_saves_in_flight": round(in_flight, 4),
        "decode_slowdown": round(in_flight / alone - 1, 4),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prefixes", default="32768,131072", help="prefix lengths in tokens, comma-separated")
    ap.add_argument("--steps", type=int, default=50, help="decode steps timed per case")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per figure (their median)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    device = torch.device(args.device)
    rows = [run_prefix(int(p), device, args.steps, args.repeats) for p in args.prefixes.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.json:
        print(json.dumps({"device": name, "rows": rows}))
        return
    print(f"device: {name}")
    for r in rows:
        print(f"{r['prefix_tokens']:>7} tokens: save {r['save_gbps']} GB/s (pinned D2H {r['pinned_d2h_gbps']}), "
              f"load {r['load_gbps']} GB/s ({r['load_gbps_list_prompt']} from a list; "
              f"pinned H2D {r['pinned_h2d_gbps']}; from and to the tiers' arenas: D2H {r['arena_d2h_gbps']}, "
              f"H2D {r['arena_h2d_gbps']}), "
              f"host {r['host_us_per_block_saved']} "
              f"/ {r['host_us_per_block_loaded']} us per block saved / loaded, decode step {r['decode_step_ms']} ms "
              f"alone, {r['decode_step_ms_saves_in_flight']} ms with saves in flight "
              f"({r['decode_slowdown'] * 100:+.1f}%)")


if __name__ == "__main__":
    main()
