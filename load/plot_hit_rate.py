#!/usr/bin/env python3
"""Draws trace_replay's --json output as a picture: prefix hit rate against
the cache's memory budget, one line per model, layout (and eviction
policy), and the trace's ceiling. Budgets are drawn as the model's whole
layers would need them (a run of fewer layers scaled up), so runs of the
same trace at different --layers can share one picture.

Usage: trace_replay ... --json > runs.json
       plot_hit_rate.py hit_rate.png runs.json [more.json ...]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


# Each --model's layers (trace_replay's ModelShapes).
MODEL_LAYERS = {"v2-lite": 27, "v3": 61, "v3.2": 61, "kimi-k2": 61, "v4-flash": 43}


def main(png_path, *runs_paths):
    runs = [r for path in runs_paths for r in json.load(open(path))]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    policies = {r["eviction"] for r in runs}
    models = list(dict.fromkeys(r["model"] for r in runs))
    for line in dict.fromkeys((r["model"], r["layout"], r["eviction"]) for r in runs):
        mine = sorted((r for r in runs if (r["model"], r["layout"], r["eviction"]) == line),
                      key=lambda r: r["budget_bytes"])
        whole = MODEL_LAYERS[line[0]] / mine[0]["layers"]  # the model's layers over the run's
        name = ", ".join(part for part, shown in zip(line, (len(models) > 1, True, len(policies) > 1)) if shown)
        per_token = mine[0]["block_bytes"] * whole / mine[0].get("tokens_per_block", 64)
        ax.plot([r["budget_bytes"] * whole / 2**30 for r in mine], [100 * r["hit_rate"] for r in mine],
                marker="o", label=f"{name} ({per_token / 1024:.1f} KiB a token{' + points' if line[0] == 'v4-flash' else ''})")
    # One ceiling per kind of cache: a V4 prefix restores only where a
    # restore point was stored, so its ceiling is lower.
    ceilings = dict.fromkeys((r["model"] == "v4-flash", r["ceiling_rate"]) for r in runs)
    for (v4, rate), style in zip(ceilings, ("--", ":")):
        ax.axhline(100 * rate, color="gray", linestyle=style,
                   label="ceiling, restore points (unbounded cache)" if v4 else "ceiling (unbounded cache)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"cache memory for all of {' / '.join(models)}'s layers (GiB)")
    ax.set_ylabel("prompt tokens served from the cache (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Prefix hit rate per GiB, {runs[0]['requests']} requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
