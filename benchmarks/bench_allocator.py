"""Allocator benchmark: the C++ core, the per-call Python API (torch class and
drop-in), the batch API and the pure-Python model, side by side in one run, on
a DeepSeek-V4-sized pool (4,096 SWA slots, 65,536 compress blocks, CSA k=32 +
HCA k=1) with the same workloads everywhere:

  * compress churn: the pool half full, each step frees a random held block
    and allocates one (ns per operation);
  * SWA churn with borrowing: CSA's own region full, each step SWA frees its
    oldest block, CSA borrows the slot (evicting it), the oldest borrowed block
    is freed once 64 are out, SWA allocates again (ns per operation);
  * batches: alloc_compress_n(n) then free_compress_many of the same ids on
    the half-full pool (ns per block operation), through the torchbind
    methods and through ukv_torch.BatchCalls (the batch API).

Each figure is the best of several repetitions (the host is shared). The core
figures come from build/core/bench_core (Google Benchmark, `make cpp-test`
builds it). Prints a markdown table and the targets (core <= 50 ns/op, batch
API within 2x of the core per block); --out FILE also writes them as markdown.

    python benchmarks/bench_allocator.py [--out FILE] [--quick]
"""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import time
from collections import deque

import torch

import ukv_torch
from ukv_torch.testing.allocator_model import CoordinatorModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: bench_core, git commit

NUM_SWA, NUM_BLOCKS, RATIOS, BLOCK_SIZE = 4096, 65536, [4, 128], 128
KS = [BLOCK_SIZE // r for r in RATIOS]  # the model's rows per compress block: 32 (CSA), 1 (HCA)
SLOTS = ukv_torch.slot_counts(NUM_SWA, NUM_BLOCKS, RATIOS, BLOCK_SIZE)
TYPE_NAMES = ["CSA", "HCA"]
BATCH_SIZES = [16, 64, 256, 1024, 4096]
CORE_TARGET_NS, BATCH_TARGET_RATIO = 50.0, 2.0


# --------------------------------------------------------------------------
# The four front ends, each wrapped to the same small interface


class TorchClass:
    label = "torch class (per call)"

    def __init__(self):
        self.c = torch.classes.ukv.Coordinator(NUM_SWA, RATIOS, SLOTS, BLOCK_SIZE)

    def fill(self, t, n):
        return self.c.alloc_compress_n(t, n).tolist()

    def ops(self, t):
        c = self.c
        return (lambda: c.alloc_compress(t)), (lambda p: c.free_compress(t, p))

    def swa_ops(self):
        c = self.c
        return c.alloc_swa, c.free_swa, c.take_evicted_swa


class DropIn:
    label = "drop-in (per call)"

    def __init__(self):
        self.c = ukv_torch.UnifiedKvCoordinator(NUM_SWA, *ukv_torch.unified_slot_counts(NUM_SWA, NUM_BLOCKS))
        self.c.set_swa_evict_cb(lambda slot: None)

    def fill(self, t, n):
        return self.c.torch_object.alloc_compress_n(t, n).tolist()

    def ops(self, t):
        c = self.c
        return ((c.alloc_csa, c.free_csa), (c.alloc_hca, c.free_hca))[t]

    def swa_ops(self):
        return self.c.alloc_swa, self.c.free_swa, lambda: None  # evictions reach the callback


class Model:
    label = "pure-Python model"

    def __init__(self):
        self.c = CoordinatorModel(NUM_SWA, KS, SLOTS, BLOCK_SIZE)

    def fill(self, t, n):
        return self.c.alloc_compress_n(t, n)

    def ops(self, t):
        c = self.c
        return (lambda: c.alloc_compress(t)), (lambda p: c.free_compress(t, p))

    def swa_ops(self):
        return self.c.alloc_swa, self.c.free_swa, self.c.take_evicted_swa


# --------------------------------------------------------------------------
# Workloads (ns per operation, best of `repeats`)


def best(repeats, run):
    return min(run() for _ in range(repeats))


def compress_churn(front_end, t, steps, repeats):
    impl = front_end()
    held = impl.fill(t, NUM_BLOCKS // 2)
    alloc, free = impl.ops(t)
    rng = random.Random(1)
    picks = [rng.randrange(len(held)) for _ in range(steps)]

    def run():
        start = time.perf_counter()
        for i in picks:
            free(held[i])
            held[i] = alloc()
        return (time.perf_counter() - start) / (2 * steps) * 1e9
    return best(repeats, run)


def swa_churn_with_borrowing(front_end, steps, repeats):
    impl = front_end()
    alloc_swa, free_swa, take_evicted = impl.swa_ops()
    swa = [alloc_swa() for _ in range(NUM_SWA // 2)]
    impl.fill(0, NUM_BLOCKS)  # CSA's own region full: later allocations borrow
    alloc, free = impl.ops(0)
    borrowed, position = deque(), [0]

    def run():
        start = time.perf_counter()
        for _ in range(steps):
            i = position[0]
            free_swa(swa[i])
            borrowed.append(alloc())
            if len(borrowed) > 64:
                free(borrowed.popleft())
            swa[i] = alloc_swa()
            position[0] = (i + 1) % len(swa)
            take_evicted()
        return (time.perf_counter() - start) / (4 * steps) * 1e9
    return best(repeats, run)


def torch_batches(t, n, steps, repeats, api="torchbind"):
    """alloc + free of n blocks per step: torchbind methods, or ukv_torch.BatchCalls
    returning new tensors ("new") or filling a persistent one ("into"). The calls
    sit in the loop itself, as in a caller's hot path."""
    torch_object = TorchClass().c
    c = torch_object if api == "torchbind" else ukv_torch.BatchCalls(torch_object)
    c.alloc_compress_n(t, NUM_BLOCKS // 2)
    out = torch.empty(n, dtype=torch.int64)
    alloc_into, alloc_n, free_many = getattr(c, "alloc_compress_into", None), c.alloc_compress_n, c.free_compress_many

    def run():
        start = time.perf_counter()
        if api == "into":
            for _ in range(steps):
                alloc_into(t, out)
                free_many(t, out)
        else:
            for _ in range(steps):
                free_many(t, alloc_n(t, n))
        return (time.perf_counter() - start) / (2 * n * steps) * 1e9
    return best(repeats, run)


def model_batches(t, n, steps, repeats):
    m = Model().c
    m.alloc_compress_n(t, NUM_BLOCKS // 2)

    def run():
        start = time.perf_counter()
        for _ in range(steps):
            m.free_compress_many(t, m.alloc_compress_n(t, n))
        return (time.perf_counter() - start) / (2 * n * steps) * 1e9
    return best(repeats, run)


def call_costs(repeats):
    """What any torchbind call costs from Python, whatever the method does:
    the method lookup on the ScriptObject and the call of a bound no-op."""
    c = TorchClass().c
    bound = c.num_swa_base
    steps = 20_000

    def timed(call):
        def run():
            start = time.perf_counter()
            for _ in range(steps):
                call()
            return (time.perf_counter() - start) / steps * 1e9
        return best(repeats, run)
    return {"lookup": timed(lambda: c.num_swa_base), "call": timed(bound)}


def marginal_per_block(per_block_at):
    """Per-block cost between the two largest batches, the fixed per-call cost removed."""
    small, large = BATCH_SIZES[-2], BATCH_SIZES[-1]
    return (per_block_at[large] * large - per_block_at[small] * small) / (large - small)


def core_figures(repeats, min_time):
    """ns per item of every bench_core benchmark, best repetition."""
    binary = os.path.join(ROOT, "build", "core", "bench_core")
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: build it with `make cpp-test`")
    out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
                          f"--benchmark_repetitions={repeats}"], capture_output=True, text=True, check=True).stdout
    figures = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") == "iteration":
            ns = 1e9 / b["items_per_second"]
            figures[b["run_name"]] = min(ns, figures.get(b["run_name"], ns))
    return figures


# --------------------------------------------------------------------------
# Report


def machine():
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit.stdout.strip() + (" (with uncommitted changes)" if dirty else ""),
        "lscpu": cpu[:10],
        "load": os.getloadavg(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def fmt(ns):
    return "—" if ns is None else (f"{ns:,.0f}" if ns >= 100 else f"{ns:.1f}")


def report(rows, targets, notes, info):
    lines = [
        f"Measured {info['date']} at commit `{info['commit']}`, torch {info['torch']}, Python {info['python']}, "
        f"load average {info['load'][0]:.2f} / {info['load'][1]:.2f} / {info['load'][2]:.2f} "
        "(best of the repetitions; the host is shared).",
        "",
        "```",
        *info["lscpu"],
        "```",
        "",
        "ns per operation (per block operation for batches); each batch step is alloc_compress_n(n) (or "
        "alloc_compress_into a persistent n-element tensor) + free_compress_many, 2n block operations.",
        "",
        "| workload | C++ core | torch class (per call) | drop-in (per call) | torchbind batch methods | "
        "BatchCalls, new tensors | batch API: BatchCalls `_into` | pure-Python model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cells in rows:
        lines.append(f"| {name} | " + " | ".join(fmt(cells.get(col)) for col in
                                                 ("core", "torch", "drop_in", "torchbind_batch", "batch_new", "batch",
                                                  "model"))
                     + " |")
    lines += ["", "| target | figure | met |", "|---|---|---|"]
    lines += [f"| {t} | {figure} | {'yes' if met else '**no**'} |" for t, figure, met in targets]
    lines += [""] + [f"- {note}." for note in notes]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the report as markdown to this file")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions (a smoke run)")
    args = parser.parse_args()
    steps, repeats, min_time = (2_000, 1, 0.02) if args.quick else (20_000, 5, 0.2)

    core = core_figures(repeats, min_time)
    rows, targets = [], []
    for t, name in enumerate(TYPE_NAMES):
        cells = {"core": core[f"BM_CompressAllocFree/type:{t}"]}
        for key, front_end in (("torch", TorchClass), ("drop_in", DropIn), ("model", Model)):
            cells[key] = compress_churn(front_end, t, steps, repeats)
        rows.append((f"{name} churn: free a random block, allocate one", cells))
    cells = {"core": core["BM_SwaChurnWithBorrowing"]}
    for key, front_end in (("torch", TorchClass), ("drop_in", DropIn), ("model", Model)):
        cells[key] = swa_churn_with_borrowing(front_end, steps // 4, repeats)
    rows.append(("SWA churn with CSA borrowing and eviction", cells))
    worst_core = max(cells["core"] for _, cells in rows)
    targets.append(("C++ core <= 50 ns/op", f"worst workload {fmt(worst_core)} ns/op", worst_core <= CORE_TARGET_NS))

    notes = []
    for t, name in enumerate(TYPE_NAMES):
        batch_at, core_at = {}, {}
        for n in BATCH_SIZES:
            batch_steps = max(10, steps * 8 // n)
            cells = {"core": core[f"BM_CompressBatch/type:{t}/n:{n}"],
                     "torchbind_batch": torch_batches(t, n, batch_steps, repeats),
                     "batch_new": torch_batches(t, n, batch_steps, repeats, api="new"),
                     "batch": torch_batches(t, n, batch_steps, repeats, api="into"),
                     "model": model_batches(t, n, max(3, batch_steps // 8), repeats)}
            rows.append((f"{name} batch of {n}, per block", cells))
            batch_at[n], core_at[n] = cells["batch"], cells["core"]
            ratio = cells["batch"] / cells["core"]
            targets.append((f"batch API within 2x of the core per block, {name} n={n}",
                            f"{ratio:.1f}x ({fmt(cells['batch'])} vs {fmt(cells['core'])} ns)",
                            ratio <= BATCH_TARGET_RATIO))
        notes.append(f"{name} batches: marginal cost per block operation {fmt(marginal_per_block(batch_at))} ns "
                     f"through the batch API, {fmt(marginal_per_block(core_at))} ns in the core")
    costs = call_costs(repeats)
    notes.append(f"Every torchbind call from Python costs {fmt(costs['call'])} ns for the call of a bound no-op "
                 f"method plus {fmt(costs['lookup'])} ns for `obj.method` (the ScriptObject attribute lookup), "
                 "whatever the method does")

    text = report(rows, targets, notes, machine())
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
