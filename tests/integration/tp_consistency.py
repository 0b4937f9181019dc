"""Tensor-parallel consistency of the staged KV tables, on any number of ranks.

    python -m torch.distributed.run --standalone --nproc_per_node=N tests/integration/tp_consistency.py [options]

NCCL with one GPU per rank (LOCAL_RANK) when CUDA is available, gloo on CPU
otherwise. The demo's serving loop (ukv_torch/demo/server.py: admission,
chunked prefill, decode, preemption, completion, follow-up turns) drives a
real KvManager under a tight budget, and two deployment patterns are checked
after every step:

(a) replicated: every rank runs its own manager fed the same calls; the
    staged tables must be identical on all ranks (all-gather compare).
(b) scheduler: rank 0 alone runs the manager and broadcasts one step message
    (batch size, decode inputs) and the staged tables; every rank then checks
    the received tables, builds the decode step's indices with the index ops,
    and the indices must be identical on all ranks and equal to the per-token
    Python reference built from rank 0's per-sequence tables (not the staged
    ones). On CUDA the step is also captured once in a CUDA graph on the
    persistent buffers and replayed after each broadcast; it must equal the
    eager step.

--perturb-step S changes one SWA entry that a decode token reads on rank
--perturb-rank at the first decode step >= S (in both patterns), which must
fail the run. Exits 1 on any mismatch, on every rank.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import time
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.distributed as dist

import ukv_torch
from ukv_torch.demo.__main__ import PRESETS, plan_layout
from ukv_torch.demo.server import Server, ServerConfig
from ukv_torch.demo.workload import synthetic
from ukv_torch.distributed import (TablesDiverged, broadcast_tables, check_tables_replicated, first_divergence,
                                   tables_buffer)

# Run as a script, sys.path[0] is this file's folder; the support package is in tests/, one up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.tp_decode_step import DecodeStep, Layout, draw_decode_rows  # noqa: E402

SCHEDULER = 0  # the rank that runs the manager in pattern (b)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--patterns", default="replicated,scheduler", help="replicated, scheduler or both")
    p.add_argument("--steps", type=int, default=300, help="serving steps per pattern")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    p.add_argument("--layout", default="upstream", choices=("static", "upstream", "elastic"))
    p.add_argument("--budget-mib", type=float, default=36.0, help="tight enough to refuse admissions and preempt")
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-blocks-per-seq", type=int, default=64)
    p.add_argument("--index-topk", type=int, default=64)
    p.add_argument("--perturb-step", type=int, default=None)
    p.add_argument("--perturb-rank", type=int, default=None, help="default: the last rank")
    p.add_argument("--json", action="store_true", help="rank 0 prints the summary as one JSON line")
    args = p.parse_args(argv)
    for name in args.patterns.split(","):
        if name not in ("replicated", "scheduler"):
            p.error(f"--patterns: unknown pattern {name!r} (choose from replicated, scheduler)")
    return args


# --- process group ---------------------------------------------------------------
def init_distributed():
    """NCCL on this rank's GPU when CUDA is usable, gloo on the CPU otherwise."""
    if torch.cuda.is_available() and ukv_torch.BACKEND != "cpu":
        # NVLink multicast stays off: nothing here needs it, and on shared GPU hosts it
        # can put the GPUs out of service. Set before NCCL creates its communicator.
        os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        local_rank = int(os.environ["LOCAL_RANK"])
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"one GPU per rank: LOCAL_RANK {local_rank}, {torch.cuda.device_count()} GPUs visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    return device


# --- the serving loop --------------------------------------------------------------
class ObservedServer(Server):
    """The demo's server, calling on_forward(step, decoding, rows) after each
    stage + upload, before the step commits (the manager's per-sequence state
    is then the one the forward reads)."""

    def __init__(self, *args, on_forward: Callable, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_forward = on_forward

    def _forward(self, step, decoding, chunks, batch) -> None:
        super()._forward(step, decoding, chunks, batch)
        self.on_forward(step, decoding, len(batch))


def make_plan(args):
    """The layout every rank derives from the same engine configuration (the plan carries it)."""
    return plan_layout(int(args.budget_mib * (1 << 20)), PRESETS[args.preset], args.layout,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       swa_sizing="upstream", max_blocks_per_seq=args.max_blocks_per_seq)


def make_server(args, device: torch.device, on_forward: Callable) -> ObservedServer:
    plan = make_plan(args)
    cfg = ServerConfig(PRESETS[args.preset], plan.config, index_topk=args.index_topk, max_steps=args.steps,
                       device=str(device), seed=args.seed, check_integrity=False)
    # Long prompts and outputs under a tight budget: refusals, preemptions and completions in a few hundred steps.
    workload = synthetic(args.seed, num_conversations=args.conversations, steps_span=30, long_frac=0.3,
                         long_range=(1024, 3000), short_range=(64, 512), output_range=(32, 256))
    return ObservedServer(args.layout, plan, workload, cfg, on_forward=on_forward)


def decode_layout(args) -> Layout:
    plan = make_plan(args)
    config = plan.config
    if 4 not in config.compress_ratios or 128 not in config.compress_ratios:
        raise SystemExit(f"--preset {args.preset}: the decode step needs CSA (ratio 4) and HCA (ratio 128) layers")
    base = torch.ops.ukv.compress_base_row(plan.unified, plan.num_swa_blocks, config.block_size)
    return Layout(config, args.index_topk, base)


class Run:
    """Per-rank bookkeeping: counts, failures, the perturbation, the agreement to stop."""

    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        self.config = make_plan(args).config
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.counts = collections.Counter()
        self.failures: List[str] = []
        self.failed_anywhere = 0  # failed checks summed over the ranks, as of the last agree()
        self.perturbed = set()

    def fail(self, pattern: str, step: int, what: str) -> None:
        message = f"[rank {self.rank}] {pattern} step {step}: {what}"
        self.failures.append(message)
        print(f"TP MISMATCH {message}", file=sys.stderr, flush=True)

    def agree(self) -> bool:
        """True once any rank has failed; every rank learns it at the same step."""
        t = torch.tensor([len(self.failures)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        self.failed_anywhere = int(t.item())
        return self.failed_anywhere > 0

    def maybe_perturb(self, pattern: str, step: int, tables: torch.Tensor, positions: List[int]) -> None:
        """At the first decode step >= --perturb-step, point the SWA entry that
        decode row 0's newest position reads elsewhere, on one rank."""
        a = self.args
        if a.perturb_step is None or pattern in self.perturbed or step < a.perturb_step or not positions:
            return
        self.perturbed.add(pattern)
        if self.rank != (self.world - 1 if a.perturb_rank is None else a.perturb_rank):
            return
        col = positions[0] // self.config.block_size
        tables[0, ukv_torch.table_index(self.config, "swa"), col] += 1
        print(f"[rank {self.rank}] {pattern} step {step}: perturbed row 0, SWA table, column {col}", file=sys.stderr,
              flush=True)

    def check_tables(self, pattern: str, step: int, tables: torch.Tensor, rows: int) -> None:
        try:
            check_tables_replicated(tables, rows)
        except TablesDiverged as exc:
            self.fail(pattern, step, str(exc))
        self.counts[f"{pattern}_table_checks"] += 1
        self.counts[f"{pattern}_table_entries"] += rows * tables.shape[1] * tables.shape[2]


# --- pattern (a) ------------------------------------------------------------------------
def run_replicated(run: Run) -> int:
    staged = {}

    def on_forward(step, decoding, rows):
        run.maybe_perturb("replicated", step, server.mgr.tables, [r.computed for r in decoding])
        staged["rows"] = rows

    server = make_server(run.args, run.device, on_forward)
    step = 0
    while step < run.args.steps:
        staged["rows"] = 0
        server.step(step)
        # After the commit: only stage() writes the staged tables, so they are what the forward read.
        run.check_tables("replicated", step, server.mgr.tables, staged["rows"])
        done = server.done()
        if first_divergence(torch.tensor([int(done)], device=run.device)) is not None:  # else some ranks would hang
            run.fail("replicated", step, "the ranks disagree on whether the workload is finished")
        step += 1
        if run.agree() or done:
            break
    run.counts["replicated_preemptions"] = server.result.preemptions
    run.counts["replicated_completed"] = server.result.completed
    return step


# --- pattern (b) ------------------------------------------------------------------------
class ScheduledStep:
    """What every rank does with one scheduler message: receive the tables,
    check them, run the decode step (from the graph too on CUDA), compare
    across ranks and, on the scheduler, with the reference. Returns False on
    the stop message."""

    def __init__(self, run: Run, decode: DecodeStep, tables: torch.Tensor):
        self.run, self.decode, self.tables = run, decode, tables
        self.eager = decode.output_buffer()
        self.replayed = decode.output_buffer()
        self.graph = decode.capture(tables, self.replayed) if run.device.type == "cuda" else None

    def __call__(self, reference: Optional[List[int]]) -> bool:
        run, decode = self.run, self.decode
        dist.broadcast(decode.message, src=SCHEDULER)
        h = decode.header()
        if h["stop"]:
            return False
        broadcast_tables(self.tables, h["rows"], src=SCHEDULER)
        decode.unpack()
        positions = decode.inputs["positions"][: h["decode_tokens"]].tolist()
        run.maybe_perturb("scheduler", h["step"], self.tables, positions)
        run.check_tables("scheduler", h["step"], self.tables, h["rows"])
        if h["decode_tokens"]:
            self._decode(h["step"], reference)
        return True

    def _decode(self, step: int, reference: Optional[List[int]]) -> None:
        run, decode = self.run, self.decode
        if self.graph is not None:
            self.graph.replay()
        decode.run(self.tables, self.eager)
        if self.graph is not None:
            if not torch.equal(self.replayed, self.eager):
                bad = int((self.replayed != self.eager).nonzero()[0])
                run.fail("scheduler", step, f"graph replay differs from the eager step at {decode.locate(bad)}")
            run.counts["graph_replays_checked"] += 1
        d = first_divergence(self.eager)
        if d is not None:
            run.fail("scheduler", step, f"indices differ across ranks at {decode.locate(d.index[0])}: rank "
                                        f"{SCHEDULER} has {d.expected}, rank {d.rank} has {d.found}")
        run.counts["index_checks"] += 1
        run.counts["index_entries"] += self.eager.numel()
        run.counts["decode_tokens"] += int((decode.inputs["batch_id"] >= 0).sum())
        if reference is not None:
            got = self.eager.tolist()
            if got != reference:
                bad = next(i for i, (g, r) in enumerate(zip(got, reference)) if g != r)
                run.fail("scheduler", step, f"indices differ from the reference at {decode.locate(bad)}: "
                                            f"expected {reference[bad]}, got {got[bad]}")
            run.counts["reference_checks"] += 1


def run_scheduler(run: Run) -> int:
    layout = decode_layout(run.args)
    decode = DecodeStep(layout, run.device)
    if run.rank != SCHEDULER:
        exchange = ScheduledStep(run, decode, tables_buffer(layout.config, run.device))
        return follow(run, exchange)
    rng = np.random.default_rng([run.args.seed, 7])
    exchanged = set()

    def on_forward(step, decoding, rows):
        rows_of_decode, reference = None, None
        if decoding:
            mgr, seqs = server.mgr, [r.seq_id for r in decoding]
            rows_of_decode = draw_decode_rows(rng, [r.computed for r in decoding], layout.index_topk)
            reference = decode.reference(rows_of_decode, [mgr.swa_table(s).tolist() for s in seqs],
                                         [mgr.phys_table(s, layout.csa_type).tolist() for s in seqs],
                                         [mgr.phys_table(s, layout.hca_type).tolist() for s in seqs])
        decode.pack(step, rows, rows_of_decode)
        exchange(reference)
        exchanged.add(step)

    server = make_server(run.args, run.device, on_forward)
    exchange = ScheduledStep(run, decode, server.mgr.tables)
    step = 0
    while step < run.args.steps and not server.done():
        server.step(step)  # on_forward exchanges the step when it has a batch
        if step not in exchanged:
            decode.pack(step, 0, None)
            exchange(None)
        step += 1
        if run.agree():
            break
    else:
        decode.pack(step, 0, None, stop=True)
        exchange(None)
    run.counts["scheduler_preemptions"] = server.result.preemptions
    run.counts["scheduler_completed"] = server.result.completed
    return step


def follow(run: Run, exchange: ScheduledStep) -> int:
    steps = 0
    while exchange(None):
        steps += 1
        if run.agree():
            break
    return steps


PATTERNS = {"replicated": run_replicated, "scheduler": run_scheduler}


# --- main ---------------------------------------------------------------------------------
def summary(run: Run, steps: dict, seconds: float) -> dict:
    dev = run.device
    return {"world_size": run.world, "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "steps": steps, "counts": dict(run.counts),
            "failed_checks": run.failed_anywhere, "wall_s": round(seconds, 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = init_distributed()
    run = Run(args, device)
    if args.perturb_rank is not None and not 0 <= args.perturb_rank < run.world:
        raise SystemExit(f"--perturb-rank must be in [0, {run.world}), got {args.perturb_rank}")
    started = time.time()
    steps = {}
    for name in args.patterns.split(","):
        steps[name] = PATTERNS[name](run)
        if run.failed_anywhere:
            break
    result = summary(run, steps, time.time() - started)
    if run.rank == 0:
        print(json.dumps(result) if args.json else
              f"tp_consistency: world {result['world_size']}, {result['backend']} on {result['device']}, "
              f"steps {steps}, {result['failed_checks']} failed checks (all ranks), {result['wall_s']} s\n"
              f"  {result['counts']}")
    dist.destroy_process_group()
    return 1 if run.failed_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
