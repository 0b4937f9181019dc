"""Capacity of the three layouts under one byte budget, over several budgets
and workload mixes: the demo's serving loop (ukv_torch.demo.server) with the
integrity check off, since only the accounting matters here.

    python benchmarks/capacity.py [--out benchmarks/capacity.md] [--plot benchmarks/capacity.png]

For each (SWA sizing, mix, budget): requests completed, served tokens per step, admission
refusals, preemptions, and the rows in use at the first admission refusal
(over all layer tensors, and in the fullest tensor).
"""
import argparse
import datetime
import platform
import subprocess
import sys
import time

from ukv_torch.demo.__main__ import (MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, PRESETS, SWA_SIZINGS, plan_layout,
                                     workload_copy)
from ukv_torch.demo.server import Server, ServerConfig
from ukv_torch.demo.workload import synthetic

MIXES = {
    # name: synthetic() overrides
    "long-heavy": dict(long_frac=0.6, long_range=(3072, 8192)),
    "mixed": dict(long_frac=0.35),
    "chat": dict(long_frac=0.1, followup_prob=0.7),
}
# Budgets per SWA sizing: the step-sized SWA pool (80 slots) leaves compress
# room at budgets where upstream's 128 slots alone would not fit.
BUDGETS_MIB = {"upstream": [64, 96, 160], "step": [40, 48, 56, 64, 96]}
LAYOUTS = ["static", "upstream", "elastic"]


def run_case(sizing, mix, budget_mib, layout, seed, max_steps):
    ratios = PRESETS["demo"]
    plan = plan_layout(int(budget_mib * (1 << 20)), ratios, layout, max_num_seqs=MAX_NUM_SEQS,
                       max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, swa_sizing=sizing)
    cfg = ServerConfig(ratios, plan.config, check_integrity=False, seed=seed)
    workload = synthetic(seed, num_conversations=64, **MIXES[mix])
    server = Server(layout, plan, workload_copy(workload), cfg)
    step = 0
    while not server.done() and step < max_steps:
        server.step(step)
        step += 1
    server.result.steps = step
    return server.finish_run().summary()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--plot")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=3000)
    args = ap.parse_args()
    rows = []
    started = time.time()
    for sizing in SWA_SIZINGS:
        for mix in MIXES:
            for budget in BUDGETS_MIB[sizing]:
                for layout in LAYOUTS:
                    s = run_case(sizing, mix, budget, layout, args.seed, args.max_steps)
                    rows.append((sizing, mix, budget, layout, s))
                    print(f"{sizing:>8} {mix:>10} {budget:>4} MiB {layout:>8}: {s['requests_completed']} done in "
                          f"{s['steps']} steps", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"Machine: {platform.processor() or platform.machine()}, {platform.system()}; date "
             f"{datetime.date.today()}; commit {commit}; {time.time() - started:.0f} s.", "",
             "| SWA sizing | mix | budget MiB | layout | SWA blocks | logical blocks | steps | completed "
             "| served tok/step | refusals | preemptions | hit rate | util @1st refusal | fullest tensor @1st refusal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sizing, mix, budget, layout, s in rows:
        lines.append(f"| {sizing} | {mix} | {budget} | {layout} | {s['swa_blocks']} | {s['logical_blocks']} | "
                     f"{s['steps']} | {s['requests_completed']} | {s['tokens_per_step']} | {s['admission_refusals']} | "
                     f"{s['preemptions']} | {s['prefix_hit_rate']} | {s['util_at_first_refusal']} | "
                     f"{s['fullest_tensor_at_first_refusal']} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(MIXES), figsize=(12, 3.6), sharey=True)
        for ax, mix in zip(axes, MIXES):
            for sizing, style in zip(SWA_SIZINGS, ("-", "--")):
                for layout in LAYOUTS:
                    pts = [(b, s["tokens_per_step"]) for z, m, b, l, s in rows if (z, m, l) == (sizing, mix, layout)]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                            label=f"{layout}, {sizing} SWA sizing")
            ax.set_title(mix)
            ax.set_xlabel("budget (MiB)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("tokens served per step")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
