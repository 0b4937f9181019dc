"""Capacity of the KV layouts under one byte budget: the demo's serving loop
(ukv_torch.demo.server) with the integrity check off, since only the
accounting matters here.

    python benchmarks/capacity.py [--scenario P|V5|L16|all] [--json] [--out F.md] [--plot F.png]
    python benchmarks/capacity.py --from-json P.json V5.json L16.json --plot F.png   (no rerun)
    python benchmarks/capacity.py --scenario L16 --seeds 1 --json > L16-1.json    (a seed per process)
    python benchmarks/capacity.py --sweep [--out F.md]   # the slot layouts over budgets and mixes
    python benchmarks/capacity.py --tiers --scenario P|V5 [--json]   # the host KV tier against GPU budgets

Scenarios (each over several workload seeds):
- P:   the demo workload (synthetic, 48 conversations), layers 1 dense + 2 CSA
       + 2 HCA at V4 fp8 costs, 40 MiB, 32 sequences, 2,048-token steps;
- V5:  V4-Pro (62 layers), 5 GiB, 256 sequences, 8,192-token steps, 384
       conversations;
- L16: V4-Pro, 16 GiB, 35% of prompts of 16K-64K tokens and the rest
       512-4,096, outputs 1,024-4,096, 512 conversations, sequences up to 128K;
       a run stops after 20,000 steps (the first refusal is what counts).
Layouts: the static split and option-2 elastic (both with the SWA pool sized
from the step's token budget), row_space with 128-, 64- and 32-token SWA
pages, and "ideal" with the same pages: a perfectly fungible byte pool, the
row-space manager (the same admission policy and page) on exact bytes instead
of rows, so no row, lattice or indexer padding.

--tiers: the row space with 32-token pages under the scenario's budget, with
a host KV tier (ukv_torch.tiers) of 2x, 8x and 32x that budget, beside no
tier at 1x, 9x and 64x the budget ("unlimited": nothing is evicted). The tier
is modelled by sizes (the runs have no KV tensors): the same keys, saves,
lookups and admissions as with bytes, objects of their real sizes in an LRU;
the manager runs whole chunks, which the TierCache turns on.
Reported: hit rate (prompt blocks from HBM or the tier over those looked up),
prefill tokens computed per step, served tokens per step, and tier bytes
saved and loaded per step.

Reported per layout (means over the seeds): the budget in use at the first
admission refusal (bytes of live KV over the budget), served tokens per step
and its ratio to the static split, the prefix hit rate, refusals,
preemptions, and the bytes the row space relocated per step (max, mean, and
mean fraction of the step's live KV bytes).
"""
import argparse
import collections
import datetime
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ukv_torch import KvPlan, PoolSizes
from ukv_torch.tiers import TierBackend
from ukv_torch.demo.__main__ import (MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, PRESETS, SWA_SIZINGS, plan_layout,
                                     workload_copy)
from ukv_torch.demo.server import Server, ServerConfig
from ukv_torch.demo.workload import synthetic


@dataclass
class Scenario:
    preset: str
    budget_mib: int
    max_num_seqs: int
    max_num_batched_tokens: int
    conversations: int
    seeds: List[int]
    max_blocks_per_seq: int = 160
    max_steps: int = 20000
    mix: Dict[str, object] = field(default_factory=dict)  # synthetic() overrides


SCENARIOS = {
    "P": Scenario("demo", 40, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, 48, [0, 1, 2, 3, 4]),
    "V5": Scenario("v4-pro", 5 * 1024, 256, 8192, 384, [0, 1, 2]),
    "L16": Scenario("v4-pro", 16 * 1024, 256, 8192, 512, [0, 1], max_blocks_per_seq=1024,
                    mix=dict(long_frac=0.35, long_range=(16384, 65536), short_range=(512, 4096),
                             output_range=(1024, 4096))),
}
# name -> (layout, SWA page tokens)
LAYOUTS = {"static": ("static", 0), "elastic": ("elastic", 0),
           "row_space-128": ("row_space", 128), "row_space-64": ("row_space", 64), "row_space-32": ("row_space", 32),
           "ideal-128": ("ideal", 128), "ideal-64": ("ideal", 64), "ideal-32": ("ideal", 32)}


def ideal_plan(plan: KvPlan) -> KvPlan:
    """The row-space plan re-cut to exact bytes: an envelope is every compress
    layer's rows of a block plus the CSA indexer's bytes, a unit is a page of
    every layer, and the budget is all of it, in rows of the greatest common
    divisor of the two sizes (a perfectly fungible byte pool)."""
    m, c = plan.model, plan.config
    row_bytes = m.head_dim * m.kv_elem_bytes + m.rope_head_dim * m.rope_elem_bytes
    envelope = sum(c.block_size // r for r in m.layer_ratios if r) * row_bytes + \
        m.layer_ratios.count(4) * m.indexer_bytes_per_block
    unit = c.swa_page * len(m.layer_ratios) * row_bytes
    grain = math.gcd(envelope, unit)
    total = plan.budget_bytes // grain
    pools = PoolSizes(num_logical_blocks=total // (envelope // grain), num_swa_blocks=total // (unit // grain),
                      total_rows=total, envelope_rows=envelope // grain, swa_unit_rows=unit // grain)
    return plan.replace(pools=pools, compressed_block_bytes=envelope, swa_block_bytes=unit,
                        total_bytes=total * grain, kv_bytes=total * grain, rope_bytes=0)


def plan_for(scenario: Scenario, name: str) -> KvPlan:
    layout, page = LAYOUTS[name]
    plan = plan_layout(scenario.budget_mib << 20, PRESETS[scenario.preset],
                       "row_space" if layout == "ideal" else layout, max_num_seqs=scenario.max_num_seqs,
                       max_num_batched_tokens=scenario.max_num_batched_tokens, swa_sizing="step",
                       max_blocks_per_seq=scenario.max_blocks_per_seq, swa_page_tokens=page or 32)
    return ideal_plan(plan) if layout == "ideal" else plan


def run(plan: KvPlan, ratios, workload, seed: int, max_steps: int, tier: Optional[TierBackend] = None) -> dict:
    cfg = ServerConfig(ratios, plan.config, check_integrity=False, seed=seed)
    server = Server("", plan, workload_copy(workload), cfg, tiers=[tier] if tier else [])
    step = 0
    while not server.done() and step < max_steps:
        server.step(step)
        step += 1
    server.result.steps = step
    return server.finish_run().summary()


# peak_budget_in_use says how full the layout got where nothing was refused.
FIGURES = ("budget_in_use_at_first_refusal", "peak_budget_in_use", "tokens_per_step", "prefix_hit_rate",
           "admission_refusals",
           "preemptions", "moved_bytes_per_step_max", "moved_bytes_per_step_mean", "moved_fraction_mean",
           "requests_completed", "steps")


def run_scenario(name: str, layouts: List[str], seeds: Optional[List[int]], log) -> dict:
    sc = SCENARIOS[name]
    seeds = sc.seeds if seeds is None else seeds
    ratios = PRESETS[sc.preset]
    per_layout: Dict[str, List[dict]] = {layout: [] for layout in layouts}
    for seed in seeds:
        workload = synthetic(seed, num_conversations=sc.conversations, **sc.mix)
        for layout in layouts:
            started = time.time()
            s = run(plan_for(sc, layout), ratios, workload, seed, sc.max_steps)
            per_layout[layout].append(s)
            print(f"{name} seed {seed} {layout:>14}: {s['requests_completed']} done in {s['steps']} steps, "
                  f"{s['tokens_per_step']} tok/step, in use at 1st refusal {s['budget_in_use_at_first_refusal']}, "
                  f"{time.time() - started:.0f} s", file=log)
    out = {}
    for layout, runs in per_layout.items():
        fig = {}
        for key in FIGURES:
            values = [r[key] for r in runs if r[key] is not None]
            fig[key] = round(float(np.mean(values)), 6) if values else None
        fig["budget_in_use_at_first_refusal_per_seed"] = [r["budget_in_use_at_first_refusal"] for r in runs]
        fig["served_tokens_per_step"] = fig.pop("tokens_per_step")
        out[layout] = fig
    return with_ratios({"scenario": name, "budget_bytes": sc.budget_mib << 20, "seeds": seeds, "layouts": out})


def with_ratios(result: dict) -> dict:
    static = result["layouts"].get("static", {}).get("served_tokens_per_step")
    for fig in result["layouts"].values():
        fig["ratio_to_static"] = round(fig["served_tokens_per_step"] / static, 4) if static else None
    return result


def combined(results: List[dict]) -> List[dict]:
    """Runs of one scenario over other seeds (--seeds) as one result: each
    figure the mean over all their seeds."""
    by_name: Dict[str, List[dict]] = {}
    for r in results:
        by_name.setdefault(r["scenario"], []).append(r)
    out = []
    for name, runs in by_name.items():
        if len(runs) == 1:
            out.append(runs[0])
            continue
        seeds = [seed for r in runs for seed in r["seeds"]]
        assert len(set(seeds)) == len(seeds), f"{name}: a seed appears in two runs"
        layouts = {}
        for layout in runs[0]["layouts"]:
            parts = [(len(r["seeds"]), r["layouts"][layout]) for r in runs if layout in r["layouts"]]
            if len(parts) != len(runs):
                continue  # a layout only some runs have is left out
            fig = {}
            for key in ("served_tokens_per_step" if k == "tokens_per_step" else k for k in FIGURES):
                weighted = [(n, f[key]) for n, f in parts if f.get(key) is not None]
                count = sum(n for n, _ in weighted)
                fig[key] = round(sum(n * v for n, v in weighted) / count, 6) if count else None
            fig["budget_in_use_at_first_refusal_per_seed"] = [
                v for _, f in parts for v in f["budget_in_use_at_first_refusal_per_seed"]]
            layouts[layout] = fig
        out.append(with_ratios({"scenario": name, "budget_bytes": runs[0]["budget_bytes"], "seeds": seeds,
                                "layouts": layouts}))
    return out


def table(result: dict) -> str:
    lines = [f"Scenario {result['scenario']} ({result['budget_bytes'] >> 20} MiB, seeds {result['seeds']})", "",
             "| layout | budget in use @1st refusal | peak | served tok/step | vs static | hit rate | refusals "
             "| preemptions | relocated bytes/step max | mean | mean fraction of live KV |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for layout, f in result["layouts"].items():
        lines.append(f"| {layout} | {f['budget_in_use_at_first_refusal']} | {f['peak_budget_in_use']} | "
                     f"{f['served_tokens_per_step']} | "
                     f"{f['ratio_to_static']} | {f['prefix_hit_rate']} | {f['admission_refusals']} | "
                     f"{f['preemptions']} | {f['moved_bytes_per_step_max']} | {f['moved_bytes_per_step_mean']} | "
                     f"{f['moved_fraction_mean']} |")
    return "\n".join(lines)


def plot(results: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6.4), squeeze=False)
    for col, result in enumerate(results):
        names = list(result["layouts"])
        figs = [result["layouts"][n] for n in names]
        ratios = [f["ratio_to_static"] or 0 for f in figs]
        # A layout that was never refused shows its peak, hatched.
        in_use = [f["budget_in_use_at_first_refusal"] or f["peak_budget_in_use"] for f in figs]
        hatches = ["" if f["budget_in_use_at_first_refusal"] else "//" for f in figs]
        for row, (values, label) in enumerate(((ratios, "served tokens/step vs static"),
                                               (in_use, "budget in use at 1st refusal (// peak)"))):
            ax = axes[row][col]
            bars = ax.bar(range(len(names)), values, color="#4c72b0")
            for bar, hatch in zip(bars, hatches if row else []):
                bar.set_hatch(hatch)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
            ax.set_title(f"{result['scenario']}: {label}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- the slot layouts over budgets and mixes -------------------------------

MIXES = {
    "long-heavy": dict(long_frac=0.6, long_range=(3072, 8192)),
    "mixed": dict(long_frac=0.35),
    "chat": dict(long_frac=0.1, followup_prob=0.7),
}
BUDGETS_MIB = {"upstream": [64, 96, 160], "step": [40, 48, 56, 64, 96]}


def sweep(seed: int, max_steps: int, log) -> str:
    rows = []
    ratios = PRESETS["demo"]
    for sizing in SWA_SIZINGS:
        for mix, overrides in MIXES.items():
            for budget in BUDGETS_MIB[sizing]:
                for layout in ("static", "upstream", "elastic", "row_space"):
                    plan = plan_layout(budget << 20, ratios, layout, max_num_seqs=MAX_NUM_SEQS,
                                       max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, swa_sizing=sizing)
                    s = run(plan, ratios, synthetic(seed, num_conversations=64, **overrides), seed, max_steps)
                    rows.append((sizing, mix, budget, layout, s))
                    print(f"{sizing:>8} {mix:>10} {budget:>4} MiB {layout:>9}: {s['requests_completed']} done in "
                          f"{s['steps']} steps", file=log)
    lines = ["| SWA sizing | mix | budget MiB | layout | steps | served tok/step | refusals | preemptions | hit rate "
             "| budget in use @1st refusal |", "|---|---|---|---|---|---|---|---|---|---|"]
    for sizing, mix, budget, layout, s in rows:
        lines.append(f"| {sizing} | {mix} | {budget} | {layout} | {s['steps']} | {s['tokens_per_step']} | "
                     f"{s['admission_refusals']} | {s['preemptions']} | {s['prefix_hit_rate']} | "
                     f"{s['budget_in_use_at_first_refusal']} |")
    return "\n".join(lines)


class SizedTier(TierBackend):
    """A host tier modelled by sizes: an LRU of keys and their objects' byte counts
    (the runs have no KV tensors, so objects carry no bytes worth keeping)."""

    name = "modelled"

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes, self.used = capacity_bytes, 0
        self.sizes: "collections.OrderedDict[str, int]" = collections.OrderedDict()

    def register_buffer(self, buffer) -> None:
        pass

    def put(self, keys, buffers):
        for key, buf in zip(keys, buffers):
            if key in self.sizes:
                self.sizes.move_to_end(key)
                continue
            while self.used + buf.numel() > self.capacity_bytes:
                self.used -= self.sizes.popitem(last=False)[1]
            self.sizes[key] = buf.numel()
            self.used += buf.numel()
        return [True] * len(keys)

    def get(self, keys, buffers):
        out = []
        for key in keys:
            if key in self.sizes:
                self.sizes.move_to_end(key)
            out.append(self.sizes.get(key, -1))
        return out

    def contains(self, keys):
        return [key in self.sizes for key in keys]

    def stats(self):
        return dict(objects=len(self.sizes), bytes_used=self.used, capacity_bytes=self.capacity_bytes)


# name -> (GPU budget multiple, host tier multiple of the GPU budget)
TIER_RUNS = {"gpu-1x": (1, 0), "host-2x": (1, 2), "host-8x": (1, 8), "host-32x": (1, 32), "gpu-9x": (9, 0),
             "gpu-unlimited": (64, 0)}
TIER_FIGURES = ("hit_rate_with_tier", "prefix_hit_rate", "prefill_tokens_per_step", "tokens_per_step",
                "tier_saved_bytes_per_step", "tier_loaded_bytes_per_step", "steps", "requests_completed")


def run_tiers(name: str, seeds: Optional[List[int]], log) -> dict:
    sc = SCENARIOS[name]
    seeds = sc.seeds if seeds is None else seeds
    ratios = PRESETS[sc.preset]
    out: Dict[str, Dict[str, List[float]]] = {run_name: collections.defaultdict(list) for run_name in TIER_RUNS}
    for seed in seeds:
        workload = synthetic(seed, num_conversations=sc.conversations, **sc.mix)
        for run_name, (gpu, host) in TIER_RUNS.items():
            started = time.time()
            scaled = Scenario(**{**sc.__dict__, "budget_mib": sc.budget_mib * gpu})
            plan = plan_for(scaled, "row_space-32")
            s = run(plan, ratios, workload, seed, sc.max_steps,
                    SizedTier(host * (sc.budget_mib << 20)) if host else None)
            for key in TIER_FIGURES:
                out[run_name][key].append(s[key])
            print(f"{name} seed {seed} {run_name:>14}: hit rate {s['hit_rate_with_tier']}, "
                  f"{s['prefill_tokens_per_step']} prefill tok/step, {time.time() - started:.0f} s", file=log)
    figures = {run_name: {key: round(float(np.mean(v)), 4) for key, v in runs.items()} for run_name, runs in out.items()}
    return {"scenario": name, "budget_bytes": sc.budget_mib << 20, "seeds": seeds, "tiers": figures}


def tier_table(result: dict) -> str:
    lines = [f"Scenario {result['scenario']} with a host KV tier ({result['budget_bytes'] >> 20} MiB GPU budget, "
             f"row space, 32-token pages, seeds {result['seeds']})", "",
             "| run | hit rate | HBM hit rate | prefill tokens computed/step | served tok/step | tier saved "
             "MiB/step | tier loaded MiB/step |", "|---|---:|---:|---:|---:|---:|---:|"]
    for run_name, f in result["tiers"].items():
        lines.append(f"| {run_name} | {f['hit_rate_with_tier']} | {f['prefix_hit_rate']} | "
                     f"{f['prefill_tokens_per_step']} | {f['tokens_per_step']} | "
                     f"{f['tier_saved_bytes_per_step'] / 2 ** 20:.3f} | {f['tier_loaded_bytes_per_step'] / 2 ** 20:.3f} |")
    return "\n".join(lines)


def machine() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def header(started: float) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return (f"Machine: {machine()}, {platform.system()}; date {datetime.date.today()};"
            f" commit {commit}; {time.time() - started:.0f} s.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="all", choices=sorted(SCENARIOS) + ["all"])
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, from: {', '.join(LAYOUTS)}")
    ap.add_argument("--json", action="store_true", help="print one JSON object per scenario instead of tables")
    ap.add_argument("--out", help="also write the tables (markdown) here")
    ap.add_argument("--plot", help="PNG of served tokens per step and budget in use per layout")
    ap.add_argument("--seeds", help="comma-separated workload seeds instead of the scenario's (to split a "
                                    "scenario over processes; --from-json combines the runs)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="tables and --plot from the output of earlier --json runs, running nothing; runs of "
                         "one scenario over other seeds are combined")
    ap.add_argument("--sweep", action="store_true", help="the slot layouts over budgets and mixes instead")
    ap.add_argument("--tiers", action="store_true", help="the host KV tier against GPU budgets instead (P, V5)")
    ap.add_argument("--seed", type=int, default=1, help="--sweep: the workload seed")
    ap.add_argument("--max-steps", type=int, default=3000, help="--sweep: the step limit")
    args = ap.parse_args()
    started = time.time()
    if args.sweep:
        table_text = sweep(args.seed, args.max_steps, sys.stderr)
        text = header(started) + "\n\n" + table_text
    elif args.tiers:
        names = ["P", "V5"] if args.scenario == "all" else [args.scenario]
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
        results = [run_tiers(name, seeds, sys.stderr) for name in names]
        if args.json:
            for result in results:
                print(json.dumps(result))
        text = header(started) + "\n\n" + "\n\n".join(tier_table(r) for r in results)
    else:
        layouts = args.layouts.split(",")
        unknown = [name for name in layouts if name not in LAYOUTS]
        if unknown:
            raise SystemExit(f"--layouts: unknown {', '.join(unknown)} (choose from {', '.join(LAYOUTS)})")
        names = sorted(SCENARIOS) if args.scenario == "all" else [args.scenario]
        if args.from_json:
            results = combined([json.loads(line) for path in args.from_json for line in open(path) if line.strip()])
            for r in results:  # the layouts in their usual order, however they were run
                r["layouts"] = {name: r["layouts"][name] for name in LAYOUTS if name in r["layouts"]}
        else:
            seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
            results = [run_scenario(name, layouts, seeds, sys.stderr) for name in names]
        if args.json:
            for result in results:
                print(json.dumps(result))
        if args.plot:
            plot(results, args.plot)
        tables = "\n\n".join(table(r) for r in results)
        text = tables if args.from_json else header(started) + "\n\n" + tables
    if not args.json:
        print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
