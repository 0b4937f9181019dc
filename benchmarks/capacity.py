"""Capacity of the three layouts under one byte budget, over several budgets
and workload mixes: the demo's serving loop (ukv_torch.demo.server) with the
integrity check off, since only the accounting matters here.

    python benchmarks/capacity.py [--out benchmarks/capacity.md] [--plot benchmarks/capacity.png]

For each (mix, budget): requests completed, tokens per step, admission
refusals, preemptions, and the rows in use at the first admission refusal
(over all layer tensors, and in the fullest tensor).
"""
import argparse
import datetime
import platform
import subprocess
import sys
import time

from ukv_torch.demo.__main__ import PRESETS, workload_copy
from ukv_torch.demo.server import ServeConfig, Server
from ukv_torch.demo.workload import synthetic
from ukv_torch.planning import plan_kv_layout

MIXES = {
    # name: synthetic() overrides
    "long-heavy": dict(long_frac=0.6, long_range=(3072, 8192)),
    "mixed": dict(long_frac=0.35),
    "chat": dict(long_frac=0.1, followup_prob=0.7),
}
BUDGETS_MIB = [64, 96, 160]
LAYOUTS = ["static", "upstream", "elastic"]


def run_case(mix, budget_mib, layout, seed, max_steps):
    ratios = PRESETS["demo"]
    plan = plan_kv_layout(int(budget_mib * (1 << 20)), ratios, max_num_seqs=32, mode=layout)
    workload = synthetic(seed, num_conversations=64, **MIXES[mix])
    server = Server(layout, plan, workload_copy(workload), ServeConfig(ratios, check_integrity=False, seed=seed))
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
    for mix in MIXES:
        for budget in BUDGETS_MIB:
            for layout in LAYOUTS:
                s = run_case(mix, budget, layout, args.seed, args.max_steps)
                rows.append((mix, budget, layout, s))
                print(f"{mix:>10} {budget:>4} MiB {layout:>8}: {s['requests_completed']} done in {s['steps']} steps",
                      file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"Machine: {platform.processor() or platform.machine()}, {platform.system()}; date "
             f"{datetime.date.today()}; commit {commit}; {time.time() - started:.0f} s.", "",
             "| mix | budget MiB | layout | logical blocks | steps | completed | tok/step | refusals | preemptions "
             "| hit rate | util @1st refusal | fullest tensor @1st refusal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mix, budget, layout, s in rows:
        lines.append(f"| {mix} | {budget} | {layout} | {s['logical_blocks']} | {s['steps']} | "
                     f"{s['requests_completed']} | {s['tokens_per_step']} | {s['admission_refusals']} | "
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
        fig, axes = plt.subplots(1, len(MIXES), figsize=(12, 3.4), sharey=True)
        for ax, mix in zip(axes, MIXES):
            for layout in LAYOUTS:
                pts = [(b, s["tokens_per_step"]) for m, b, l, s in rows if m == mix and l == layout]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=layout)
            ax.set_title(mix)
            ax.set_xlabel("budget (MiB)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("tokens served per step")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
