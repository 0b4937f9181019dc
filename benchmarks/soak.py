"""Soak: a long randomized serving run on the allocator (ukv_torch/testing/allocator_soak.py)
through the batch APIs of torch.classes.ukv.Coordinator, with the invariant
checker sampled throughout. Fails unless every row is free at the end; prints
the operations, wall time and the process RSS after warm-up, at the middle and
at the end (flat RSS: nothing leaks per operation).

    python benchmarks/soak.py [--ops 10000000] [--seed 0] [--check-every 100000]
"""
import argparse
import os
import platform

import torch

from ukv_torch.testing.allocator_soak import run_soak

MIB = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-every", type=int, default=100_000)
    args = parser.parse_args()
    r = run_soak(args.ops, args.seed, args.check_every)
    rss = r["rss"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"operations {r['ops']:,} in {r['seconds']:.1f} s ({r['seconds'] / r['ops'] * 1e9:.0f} ns/op), "
          f"{r['steps']:,} steps, {r['checks']} invariant checks")
    print(f"admission refusals {r['refusals']:,}, preemptions {r['preemptions']:,}, borrows {r['borrows']:,}, "
          f"SWA evictions {r['evictions']:,}")
    print(f"RSS MiB: start {rss['start'] / MIB:.1f}, middle {rss['middle'] / MIB:.1f}, end {rss['end'] / MIB:.1f} "
          f"(growth {(rss['end'] - rss['start']) / MIB:+.2f})")
    print("all rows free at the end: yes")


if __name__ == "__main__":
    main()
