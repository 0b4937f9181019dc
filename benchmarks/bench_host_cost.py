"""Where the host time of an eager index-op call goes (run on the GPU machine).

An eager decode-sized call is bound by the host, not the GPU: this times one
csa_translate_pack call (T=1, the decode case of bench_kernels.py) peeled layer
by layer, each as host microseconds per call over back-to-back calls (the
median of 5 runs):

- wrapper:      ukv_torch.csa_translate_pack(...) with keywords (what users call)
- positional:   the EagerOp behind it, all arguments positional
- eager_call:   _C.eager_call(handle, args) itself (C++ argument conversion,
                boxed dispatcher call, validation, launch)
- torch.ops:    torch.ops.ukv.csa_translate_pack.default(...) (the Python path)
- no launch:    eager_call on the same op with T=0 (everything but the launch)
- floors:       an ATen in-place zero_ of 4 cells from Python, and
                torch.cuda._sleep(0) (one bare launch through a thin binding)
- metadata:     ukv_torch.decode_index_metadata at T=64, whose eager figure in
                bench_kernels.py runs 0.3-2.5 us over the other ops': if this
                row matches theirs, the difference is on the device

    python benchmarks/bench_host_cost.py [--iters 20000] [--device cuda]
"""
import argparse
import statistics
import sys
import time

import torch

import ukv_torch
from ukv_torch import _C
from ukv_torch._extension.eager import EagerOp

TOPK, WINDOW, BS = 1024, 128, 128


def inputs(num_tokens: int, device):
    ctx = 8192
    cols = ctx // BS + 1
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    d = {
        "topk": torch.randint(0, ctx // 4, (num_tokens, TOPK), generator=gen, device=device, dtype=torch.int32),
        "table": torch.randint(0, 1 << 20, (max(num_tokens, 1), cols), generator=gen, device=device,
                               dtype=torch.int32),
        "positions": torch.full((num_tokens,), ctx - 1, dtype=torch.int64, device=device),
        "batch_id": torch.arange(num_tokens, dtype=torch.int32, device=device),
    }
    n = torch.clamp(d["positions"] + 1, max=WINDOW) + TOPK
    d["indptr"] = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), torch.cumsum(n, 0).to(torch.int32)])
    d["out"] = torch.zeros(int(d["indptr"][-1]) + 1, dtype=torch.int32, device=device)
    return d


def metadata_inputs(num_tokens: int, device):
    """decode_index_metadata's arguments for num_tokens sequences of 8K tokens."""
    i32 = dict(dtype=torch.int32, device=device)
    return (torch.full((num_tokens,), 8191, dtype=torch.int64, device=device), torch.arange(num_tokens, **i32),
            torch.full((num_tokens,), 2048, **i32), torch.full((num_tokens,), 64, **i32),
            *(torch.empty(num_tokens + 1, **i32) for _ in range(3)))


def positional(d):
    """Every argument in schema order: the six tensors, compress_base, window, skip_per_token, compress_ratio,
    block_size."""
    return (d["topk"], d["table"], d["positions"], d["batch_id"], d["indptr"], d["out"], 0, WINDOW, None, 4, BS)


def host_us(fn, iters: int, device, rounds: int = 5) -> float:
    """The median over `rounds` runs of iters / rounds back-to-back calls."""
    for _ in range(100):
        fn()
    calls = max(1, iters // rounds)
    per_call = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return statistics.median(per_call)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_host_cost: no CUDA device; nothing measured")
        return 0
    one, empty = inputs(1, device), inputs(0, device)
    op = EagerOp("csa_translate_pack")
    args_one, args_empty = positional(one), positional(empty)
    overload = torch.ops.ukv.csa_translate_pack.default
    cells = torch.zeros(4, dtype=torch.int32, device=device)
    meta = metadata_inputs(64, device)
    timings = {
        "wrapper": lambda: ukv_torch.csa_translate_pack(one["topk"], one["table"], one["positions"], one["batch_id"],
                                                         one["indptr"], one["out"], compress_base=0, window=WINDOW,
                                                         block_size=BS),
        "positional": lambda: op(*args_one),
        "eager_call": lambda: _C.eager_call(op.handle, args_one),
        "torch.ops": lambda: overload(*args_one[:6], compress_base=0, window=WINDOW, compress_ratio=4, block_size=BS),
        "no launch (T=0)": lambda: _C.eager_call(op.handle, args_empty),
        "ATen zero_": cells.zero_,
        "decode_index_metadata wrapper (T=64)": lambda: ukv_torch.decode_index_metadata(
            *meta, window=WINDOW, index_topk=TOPK),
    }
    if device.type == "cuda":
        timings["torch.cuda._sleep(0)"] = lambda: torch.cuda._sleep(0)
    print(f"host us per call, {args.iters} back-to-back calls, csa_translate_pack T=1 on {device}, torch "
          f"{torch.__version__}\n")
    print("| call | host us |\n|---|---|")
    for name, fn in timings.items():
        print(f"| {name} | {host_us(fn, args.iters, device):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
