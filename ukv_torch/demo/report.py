"""Output of the demo: a progress bar, the summary table, and the occupancy plot."""
from __future__ import annotations

import sys
from typing import Dict, List

COLUMNS = [
    ("layout", "layout"), ("logical_blocks", "logical blks"), ("requests_completed", "completed"), ("steps", "steps"),
    ("tokens_per_step", "served tok/step"), ("computed_tokens_per_step", "computed tok/step"),
    ("peak_swa_rows", "peak SWA rows"), ("mean_swa_rows", "mean SWA rows"),
    ("peak_compress_rows", "peak cmp rows"), ("mean_util", "mean util"),
    ("util_at_first_refusal", "util @1st refusal"),
    ("fullest_tensor_at_first_refusal", "fullest tensor @1st refusal"), ("prefix_hit_rate", "hit rate"),
    ("hit_rate_with_tier", "hit rate with tier"), ("tier_loaded_bytes_per_step", "tier loaded B/step"),
    ("tier_saved_bytes_per_step", "tier saved B/step"), ("borrows", "borrows"),
    ("swa_evictions", "SWA evict"), ("reclaimed_slots", "reclaimed"), ("compress_evictions", "cached reused"), ("preemptions", "preempt"),
    ("admission_refusals", "refusals"), ("mean_stranded_rows_at_refusal", "stranded rows"),
    ("checked_indices", "indices checked"), ("decode_graph_replays", "graph replays"), ("mismatches", "mismatches"),
]


class Progress:
    """A one-line progress bar on a terminal; a line per 10% otherwise."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.last_decile = label, total, -1
        self.tty = sys.stderr.isatty()

    def update(self, done: int, note: str = "") -> None:
        frac = min(1.0, done / max(1, self.total))
        if self.tty:
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.label:>10} [{bar:<30}] {done}/{self.total} {note}   ")
            sys.stderr.flush()
        elif int(frac * 10) > self.last_decile:
            self.last_decile = int(frac * 10)
            sys.stderr.write(f"{self.label:>10} {int(frac * 100):3d}% {note}\n")

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


# What the less obvious columns count.
LEGEND = """served tok/step: prompt and generated tokens finished per step (the capacity figure);
computed tok/step: tokens the model ran (a prefix hit is served without being computed);
hit rate: prompt blocks found in the prefix cache / prompt blocks looked up at admission
(a repeat of a prompt whose cached blocks were all evicted or never complete finds none);
hit rate with tier: the same with the blocks loaded from the host tier counted as found;
util @1st refusal: rows in use / all rows when admission first said no ('-': it never did);
refusals: admissions that had to wait; preempt: running requests stopped to make room."""


def outcome(rows: List[Dict[str, object]], budget_mib: float) -> str:
    """The result in two lines: each layout's served tokens per step against the
    first one's (the static split when it ran), and the integrity verdict."""
    base = rows[0]
    others = [f"{r['layout']} {r['tokens_per_step'] / max(base['tokens_per_step'], 1e-9):.2f}x" for r in rows[1:]]
    mismatches = sum(int(r["mismatches"]) for r in rows)
    checked = sum(int(r["checked_indices"]) for r in rows)
    verdict = "PASS" if mismatches == 0 else "FAIL"
    head = (f"served tokens per step against the {base['layout']} in the same {budget_mib:g} MiB: "
            + (", ".join(others) if others else "one layout, nothing to compare"))
    return f"{head}\n{mismatches} index mismatches in {checked:,} checked: {verdict}"


def table(rows: List[Dict[str, object]]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join("-" if r.get(k) is None else str(r.get(k)) for k, _ in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep] + body)


def plot(results, path: str) -> bool:
    """Pool occupancy per role over time, one panel per layout. False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.6 * len(results)), sharex=True, squeeze=False)
    for ax, res in zip(axes[:, 0], results):
        s = res.series
        bs_rows_swa = res.plan.num_swa_blocks * res.plan.config.block_size
        ax.plot([v / max(1, bs_rows_swa) for v in s["swa_rows"]], label="SWA rows in use / SWA region")
        ax.plot(s["util"], label="all rows in use / all rows")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(res.name)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle("KV pool occupancy per role")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
