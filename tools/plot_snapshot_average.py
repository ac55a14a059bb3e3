#!/usr/bin/env python3
"""SVG plot of study 7 (docs/long-context.md): passkey at 16x of each kept snapshot of a run
against its training step (solid), and of the average of those snapshots (dashed, same colour),
one panel per group of runs (standard library only; the panel drawing of plot_long_context.py).

usage: plot_snapshot_average.py OUT.svg "TITLE=RUN_DIR,RUN_DIR,..." ["TITLE=..." ...]
A run directory is scripts/long_context_average.sh's OUT run with LC_EACH=1: eval-snap-<step>/
and eval-final/ hold the snapshots' passkey-16x.json, eval-average/ the average's; the steps
are read from the snap-<step> directories.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_long_context import COLORS, H, Panel, esc, write_svg  # noqa: E402


def accuracy(path):
    a = json.load(open(path))["accuracy"]
    return sum(r[0] for r in a) / len(a)


def run_curve(run):
    steps = sorted(int(d[5:]) for d in os.listdir(run) if d.startswith("snap-") and d[5:].isdigit())
    if not steps:
        sys.exit(f"{run}: no snap-<step> directories")
    ys = []
    for i, s in enumerate(steps):
        d = "eval-final" if i == len(steps) - 1 else f"eval-snap-{s}"
        f = os.path.join(run, d, "passkey-16x.json")
        if not os.path.exists(f):
            sys.exit(f"{f}: missing (run scripts/long_context_average.sh with LC_EACH=1)")
        ys.append(accuracy(f))
    return steps, ys, accuracy(os.path.join(run, "eval-average", "passkey-16x.json"))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    panels = []
    for arg in sys.argv[2:]:
        title, _, runs = arg.partition("=")
        if not runs:
            sys.exit(f"expected TITLE=RUN_DIR,..., got {arg!r}")
        curves = [(r, *run_curve(r)) for r in runs.split(",")]
        xs = [s for c in curves for s in c[1]]
        p = Panel(title, "training step (snapshot)", "passkey accuracy at 16x", xs, [0, 1], logx=False)
        for i, (run, steps, ys, avg) in enumerate(curves):
            color = COLORS[i % len(COLORS)]
            name = os.path.basename(os.path.normpath(run))
            p.line(steps, ys, "", color)
            # The legend in the lower left, which the curves leave free (they start high).
            p.items.append(f'<text x="{p.px(xs and min(xs)) + 8:.1f}" y="{H - 64 - 14 * (len(curves) - 1 - i):.1f}" '
                           f'fill="{color}">{esc(name)} (average {avg:.3f})</text>')
            p.items.append(f'<line x1="{p.px(steps[0]):.1f}" y1="{p.py(avg):.1f}" x2="{p.px(steps[-1]):.1f}" '
                           f'y2="{p.py(avg):.1f}" stroke="{color}" stroke-width="2" stroke-dasharray="5 4"/>')
        panels.append(p)
    write_svg(sys.argv[1], panels)


if __name__ == "__main__":
    main()
