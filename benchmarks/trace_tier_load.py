"""Where a KV tier load's time goes: bench_tiers.py's "load", step by step.

A fresh manager admits a prefix a host tier holds (bench_tiers.py's model,
layout and prefill) through TierCache.admit, then stages its first chunk, as
the benchmark's load does. This stamps on the host when each step of the load
starts and ends (perf_counter), and on the GPU when each read's copies landed
(timing events in place of the load's own) and when the device work each
of DEVICE_STEPS queued was done (a timing event recorded after the call, on
the stream it queued on), in microseconds from admit's start: medians of
--repeats runs after two unmeasured ones. Beside them, the
floor: a pinned copy of the same bytes to the GPU, in the same run.

The steps: the span (the HBM hit and the manager's bound: two can_allocate),
the fetch's setup, the reads (each one's lookup, its copy plan, its copies
queued, then landed on the GPU), the tail's
read, the verification queued, the claim (allocate), the rows' writes (each
scatter: its run lists, their upload, and each copy call), the verification's
answer, the bookkeeping of the loaded objects, the staging given back, and the
first chunk staged.
A load is at the copy's speed when the host's steps end before the last copy
lands and the steps after it are short.

    python benchmarks/trace_tier_load.py [--device cuda|cpu] [--prefix 32768] [--repeats 7]
"""
import argparse
import collections
import contextlib
import gc
import statistics
import time

import torch

import bench_tiers
from ukv_torch import KvManager
from ukv_torch.manager.kv_manager import token_tensor
from ukv_torch.tiers import ObjectLayout, TierCache
from ukv_torch.tiers import cache, fetch, objects
from ukv_torch.tiers.fetch import ObjectFetch

#: the steps stamped: (class or module, function); within the reads, the fetch's setup, each lookup and
#: each read's copy plan (its copies are queued between that and "copies queued"); within a scatter, its
#: run lists (per compress ratio), their upload and each copy call
STEPS = [(TierCache, "admit"), (TierCache, "_span"), (KvManager, "can_allocate"), (ObjectFetch, "__init__"),
         (TierCache, "_read_held"), (TierCache, "_present"), (fetch, "merged_copies"), (ObjectFetch, "read_tail"),
         (ObjectFetch, "start_verify"), (KvManager, "allocate"), (TierCache, "_write_rows"), (ObjectLayout, "scatter"),
         (ObjectLayout, "_block_runs"), (ObjectLayout, "_tail_runs"), (ObjectLayout, "_upload_runs"),
         (objects, "scatter_rows"), (ObjectFetch, "finish_verify"), (TierCache, "_took"), (ObjectFetch, "close")]
#: the steps whose device work is stamped too: the verification, the run lists' and the tables' uploads, the
#: write stream's wait for the copies, the admission's row copies and each scatter call
DEVICE_STEPS = [(ObjectLayout, "verify"), (ObjectLayout, "_upload_runs"), (KvManager, "upload"), (ObjectFetch, "wait"),
                (cache, "apply_row_copies"), (objects, "scatter_rows")]


@contextlib.contextmanager
def stamped(stamps: list, cuda: bool, landed: list):
    """Within it, each step's calls append (name, "starts", t) and (name, "ends", t) to
    ``stamps``; on CUDA each read's landing event is a timing one, kept in ``landed`` as
    ("read", event), and each of DEVICE_STEPS records one after its call, kept as (name, event)."""
    every = dict.fromkeys(STEPS + DEVICE_STEPS + [(ObjectFetch, "_recorded")])
    originals = [(cls, name, cls.__dict__[name]) for cls, name in every]

    def wrapped(name, method):
        def call(*args, **kwargs):
            stamps.append((name, "starts", time.perf_counter()))
            try:
                return method(*args, **kwargs)
            finally:
                stamps.append((name, "ends", time.perf_counter()))
        return call

    def on_device(name, method):
        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            finally:
                event = torch.cuda.Event(enable_timing=True)
                event.record()  # on the stream the call queued on (the current one)
                landed.append((name, event))
        return call

    def timed_event():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        landed.append(("read", event))
        stamps.append(("read", "copies queued", time.perf_counter()))
        return event

    try:
        for cls, name in STEPS:
            setattr(cls, name, wrapped(name, cls.__dict__[name]))
        if cuda:
            for cls, name in DEVICE_STEPS:
                setattr(cls, name, on_device(name, cls.__dict__[name]))
            ObjectFetch._recorded = staticmethod(timed_event)
        yield
    finally:
        for cls, name, method in originals:
            setattr(cls, name, method)


def load_once(plan, kv, loader, prompt, device, stamps, landed):
    """One load as bench_tiers.time_load makes it: (host stamps, device landing times), in
    microseconds from admit's start."""
    cuda = device.type == "cuda"
    mgr = KvManager(plan, device=device if cuda else None)
    stamps.clear()
    landed.clear()
    bench_tiers.sync(device)
    with bench_tiers.quiet():
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            start.record(loader.load_stream)  # idle: it runs as admit starts
        t0 = time.perf_counter()
        bench_tiers.load_first_chunk(mgr, kv, loader, prompt)
        stamps.append(("first chunk", "staged", time.perf_counter()))
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            landed.append(("first chunk", end))
        bench_tiers.sync(device)
        stamps.append(("device", "synchronized", time.perf_counter()))
    seen = collections.Counter()
    steps = {}
    for name, edge, t in stamps:
        seen[name, edge] += 1
        steps[f"{name} #{seen[name, edge]} {edge}"] = (t - t0) * 1e6
    done = collections.Counter()
    for name, event in landed:
        done[name] += 1
        what = f"read {done[name]}'s copies landed" if name == "read" else f"{name} #{done[name]} done"
        steps[f"GPU: {what}"] = start.elapsed_time(event) * 1e3
    mgr.deallocate([1])
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prefix", type=int, default=32768, help="prefix length in tokens")
    ap.add_argument("--repeats", type=int, default=7, help="timed loads (their medians)")
    args = ap.parse_args()
    if args.repeats < 1 or args.prefix < 2 * bench_tiers.BS:
        ap.error(f"--repeats must be >= 1 and --prefix >= {2 * bench_tiers.BS}")
    device = torch.device(args.device)
    saved = bench_tiers.saved_prefix(args.prefix, device)
    plan, kv = saved.plan, saved.kv
    loader = TierCache(plan, kv, saved.saver.backends, staging_bytes=saved.staging)
    prompt = token_tensor(saved.tokens)
    stamps, landed, runs = [], [], collections.defaultdict(list)
    with stamped(stamps, device.type == "cuda", landed):
        for run in range(2 + args.repeats):
            steps = load_once(plan, kv, loader, prompt, device, stamps, landed)
            for name, us in steps.items():
                if run >= 2:
                    runs[name].append(us)
    loaded = loader.stats()["loaded_bytes"] // (2 + args.repeats)
    copy_us = loaded / (bench_tiers.pinned_copy_gbps(loaded, device, True, args.repeats) * 1e9) * 1e6
    print(f"{args.prefix}-token prefix, {loaded / 2**20:.1f} MiB loaded on {device}; medians of {args.repeats} loads, "
          f"us from admit's start (a pinned copy of the bytes: {copy_us:.0f} us)")
    for name, values in sorted(runs.items(), key=lambda item: statistics.median(item[1])):
        print(f"{statistics.median(values):9.0f}  {name}")


if __name__ == "__main__":
    main()
