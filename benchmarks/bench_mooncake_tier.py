"""MooncakeTier put/get against raw Mooncake put/get of the same bytes, in the
same run, on a local mooncake_master over loopback TCP.

The objects are V4-Pro compress blocks (every compress layer's rows of one
128-token block plus the CSA indexer entries: 772,480 bytes), 256 of them for
a 32K-token prefix and 1,024 for a 128K-token one. "Raw" is the tier's own
Mooncake client called directly (`batch_put_from` / `batch_get_into` on the
same registered buffers), so the two differ only by the tier's own work.
Rounds alternate tier and raw; each round puts every object, gets every
object back, checks the bytes and removes the objects.

Run: python benchmarks/bench_mooncake_tier.py [--rounds N]  (prints a markdown table)
"""
import argparse
import statistics
import time

import torch

from ukv_torch import MODEL_PRESETS, ModelKvSpec, ServeConfig
from ukv_torch.tiers.mooncake import MooncakeTier
from ukv_torch.tiers.mooncake_master import MooncakeMaster

PREFIXES = {"32K": 32 * 1024, "128K": 128 * 1024}


def block_object_bytes() -> int:
    """One compress block of V4-Pro in every compress layer, with its indexer entries."""
    spec, bs = ModelKvSpec(layer_ratios=MODEL_PRESETS["v4-pro"]), ServeConfig().block_size
    row = spec.head_dim * spec.kv_elem_bytes + spec.rope_head_dim * spec.rope_elem_bytes
    return sum(bs // r * row + (spec.indexer_bytes_per_block if r == 4 else 0) for r in spec.layer_ratios if r)


def one_round(put, get, store, keys, sources, destinations, written, read):
    start = time.perf_counter()
    assert all(put(keys, sources)), "a put failed"
    middle = time.perf_counter()
    got = get(keys, destinations)
    end = time.perf_counter()
    assert all(size == sources[0].numel() for size in got), "a get failed"
    assert torch.equal(read, written), "bytes differ"
    store.batch_remove(keys, True)
    return middle - start, end - middle


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = block_object_bytes()
    largest = max(PREFIXES.values()) // ServeConfig().block_size
    rows = ["| prefix | objects | MiB | tier put GB/s | raw put GB/s | put % | tier get GB/s | raw get GB/s | get % |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with MooncakeMaster() as master:
        tier = MooncakeTier(master.master_address, master.metadata_url, largest * size + (256 << 20),
                            metrics_url=master.metrics_url)
        source = torch.randint(0, 256, (largest * size,), dtype=torch.uint8)
        destination = torch.zeros_like(source)
        tier.register_buffer(source)
        tier.register_buffer(destination)
        store = tier._store  # the same client, for the raw calls (see the module docstring)
        raw_put = lambda k, b: [c == 0 for c in store.batch_put_from(k, [t.data_ptr() for t in b], [t.numel() for t in b])]  # noqa: E731
        raw_get = lambda k, b: store.batch_get_into(k, [t.data_ptr() for t in b], [t.numel() for t in b])  # noqa: E731
        for name, tokens in PREFIXES.items():
            count = tokens // ServeConfig().block_size
            sources = list(torch.split(source[:count * size], size))
            destinations = list(torch.split(destination[:count * size], size))
            times = {"tier": ([], []), "raw": ([], [])}
            for r in range(args.rounds):
                for label, (put, get) in (("tier", (tier.put, tier.get)), ("raw", (raw_put, raw_get))):
                    destination[:count * size].zero_()
                    keys = [f"{label}/{name}/{r}/{i}" for i in range(count)]
                    put_s, get_s = one_round(put, get, store, keys, sources, destinations,
                                             source[:count * size], destination[:count * size])
                    times[label][0].append(put_s)
                    times[label][1].append(get_s)
            gbps = {label: [count * size / statistics.median(t) / 1e9 for t in pair] for label, pair in times.items()}
            rows.append(f"| {name} | {count} | {count * size / 2**20:.0f} | {gbps['tier'][0]:.2f} | "
                        f"{gbps['raw'][0]:.2f} | {100 * gbps['tier'][0] / gbps['raw'][0]:.0f}% | "
                        f"{gbps['tier'][1]:.2f} | {gbps['raw'][1]:.2f} | {100 * gbps['tier'][1] / gbps['raw'][1]:.0f}% |")
        tier.close()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
