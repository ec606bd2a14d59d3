#!/usr/bin/env python3
"""Draws trace_replay's --json output as a picture: prefix hit rate against
the cache's memory budget, one line per layout, and the trace's ceiling.

Usage: trace_replay ... --json > runs.json; plot_hit_rate.py runs.json hit_rate.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def main(runs_path, png_path):
    runs = json.load(open(runs_path))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for layout in dict.fromkeys(r["layout"] for r in runs):
        mine = sorted((r for r in runs if r["layout"] == layout), key=lambda r: r["budget_bytes"])
        ax.plot([r["budget_bytes"] / 2**30 for r in mine], [100 * r["hit_rate"] for r in mine], marker="o",
                label=f"{layout} ({mine[0]['block_bytes'] // 1024} KiB a block)")
    ax.axhline(100 * runs[0]["ceiling_rate"], color="gray", linestyle="--", label="ceiling (unbounded cache)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache memory (GiB)")
    ax.set_ylabel("prompt tokens served from the cache (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Prefix hit rate per GiB, {runs[0]['requests']} requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
