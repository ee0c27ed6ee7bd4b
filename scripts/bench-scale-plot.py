"""Draws one part of bench-scale.sh: `bench-scale-plot.py table.txt out.png part`.

The table is bench-scale.sh's: a header and rows of ` | `-separated
columns, the first the quantity varied. Both axes are logarithmic for
tables (a straight line of slope 1 is linear growth).
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

table, out, part = sys.argv[1:]
lines = [line.split(" | ") for line in open(table).read().strip().splitlines()]
head, rows = lines[0], lines[1:]
x = [float(r[0]) for r in rows]
# Per part: the columns of each panel and the panel's unit.
panels = {
    "tables": [([1, 2, 3], "seconds"), ([4, 5], "MB")],
    "sources": [([1, 3], "MB"), ([2, 4], "% of a core")],
    "widths": [([4], "MB/s"), ([5], "MB")],
}[part]
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, (columns, unit) in zip(axes, panels):
    for c in columns:
        ax.plot(x, [float(r[c].split(",")[0]) for r in rows], marker="o", label=head[c])
    ax.set_xscale("log")
    if part == "tables":
        ax.set_yscale("log")
    ax.set_xlabel(head[0])
    ax.set_ylabel(unit)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(f"walbridge: cost against {head[0]}")
fig.tight_layout()
fig.savefig(out, dpi=90)
print(f"drew {out}")
