"""KV manager: C++ (torch.classes.ukv.KvManager) vs the pure-Python model, side by side.

Two workloads, same calls on both implementations:

- decode step: 256 decoding sequences; one step is append(ids, 1) (block
  growth and window freeing) + stage(ids) (the staged tables), then
  commit_decode(ids, 1 each, tokens). The C++ side gets prebuilt tensors, as
  an engine's hot path would pass them.
- admission wave: 256 requests sharing a 4-block system prompt (4 prefix-hit
  blocks each, SWA tail present) plus a unique tail, allocate() each.

And, C++ only, the host cost of draining KV events: take_events() after
prefills that published 1,000 events (stored compress blocks and SWA pages
of 128 tokens each), records built included.

Run: python benchmarks/bench_manager.py [--out FILE]  (prints a markdown table)
"""
import argparse
import os
import random
import statistics
import time

import torch

import ukv_torch
from ukv_torch.testing.kv_manager_model import KvManagerModel

NUM_SEQS = 256
BS = 128
CONFIG = dict(num_logical_blocks=NUM_SEQS * 12, num_swa_blocks=NUM_SEQS * 4 + 64, block_size=BS, window=128,
              mtp_k=0, max_num_seqs=NUM_SEQS, max_blocks_per_seq=32)


def fresh(rng, n):
    return [rng.randrange(1, 1 << 20) for _ in range(n)]


def prompts(rng):
    system = fresh(rng, 4 * BS)
    return system, [system + fresh(rng, 100) for _ in range(NUM_SEQS)]


def warm_system_prompt(m, system):
    """One request prefilled block by block, so the system prompt's SWA blocks are fully written."""
    m.allocate(10**6, system + [1])
    for _ in range(4):
        m.ensure_for_tokens([10**6], [BS])
        m.commit_prefill([10**6], [BS])
    m.deallocate([10**6])


def decoding_batch(m, rng):
    system, reqs = prompts(rng)
    warm_system_prompt(m, system)
    for sid, toks in enumerate(reqs):
        cached = m.allocate(sid, toks)
        n = len(toks) - cached
        m.ensure_for_tokens([sid], [n])
        m.commit_prefill([sid], [n], [7])
    return list(range(NUM_SEQS))


def time_steps(step, steps):
    """Median microseconds per call of step() over `steps` calls."""
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def bench_decode_cpp(steps):
    m = ukv_torch.KvManager(**CONFIG)
    ids = decoding_batch(m, random.Random(1))
    obj = m.torch_object
    ids_t = torch.tensor(ids, dtype=torch.int64)
    ones = torch.ones(NUM_SEQS, dtype=torch.int64)
    toks = torch.full((NUM_SEQS,), 9, dtype=torch.int32)
    obj.stage(ids_t)  # steady state: rows already hold these sequences

    def append_stage():
        obj.append(ids_t, 1)
        obj.stage(ids_t)

    def commit():
        obj.commit_decode(ids_t, ones, toks)

    a = c = 0.0
    results = []
    for _ in range(steps):
        t0 = time.perf_counter()
        append_stage()
        t1 = time.perf_counter()
        commit()
        t2 = time.perf_counter()
        results.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6))
    m.check_invariants()
    a = statistics.median(r[0] for r in results)
    c = statistics.median(r[1] for r in results)
    return a, c


def bench_decode_model(steps):
    m = KvManagerModel(**CONFIG)
    ids = decoding_batch(m, random.Random(1))
    width = CONFIG["max_blocks_per_seq"]
    rows = [[[0] * width for _ in range(2 + m.num_types)] for _ in range(NUM_SEQS)]
    ones, toks = [1] * NUM_SEQS, [9] * NUM_SEQS
    results = []
    for _ in range(steps):
        t0 = time.perf_counter()
        m.append(ids, 1)
        m.stage_rows(ids, rows)
        t1 = time.perf_counter()
        m.commit_decode(ids, ones, toks)
        t2 = time.perf_counter()
        results.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6))
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


def bench_admission(make, waves, as_tensor):
    """Median microseconds per allocate() of a prefix-hit request, over waves of 256."""
    m = make()
    system, reqs = prompts(random.Random(2))
    warm_system_prompt(m, system)
    reqs = [torch.tensor(r, dtype=torch.int32) for r in reqs] if as_tensor else reqs
    per_request = []
    for _ in range(waves):
        t0 = time.perf_counter()
        for sid, toks in enumerate(reqs):
            assert m.allocate(sid, toks) == 4 * BS
        per_request.append((time.perf_counter() - t0) * 1e6 / NUM_SEQS)
        m.deallocate(list(range(NUM_SEQS)))
    return statistics.median(per_request)


def bench_take_events(rounds, events=1000):
    """Median microseconds of one take_events() call draining `events` stored events."""
    rng = random.Random(3)
    times = []
    for _ in range(rounds):
        m = ukv_torch.KvManager(**CONFIG)
        for sid in range(events // 8):  # 4-block prompts by blocks: each block and its page published
            m.allocate(sid, fresh(rng, 4 * BS + 1))
            for _ in range(4):
                m.ensure_for_tokens([sid], [BS])
                m.commit_prefill([sid], [BS])
        t0 = time.perf_counter()
        drained = m.take_events()
        times.append((time.perf_counter() - t0) * 1e6)
        assert len(drained) == events, len(drained)
    return statistics.median(times)


def lscpu_summary():
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--steps", type=int, default=300, help="C++ decode steps (the model runs a fifth)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpp_append, cpp_commit = bench_decode_cpp(args.steps)
    py_append, py_commit = bench_decode_model(max(20, args.steps // 5))
    cpp_admit = bench_admission(lambda: ukv_torch.KvManager(**CONFIG), 20, True)
    py_admit = bench_admission(lambda: KvManagerModel(**CONFIG), 3, False)
    rows = [
        ("decode step: append + window free + stage", cpp_append, py_append),
        ("decode step: commit_decode", cpp_commit, py_commit),
        ("decode step: total", cpp_append + cpp_commit, py_append + py_commit),
        ("admission with 4 prefix-hit blocks (per request)", cpp_admit, py_admit),
    ]
    lines = [f"{NUM_SEQS} sequences, block_size {BS}, window 128; median us; {lscpu_summary()}; torch {torch.__version__}",
             "", "| workload | C++ (us) | Python model (us) | speedup |", "|---|---|---|---|"]
    lines += [f"| {name} | {c:.1f} | {p:.1f} | {p / c:.0f}x |" for name, c, p in rows]
    lines += ["", f"take_events() draining 1,000 stored events of 128 tokens: {bench_take_events(20):.0f} us"]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
