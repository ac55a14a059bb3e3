#!/usr/bin/env python3
"""SVG plots of `k3cpp eval --task ... --json` results (standard library only).

usage: plot_long_context.py OUT.svg RESULT.json [RESULT.json ...]

A task grid (passkey, vartrack, mqar) becomes one accuracy curve per depth against length, one
panel per result file; loss-by-position becomes loss against position, one curve per length;
every file also gets a panel of decode-state bytes (measured and formula) and peak RSS growth
against length. Lengths are on a log2 axis.
"""
import json
import math
import sys

W, H, PAD = 520, 300, 56
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Panel:
    def __init__(self, title, xlabel, ylabel, xs, ys, logx=True, logy=False):
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.logx, self.logy = logx, logy
        fx = (lambda v: math.log2(v)) if logx else (lambda v: v)
        fy = (lambda v: math.log10(v)) if logy else (lambda v: v)
        xv = [fx(x) for x in xs]
        yv = [fy(y) for y in ys if (y > 0 or not logy)]
        self.fx, self.fy = fx, fy
        self.x0, self.x1 = min(xv), max(xv)
        self.y0, self.y1 = (min(yv), max(yv)) if yv else (0, 1)
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1
        self.items = []

    def px(self, x):
        return PAD + (self.fx(x) - self.x0) / (self.x1 - self.x0) * (W - 2 * PAD)

    def py(self, y):
        return H - PAD - (self.fy(y) - self.y0) / (self.y1 - self.y0) * (H - 2 * PAD)

    def line(self, xs, ys, label, color, dash=""):
        pts = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in zip(xs, ys) if y > 0 or not self.logy)
        self.items.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" {dash} points="{pts}"/>')
        for x, y in zip(xs, ys):
            if y > 0 or not self.logy:
                self.items.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="3" fill="{color}"/>')
        n = sum(1 for i in self.items if i.startswith("<text class=\"legend\""))
        self.items.append(f'<text class="legend" x="{W - PAD - 150}" y="{PAD + 14 * n}" fill="{color}">{esc(label)}</text>')

    def svg(self, oy):
        out = [f'<g transform="translate(0,{oy})">', f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
               f'<text x="{W / 2}" y="20" text-anchor="middle" font-weight="bold">{esc(self.title)}</text>',
               f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
               f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
               f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">{esc(self.xlabel)}</text>',
               f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">{esc(self.ylabel)}</text>']
        for k in range(5):
            fy = self.y0 + (self.y1 - self.y0) * k / 4
            y = H - PAD - (fy - self.y0) / (self.y1 - self.y0) * (H - 2 * PAD)
            v = 10 ** fy if self.logy else fy
            out.append(f'<text x="{PAD - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{v:.3g}</text>')
        k = math.ceil(self.x0)
        while k <= self.x1 + 1e-9:
            x = PAD + (k - self.x0) / (self.x1 - self.x0) * (W - 2 * PAD)
            v = 2 ** k if self.logx else k
            out.append(f'<text x="{x:.1f}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">{round(v) if v >= 1 else v}</text>')
            k += 1 if self.logx else max(1, (self.x1 - self.x0) / 5)
        out += self.items
        out.append("</g>")
        return "\n".join(out)


def panels_for(path):
    r = json.load(open(path))
    name = r.get("label") or r["model"]
    out = []
    lengths = r["lengths"]
    if "accuracy" in r:
        p = Panel(f'{r["task"]}: {name}', "length (tokens)", "accuracy", lengths, [0, 1])
        for i, d in enumerate(r["depths"]):
            p.line(lengths, r["accuracy"][i], f"depth {d:g}", COLORS[i % len(COLORS)])
        out.append(p)
    if "curves" in r:
        allx = [c["bucket"] * (i + 1) for c in r["curves"] for i in range(len(c["loss_nats"]))]
        ally = [v for c in r["curves"] for v in c["loss_nats"]]
        p = Panel(f"loss by position: {name}", "position (tokens)", "loss (nats)", allx, ally)
        for i, c in enumerate(r["curves"]):
            xs = [c["bucket"] * (k + 1) for k in range(len(c["loss_nats"]))]
            p.line(xs, c["loss_nats"], f'length {c["length"]}', COLORS[i % len(COLORS)])
        out.append(p)
    m = r["memory"]
    ys = [x["state_bytes"] for x in m] + [x["peak_rss_growth_bytes"] for x in m if x["peak_rss_growth_bytes"] > 0]
    p = Panel(f"memory: {name}", "length (tokens)", "bytes", lengths, ys, logy=True)
    p.line(lengths, [x["state_bytes"] for x in m], "decode state", COLORS[0])
    p.line(lengths, [x["state_formula_bytes"] for x in m], "formula", COLORS[2], 'stroke-dasharray="4 3"')
    p.line(lengths, [max(x["peak_rss_growth_bytes"], 1) for x in m], "peak RSS growth", COLORS[1])
    out.append(p)
    return out


def write_svg(path, panels):
    """Stacks the panels vertically into one SVG, written under a temporary name, then renamed."""
    import os
    body = "\n".join(p.svg(i * H) for i, p in enumerate(panels))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H * len(panels)}" '
           f'font-family="sans-serif" font-size="12">\n{body}\n</svg>\n')
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(svg)
    os.replace(tmp, path)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    write_svg(sys.argv[1], [p for f in sys.argv[2:] for p in panels_for(f)])


if __name__ == "__main__":
    main()
