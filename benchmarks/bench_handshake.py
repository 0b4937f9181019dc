"""Host time of a disaggregated transfer's handshake, before its first write.

A send (ukv_torch.disagg) moves no byte until the sender has described the
sequence and offered it, and the receiver has admitted it and answered with
its rows; meanwhile the sender takes its own rows and gathers the first
layer. At 32K tokens that came to 4.0-5.9 ms of a 60-67 ms send on an H100
host (RESULTS.md), so it is worth timing apart from the transfer engine.
This times the three host steps in one process, without a transfer engine:

- the sender before its offer: describe the sequence, its layer bounds, the
  geometry, the offer's fields (KvSender.send);
- the sender's rows: the checked runs it gathers from (KvRegions.sequence_rows);
- the receiver's answer: the offer checked and imported, the staged tables,
  the rows as runs (KvReceiver._offer up to its accept).

One V4-Pro sequence (bench_disagg.py's pools: a row-space sender, an elastic
receiver), medians of --repeats after two unmeasured ones.

    python benchmarks/bench_handshake.py [--tokens 32768] [--repeats 10]
"""
import argparse
import statistics
import time

import bench_disagg
from ukv_torch.disagg import receiver as receiving
from ukv_torch.disagg.kv_regions import PIECE_BYTES, KvRegions, Staging
from ukv_torch.disagg.sender import offer_message


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if args.repeats < 1 or not 0 < args.tokens <= max(bench_disagg.TOKENS):
        ap.error(f"--repeats must be >= 1 and --tokens in [1, {max(bench_disagg.TOKENS)}]")
    plan, kv, mgr = bench_disagg.side("row_space", "cpu")
    bench_disagg.prefill(plan, kv, mgr, 1, list(range(1, args.tokens + 1)))
    rplan, rkv, rmgr = bench_disagg.side("elastic", "cpu")
    regions = KvRegions(plan, kv)
    receiver = receiving.KvReceiver.__new__(receiving.KvReceiver)  # its state _offer reads, with no socket
    receiver.mgr, receiver.plan, receiver.kv, receiver.regions = rmgr, rplan, rkv, KvRegions(rplan, rkv)
    receiver._staging = Staging(0, "bench_handshake")
    times = {"sender before its offer": [], "sender's rows": [], "receiver's answer": []}
    for run in range(2 + args.repeats):
        t0 = time.perf_counter()
        export = mgr.describe_sequence(1)
        bounds = regions.layer_bounds(export)
        offer = offer_message(regions, export, bounds, str(run), 5, PIECE_BYTES)
        t1 = time.perf_counter()
        regions.sequence_rows(export, mgr)
        t2 = time.perf_counter()
        theirs, their_bounds, layers = receiver._export(offer)
        cached = rmgr.import_sequence(5, theirs)
        receiving._Arriving(receiver, offer["xfer"], receiver._rows_now(5), cached, their_bounds[layers], layers)
        t3 = time.perf_counter()
        if run >= 2:
            for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[name].append(seconds * 1e6)
        rmgr.deallocate(5)
        rmgr.clear_cache()
    print(f"{args.tokens}-token V4-Pro sequence, row space -> elastic, medians of {args.repeats} (us):")
    for name, values in times.items():
        print(f"{statistics.median(values):9.0f}  {name}")


if __name__ == "__main__":
    main()
