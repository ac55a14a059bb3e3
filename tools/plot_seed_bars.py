#!/usr/bin/env python3
"""Grouped bar chart (SVG, standard library only) of one score per run seed for several recipes,
with a goal line: the long-context study's passkey-at-16x figures (docs/long-context.md).

usage: plot_seed_bars.py OUT.svg TITLE GOAL "recipe label:v1,v2,..." ["label:..." ...]
  e.g. plot_seed_bars.py docs/img/x.svg "passkey at 16x" 0.95 "2x:0.863,0.975,0.975,0.675"
Every recipe must give one value in [0, 1] per seed, seeds 1..N in order.
"""
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def parse(arg):
    label, _, values = arg.rpartition(":")
    if not label or not values:
        raise SystemExit(f"expected 'label:v1,v2,...', got {arg!r}")
    try:
        vals = [float(v) for v in values.split(",")]
    except ValueError:
        raise SystemExit(f"{arg!r}: values must be numbers")
    if any(not 0 <= v <= 1 for v in vals):
        raise SystemExit(f"{arg!r}: values must lie in [0, 1]")
    return label, vals


def main(argv):
    if len(argv) < 5:
        raise SystemExit(__doc__)
    out, title, goal = argv[1], argv[2], float(argv[3])
    recipes = [parse(a) for a in argv[4:]]
    n = len(recipes[0][1])
    if any(len(v) != n for _, v in recipes):
        raise SystemExit("every recipe needs the same number of seeds")
    # The legend below the plot takes a row per recipe; the goal's label sits right of the plot,
    # clear of the bars' value labels.
    W, L, R, T, ph = 640, 56, 64, 40, 210
    B = 42 + 16 * len(recipes)
    H = T + ph + B
    pw = W - L - R
    group = pw / n
    bar = group * 0.8 / len(recipes)
    y = lambda v: T + ph * (1 - v)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{esc(title)}</text>']
    for k in range(6):
        v = k / 5
        s.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for i in range(n):
        x0 = L + i * group + group * 0.1
        for j, (_, vals) in enumerate(recipes):
            x = x0 + j * bar
            s.append(f'<rect x="{x:.1f}" y="{y(vals[i]):.1f}" width="{bar * 0.92:.1f}" height="{ph * vals[i]:.1f}" '
                     f'fill="{COLORS[j % len(COLORS)]}"><title>{vals[i]:.3f}</title></rect>')
            s.append(f'<text x="{x + bar * 0.46:.1f}" y="{y(vals[i]) - 3:.1f}" text-anchor="middle" font-size="9">'
                     f'{vals[i]:.2f}</text>')
        s.append(f'<text x="{L + (i + 0.5) * group:.1f}" y="{T + ph + 16}" text-anchor="middle">seed {i + 1}</text>')
    s.append(f'<line x1="{L}" y1="{y(goal):.1f}" x2="{W - R}" y2="{y(goal):.1f}" stroke="black" stroke-dasharray="5,4"/>')
    s.append(f'<text x="{W - R + 4}" y="{y(goal) + 4:.1f}" font-size="10">goal {goal:g}</text>')
    for j, (label, vals) in enumerate(recipes):
        yy = T + ph + 34 + 16 * j
        mean = sum(vals) / len(vals)
        s.append(f'<rect x="{L}" y="{yy - 9}" width="10" height="10" fill="{COLORS[j % len(COLORS)]}"/>')
        s.append(f'<text x="{L + 16}" y="{yy}">{esc(label)} (mean {mean:.3f}, min {min(vals):.3f})</text>')
    s.append("</svg>")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(s) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main(sys.argv)
