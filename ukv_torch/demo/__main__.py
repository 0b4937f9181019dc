"""python -m ukv_torch.demo: serve one workload under each KV layout, check
the integrity of every index along the way, and tell the served tokens per
step of each against the first. Exits 1 on any mismatch."""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time

from .. import ServeConfig
from ..tiers import HostTier
from ..tiers.mooncake_master import MooncakeMaster
from ..plan.planning import MODEL_PRESETS, plan_kv_layout
from . import report
from .server import Server, ServerConfig
from .workload import load_jsonl, synthetic

LAYOUTS = {"static": "static split", "upstream": "unified (upstream sizing)", "elastic": "unified (elastic sizing)",
           "row_space": "row space"}
PRESETS = dict(MODEL_PRESETS, demo=[0, 4, 128, 4, 128])
# How the SWA pool's prefill-chunk term is sized: upstream's fixed 64 blocks,
# or the blocks the scheduler's per-step token budget can span.
SWA_SIZINGS = ("upstream", "step")
# The demo engine's defaults: sequences and tokens per step, the longest sequence, the sliding window.
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MAX_BLOCKS_PER_SEQ, WINDOW = 32, 2048, 160, 128


# Tokens per SWA page of the row-space layout (the slot layouts page by blocks).
SWA_PAGE_TOKENS = 32


def plan_layout(budget, ratios, layout, *, max_num_seqs, max_num_batched_tokens, swa_sizing,
                max_blocks_per_seq=MAX_BLOCKS_PER_SEQ, swa_page_tokens=SWA_PAGE_TOKENS):
    """The layout's plan, carrying the engine's ServeConfig (the server and its
    manager take it from there); every slot layout of a run gets the same SWA
    sizing, the row-space layout pages of swa_page_tokens."""
    config = ServeConfig(layout=layout, swa_sizing=swa_sizing, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_blocks_per_seq=max_blocks_per_seq,
                         window=WINDOW, compress_ratios=tuple(sorted({r for r in ratios if r})),
                         swa_page_tokens=swa_page_tokens if layout == "row_space" else 0)
    return plan_kv_layout(budget, ratios, config)


WORKLOAD_FORMAT = """--workload: one JSON object per line. An optional first line
{"system_prompts": [len, ...]} gives shared system prompts (random tokens of
these lengths); every other line is a conversation {"turns": [[user_tokens,
output_tokens], ...], "arrival": step, "system": index or -1, "think_steps":
steps between turns (default 4)}."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every option's help; the epilog's line breaks kept."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ukv_torch.demo", description=__doc__, epilog=WORKLOAD_FORMAT,
                                formatter_class=HelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--preset", default="demo", choices=sorted(PRESETS),
                   help="layer mix: demo = 1 dense + 2 CSA + 2 HCA layers; v4-flash / v4-pro = the full models")
    p.add_argument("--budget-mib", type=float, default=64.0, help="KV byte budget, at V4 fp8 sizes")
    p.add_argument("--steps", type=int, default=1500, help="step limit per layout")
    p.add_argument("--seed", type=int, default=0, help="workload and index-check seed")
    p.add_argument("--conversations", type=int, default=48, help="synthetic workload size")
    p.add_argument("--workload", help="JSONL file of conversations instead of the synthetic mix (format below)")
    p.add_argument("--layouts", default="static,upstream,elastic,row_space",
                   help=f"comma-separated, from: {', '.join(LAYOUTS)}")
    p.add_argument("--swa-page-tokens", type=int, default=SWA_PAGE_TOKENS,
                   help="tokens per SWA page of the row_space layout (a divisor of the block size and a multiple "
                        "of every compress type's rows per block)")
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS, help="sequences live at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS, help="tokens per step")
    p.add_argument("--swa-sizing", default="upstream", choices=SWA_SIZINGS,
                   help="SWA pool = max_num_seqs windows + a prefill-chunk term: upstream's fixed 64 blocks, "
                        "or the blocks --max-num-batched-tokens spans")
    p.add_argument("--index-topk", type=int, default=1024, help="CSA top-k cells each query's indices cover")
    p.add_argument("--tier", default="host", choices=("host", "mooncake", "none"),
                   help="host: also serve the row space with a host-memory KV tier (ukv_torch.tiers.HostTier) "
                        "beside it, which saves every published block and loads what continues a prefix hit; "
                        "mooncake: a host tier, then a Mooncake Store")
    p.add_argument("--tier-mult", type=int, default=8, help="the host tier's capacity in multiples of the budget")
    p.add_argument("--mooncake-master", help="--tier mooncake: the store's mooncake_master RPC address "
                                             "(default: start one here)")
    p.add_argument("--mooncake-metadata", help="its metadata URL, with --mooncake-master")
    p.add_argument("--plot", default="ukv_demo_occupancy.png", help="PNG path ('' for none)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--eager", action="store_true",
                   help="on CUDA, build decode indices with eager calls instead of replaying a captured graph")
    p.add_argument("--inject-fault", type=int, default=None, metavar="STEP",
                   help="damage one staged table entry at step STEP, after the model's KV writes, to show the "
                        "integrity check catches it; the run then exits 1")
    return p.parse_args(argv)


def run(args) -> int:
    ratios = PRESETS[args.preset]
    budget = int(args.budget_mib * (1 << 20))
    workload = (load_jsonl(args.workload, args.seed) if args.workload
                else synthetic(args.seed, num_conversations=args.conversations))
    started = time.time()
    layouts = args.layouts.split(",")
    for layout in layouts:
        if layout not in LAYOUTS:
            raise SystemExit(f"--layouts: unknown layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    if (args.mooncake_master is None) != (args.mooncake_metadata is None):
        raise SystemExit("--mooncake-master and --mooncake-metadata go together")
    runs = [(layout, False) for layout in layouts]
    if args.tier != "none" and "row_space" in layouts:  # the row space with the tier, beside it without
        runs.insert(layouts.index("row_space") + 1, ("row_space", True))
    store = Store(args)
    try:
        results = serve(args, runs, budget, ratios, workload, store)
    finally:
        store.close()
    summaries = [r.summary() for r in results]
    return report_run(args, results, summaries, budget, ratios, workload, started)


class Store:
    """The Mooncake Store of --tier mooncake (a local master when none is given); nothing otherwise."""

    def __init__(self, args):
        self.master = None
        self.address, self.metadata, self.metrics = args.mooncake_master, args.mooncake_metadata, None
        if args.tier == "mooncake" and self.address is None:
            self.master = MooncakeMaster().start()
            self.address, self.metadata, self.metrics = (self.master.master_address, self.master.metadata_url,
                                                         self.master.metrics_url)

    def backends(self, args, budget: int) -> list:
        backends = [HostTier(args.tier_mult * budget)]
        if args.tier == "mooncake":
            from ..tiers.mooncake import MooncakeTier  # the optional extra
            backends.append(MooncakeTier(self.address, self.metadata, args.tier_mult * budget,
                                         metrics_url=self.metrics))
        return backends

    def close(self) -> None:
        if self.master is not None:
            self.master.stop()


def serve(args, runs, budget, ratios, workload, store) -> list:
    results = []
    for layout, tiered in runs:
        plan = plan_layout(budget, ratios, layout, max_num_seqs=args.max_num_seqs, swa_page_tokens=args.swa_page_tokens,
                           max_num_batched_tokens=args.max_num_batched_tokens, swa_sizing=args.swa_sizing)
        cfg = ServerConfig(ratios, plan.config, index_topk=args.index_topk, max_steps=args.steps, device=args.device,
                           seed=args.seed, inject_fault_step=args.inject_fault, cuda_graph=not args.eager)
        name = LAYOUTS[layout] + (f" + {args.tier} tier {args.tier_mult}x" if tiered else "")
        tiers = store.backends(args, budget) if tiered else []
        server = Server(name, plan, workload_copy(workload), cfg, tiers=tiers)
        bar = report.Progress(layout + (" + tier" if tiered else ""), workload.total_turns())
        step = 0
        while not server.done() and step < args.steps:
            server.step(step)
            step += 1
            bar.update(server.result.completed, f"step {step}")
        bar.close()
        server.result.steps = step
        results.append(server.finish_run())
        for backend in tiers:
            backend.close()
    return results


def report_run(args, results, summaries, budget, ratios, workload, started) -> int:
    if args.json:
        print(json.dumps({"budget_bytes": budget, "preset": args.preset, "swa_sizing": args.swa_sizing,
                          "layouts": summaries}, indent=2))
    else:
        print(f"\nukv_torch demo: {args.preset} layers {ratios}, budget {args.budget_mib:g} MiB, "
              f"{args.swa_sizing} SWA sizing, {workload.total_turns()} turns, device {args.device}, "
              f"{time.time() - started:.0f} s\n")
        print(report.outcome(summaries, args.budget_mib) + "\n")
        print(report.table(summaries))
        print("\n" + report.LEGEND)
    if args.plot and report.plot(results, args.plot) and not args.json:
        print(f"\noccupancy plot: {args.plot}")
    bad = [m for r in results for m in r.mismatches]
    for m in bad[:20]:
        print(f"INTEGRITY MISMATCH: {m.label} position {m.position} {m.role} layer {m.layer} row {m.row}: "
              f"expected tag {m.expected}, found {m.found}", file=sys.stderr)
    return 1 if bad else 0


def workload_copy(w):
    """Each layout serves the same workload from scratch."""
    return copy.deepcopy(w)


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
