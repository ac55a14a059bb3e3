#!/usr/bin/env python3
"""Plots and tables of the load-balancing study (docs/balancing.md, scripts/balancing_study.sh).

Reads, for every run <variant>-<method> of the study directory:
  RUNS/<variant>-<method>/metrics.jsonl   (k3cpp train: per-step MaxVio per MoE layer, loads at
                                           logged steps, eval records)
  RUNS/<variant>-<method>.eval.json       (k3cpp eval --moving-qb --json: held-out loss, routing
                                           statistics, windows of the trained length)
  RUNS/<variant>-<method>.long.json       (the same with windows of 1024 tokens; optional)
and writes into OUT (Python standard library only, no plotting package):
  maxvio-<variant>.svg      per-batch MaxVio over steps, one panel per MoE layer, one line per
                            method, the random-routing noise floor dashed
  heat-<variant>.svg        per-expert load (log2 of load / mean) over the logged steps and on
                            the held-out set, first and last MoE layer, one strip per method
                            (pixels as an embedded PNG, labels as SVG text)
  loaddist-<variant>.svg    held-out load of every expert, sorted, per method and layer
  results.md                the tables (also written between the study-table markers of --doc),
                            including the sequence-level table (static vs Moving QB selection)
  results.json              the same figures, machine-readable
"""
import argparse
import base64
import json
import math
import os
import struct
import sys
import zlib

METHOD_COLORS = {
    "qb-exact": "#d62728", "qb-hist": "#ff7f0e", "sign": "#1f77b4", "sign-1e-2": "#393b79",
    "aux-1e-2": "#2ca02c", "aux-1e-1": "#17becf", "aux-1": "#9467bd", "none": "#7f7f7f",
}
FALLBACK = ["#e377c2", "#bcbd22", "#393b79", "#637939", "#8c6d31"]


def color_of(method, i):
    return METHOD_COLORS.get(method, FALLBACK[i % len(FALLBACK)])


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------- data

def load_run(runs, name):
    steps, evals, loads, start = [], [], [], None
    path = os.path.join(runs, name, "metrics.jsonl")
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            t = r.get("type")
            if t == "step":
                steps.append(r)
                if "loads" in r:
                    loads.append((r["step"], r["loads"]))
            elif t == "eval":
                evals.append(r)
            elif t == "start":
                start = r
    with open(os.path.join(runs, name + ".eval.json")) as f:
        ev = json.load(f)
    long_path = os.path.join(runs, name + ".long.json")
    lg = json.load(open(long_path)) if os.path.exists(long_path) else None
    bias = router_biases(os.path.join(runs, name, "checkpoint"))
    return {"steps": steps, "evals": evals, "loads": loads, "start": start, "eval": ev, "long": lg, "bias": bias}


def router_biases(ckpt_dir):
    """The e_score_correction_bias of every MoE layer from checkpoint/model.safetensors (f32 or
    bf16; single-file checkpoints): {layer: [E floats]}. Empty when absent."""
    path = os.path.join(ckpt_dir, "model.safetensors")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if not name.endswith("block_sparse_moe.gate.e_score_correction_bias"):
                continue
            layer = int(name.split(".layers.")[1].split(".")[0])
            a, b = t["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            if t["dtype"] == "F32":
                out[layer] = list(struct.unpack("<%df" % (len(raw) // 4), raw))
            elif t["dtype"] == "BF16":
                out[layer] = [struct.unpack("<f", b"\x00\x00" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    return out


def spread(v):
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / len(v)), max(v) - min(v)


def seq_figures(ev):
    """Static vs Moving QB figures of one evaluation: per MoE layer lists."""
    if ev is None:
        return None
    mq = ev.get("moving_qb", {}).get("layers", [])
    return {
        "seq_len": ev["seq_len"], "loss": ev["loss"], "bpb": ev["bpb"],
        "maxvio": [L["maxvio"] for L in ev["layers"]],
        "seq_maxvio": [L["seq_maxvio_mean"] for L in ev["layers"]],
        "overflow_cf125": [L["overflow_cf125"] for L in ev["layers"]],
        "mqb_maxvio": [L["maxvio"] for L in mq],
        "mqb_seq_maxvio": [L["seq_maxvio_mean"] for L in mq],
        "mqb_overflow_cf125": [L["overflow_cf125"] for L in mq],
        "mqb_lambda": ev.get("moving_qb", {}).get("lambda"), "mqb_chunk": ev.get("moving_qb", {}).get("chunk"),
        "random_seq_maxvio": ev["random"]["seq_maxvio"], "random_maxvio": ev["random"]["maxvio"],
        "random_overflow_cf125": ev["random"]["overflow_cf125"],
    }


def summarize(run, tail):
    steps, ev = run["steps"], run["eval"]
    n_layers = len(ev["layers"])
    last = steps[-tail:] if steps else []
    batch_tail = [sum(s["maxvio"][l] for s in last) / max(1, len(last)) for l in range(n_layers)]
    train_s = sum(s["seconds"] for s in steps)
    return {
        "loss": ev["loss"], "bpb": ev["bpb"],
        "train_loss_tail": sum(s["loss"] for s in last) / max(1, len(last)),
        "layers": [L["layer"] for L in ev["layers"]],
        "heldout_maxvio": [L["maxvio"] for L in ev["layers"]],
        "zero_experts": [L["zero_experts"] for L in ev["layers"]],
        "seq_maxvio": [L["seq_maxvio_mean"] for L in ev["layers"]],
        "seq_maxvio_max": [L["seq_maxvio_max"] for L in ev["layers"]],
        "dropped": sum(L["dropped"] for L in ev["layers"]),
        "slots": sum(L["slots"] for L in ev["layers"]),
        "overflow_cf125": [L["overflow_cf125"] for L in ev["layers"]],
        "overflow_cf1": [L["overflow_cf1"] for L in ev["layers"]],
        "batch_maxvio_tail": batch_tail,
        "batch_maxvio_peak": [max(s["maxvio"][l] for s in steps) for l in range(n_layers)],
        "train_seconds": train_s,
        "steps": len(steps),
        "random": ev["random"],
        "targets": ev["targets"],
        "seq": {"short": seq_figures(ev), "long": seq_figures(run["long"])},
        "bias_std": [spread(run["bias"][l])[0] if l in run["bias"] else 0.0 for l in (L["layer"] for L in ev["layers"])],
        "bias_range": [spread(run["bias"][l])[1] if l in run["bias"] else 0.0 for l in (L["layer"] for L in ev["layers"])],
    }


# ---------------------------------------------------------------- SVG line plots

def nice_log_ticks(lo, hi):
    ticks = []
    e = math.floor(math.log10(lo))
    mantissas = (1, 2, 5) if math.log10(hi / lo) <= 2.5 else (1,)  # wide ranges: decades only
    while 10 ** e <= hi * 1.0001:
        for m in mantissas:
            v = m * 10 ** e
            if lo * 0.9999 <= v <= hi * 1.0001:
                ticks.append(v)
        e += 1
    return ticks


def fmt_tick(v):
    if v >= 1:
        return "%g" % v
    return ("%.3f" % v).rstrip("0").rstrip(".")


def line_panels(title, panels, series_names, colors, xlabel, ylabel, floor=None, width=1100, panel_h=240,
                ylog=True, legend_note=""):
    """panels: list of (panel title, {name: [(x, y), ...]}). Returns SVG text."""
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    pw = (width - 40) / cols
    top = 60
    H = top + rows * (panel_h + 50) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (width, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>' % (20, esc(title))]
    # Legend.
    lx = 20
    for i, n in enumerate(series_names):
        out.append('<line x1="%d" y1="40" x2="%d" y2="40" stroke="%s" stroke-width="2.5"/>' % (lx, lx + 22, colors[i]))
        out.append('<text x="%d" y="44">%s</text>' % (lx + 27, esc(n)))
        lx += 34 + 7 * len(n) + 14
    if floor is not None:
        out.append('<line x1="%d" y1="40" x2="%d" y2="40" stroke="black" stroke-dasharray="4,3"/>' % (lx, lx + 22))
        out.append('<text x="%d" y="44">random routing%s</text>' % (lx + 27, esc(legend_note)))
    ys = [y for _, d in panels for pts in d.values() for _, y in pts if y is not None and (y > 0 or not ylog)]
    xs = [x for _, d in panels for pts in d.values() for x, _ in pts]
    if floor is not None:
        ys.append(floor)
    if not ys:
        return "\n".join(out + ["</svg>"])
    if ylog:
        ylo = min(ys) / 1.3
        yhi = max(ys) * 1.3
        f = lambda v: (math.log10(max(v, ylo)) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
        ticks = nice_log_ticks(ylo, yhi)
    else:
        ylo, yhi = min(0.0, min(ys)), max(ys) * 1.1
        f = lambda v: (v - ylo) / (yhi - ylo)
        step = 10 ** math.floor(math.log10((yhi - ylo) / 4))
        ticks = [ylo + i * step for i in range(int((yhi - ylo) / step) + 1)]
    xlo, xhi = min(xs), max(xs)
    for p, (ptitle, data) in enumerate(panels):
        r, c = divmod(p, cols)
        x0 = 20 + c * pw + 50
        y0 = top + r * (panel_h + 50) + 20
        w = pw - 70
        h = panel_h - 20
        X = lambda x: x0 + (x - xlo) / max(1e-9, xhi - xlo) * w
        Y = lambda y: y0 + h - f(y) * h
        out.append('<text x="%.1f" y="%.1f" font-weight="bold">%s</text>' % (x0, y0 - 6, esc(ptitle)))
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>' % (x0, y0, w, h))
        for t in ticks:
            yy = Y(t)
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>' % (x0, yy, x0 + w, yy))
            out.append('<text x="%.1f" y="%.1f" text-anchor="end">%s</text>' % (x0 - 4, yy + 4, fmt_tick(t)))
        nx = 6
        for i in range(nx + 1):
            xv = xlo + (xhi - xlo) * i / nx
            out.append('<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>' % (X(xv), y0 + h + 14, round(xv)))
        out.append('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>' % (x0 + w / 2, y0 + h + 28, esc(xlabel)))
        out.append('<text x="%.1f" y="%.1f" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>'
                   % (x0 - 42, y0 + h / 2, x0 - 42, y0 + h / 2, esc(ylabel)))
        if floor is not None:
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-dasharray="4,3"/>'
                       % (x0, Y(floor), x0 + w, Y(floor)))
        for i, n in enumerate(series_names):
            pts = data.get(n)
            if not pts:
                continue
            coords = " ".join("%.1f,%.1f" % (X(x), Y(y)) for x, y in pts if y is not None)
            out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.4" stroke-opacity="0.9"/>'
                       % (coords, colors[i]))
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- heat maps (PNG inside SVG)

def png_bytes(w, h, rgb_rows):
    raw = b"".join(b"\x00" + bytes(row) for row in rgb_rows)
    def chunk(t, d):
        c = struct.pack(">I", len(d)) + t + d
        return c + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def load_color(ratio, span=3.0):
    """load / mean -> RGB: black for no token; blue (under) - white (mean) - red (over), log2 scale."""
    if ratio <= 0:
        return (0, 0, 0)
    v = max(-1.0, min(1.0, math.log2(ratio) / span))
    if v >= 0:
        return (255, int(255 * (1 - v)), int(255 * (1 - v)))
    return (int(255 * (1 + v)), int(255 * (1 + v)), 255)


def heat_svg(title, strips, E, cell_w=1, row_h=10, label_w=170):
    """strips: list of (label, [(row label, loads[E])...]) -> SVG with one PNG per strip."""
    img_w = E * cell_w
    width = label_w + img_w + 40
    y = 50
    parts = []
    for label, rows in strips:
        h = row_h * len(rows)
        pix = []
        for _, loads in rows:
            mean = sum(loads) / len(loads) if loads else 0
            row = []
            for j in range(E):
                col = load_color(loads[j] / mean if mean > 0 else 0)
                row.extend(col * cell_w)
            for _ in range(row_h):
                pix.append(row)
        data = base64.b64encode(png_bytes(img_w, h, pix)).decode()
        parts.append('<text x="10" y="%d" font-weight="bold">%s</text>' % (y + 11, esc(label)))
        for i, (rl, _) in enumerate(rows):
            parts.append('<text x="%d" y="%d" text-anchor="end" font-size="9">%s</text>'
                         % (label_w - 4, y + i * row_h + row_h - 1, esc(rl)))
        parts.append('<image x="%d" y="%d" width="%d" height="%d" preserveAspectRatio="none" '
                     'image-rendering="pixelated" href="data:image/png;base64,%s"/>' % (label_w, y, img_w, h, data))
        y += h + 14
    # Colour bar.
    bar = []
    n = 200
    row = []
    for i in range(n):
        v = -3 + 6 * i / (n - 1)
        row.extend(load_color(2 ** v))
    for _ in range(10):
        bar.append(row)
    data = base64.b64encode(png_bytes(n, 10, bar)).decode()
    parts.append('<image x="%d" y="%d" width="%d" height="10" href="data:image/png;base64,%s"/>' % (label_w, y + 4, n, data))
    for v, lab in ((-3, "1/8"), (0, "1"), (3, "8")):
        parts.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="9">%s</text>'
                     % (label_w + (v + 3) / 6 * (n - 1), y + 26, lab))
    parts.append('<text x="%d" y="%d" font-size="10">load / mean load (log scale); black: no token; '
                 'experts by id, left to right</text>' % (label_w + n + 12, y + 13))
    H = y + 40
    head = ['<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="%d" '
            'height="%d" font-family="sans-serif" font-size="11">' % (width, H),
            '<rect width="100%" height="100%" fill="white"/>',
            '<text x="10" y="24" font-size="15" font-weight="bold">%s</text>' % esc(title)]
    return "\n".join(head + parts + ["</svg>"])


# ---------------------------------------------------------------- tables

def f3(v):
    return "%.3f" % v


def f2(v):
    return "%.2f" % v


def tables(variants, methods, S):
    md = []
    for v in variants:
        present = [m for m in methods if (v, m) in S]
        if not present:
            continue
        any_s = S[(v, present[0])]
        rnd = any_s["random"]
        layers = any_s["layers"]
        md.append("#### %s (MoE layers %s)\n" % (v, ", ".join(str(l) for l in layers)))
        md.append("| method | held-out loss | bits/byte | train loss, last 8 steps | held-out MaxVio (worst layer) "
                  "| experts with no token (all layers) | within-sequence MaxVio (worst layer) | batch MaxVio, last 8 "
                  "steps (worst layer) | peak batch MaxVio | overflow at cf 1.25 (worst layer) | dropped | train s |")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for m in present:
            s = S[(v, m)]
            md.append("| %s | %.4f | %.4f | %.4f | %s | %d | %s | %s | %s | %.1f%% | %d | %.0f |" % (
                m, s["loss"], s["bpb"], s["train_loss_tail"], f2(max(s["heldout_maxvio"])), sum(s["zero_experts"]),
                f2(max(s["seq_maxvio"])), f2(max(s["batch_maxvio_tail"])), f2(max(s["batch_maxvio_peak"])),
                100 * max(s["overflow_cf125"]), s["dropped"], s["train_seconds"]))
        md.append("| random routing | | | | %s | %.1f | %s | %s | | %.1f%% | | |" % (
            f3(rnd["maxvio"]), rnd["zero_experts"] * len(layers), f2(rnd["seq_maxvio"]), f2(rnd["batch_maxvio"]),
            100 * rnd["overflow_cf125"]))
        md.append("")
        md.append("Per layer (held-out MaxVio / experts with no token / within-sequence MaxVio / std of the final "
                  "router bias):\n")
        md.append("| method | " + " | ".join("layer %d" % l for l in layers) + " |")
        md.append("|---|" + "---|" * len(layers))
        for m in present:
            s = S[(v, m)]
            md.append("| %s | " % m + " | ".join("%s / %d / %s / %.3f" % (
                f2(s["heldout_maxvio"][i]), s["zero_experts"][i], f2(s["seq_maxvio"][i]), s["bias_std"][i])
                for i in range(len(layers))) + " |")
        md.append("")
    return "\n".join(md)


def pair(a, b, pct=False):
    """'static -> moving' for the first MoE layer, then the worst layer in brackets."""
    if not a or not b:
        return "-"
    f = (lambda v: "%.1f%%" % (100 * v)) if pct else (lambda v: "%.2f" % v)
    return "%s → %s (%s → %s)" % (f(a[0]), f(b[0]), f(max(a)), f(max(b)))


def seq_table(variants, methods, S):
    md = []
    for v in variants:
        present = [m for m in methods if (v, m) in S and S[(v, m)]["seq"]["short"] is not None]
        if not present:
            continue
        sh0 = S[(v, present[0])]["seq"]["short"]
        lg0 = S[(v, present[0])]["seq"]["long"]
        md.append("#### %s: static selection → Moving QB selection (lambda %s, chunk %s)\n"
                  % (v, sh0["mqb_lambda"], sh0["mqb_chunk"]))
        head = ("| method | T=%d: within-sequence MaxVio | T=%d: held-out MaxVio | T=%d: overflow at cf 1.25 "
                % (sh0["seq_len"], sh0["seq_len"], sh0["seq_len"]))
        if lg0:
            head += ("| T=%d: held-out loss | T=%d: within-sequence MaxVio | T=%d: held-out MaxVio | T=%d: overflow "
                     "at cf 1.25 " % ((lg0["seq_len"],) * 4))
        md.append(head + "|")
        md.append("|---" * (4 + (4 if lg0 else 0)) + "|")
        for m in present:
            a, b = S[(v, m)]["seq"]["short"], S[(v, m)]["seq"]["long"]
            row = "| %s | %s | %s | %s " % (m, pair(a["seq_maxvio"], a["mqb_seq_maxvio"]), pair(a["maxvio"], a["mqb_maxvio"]),
                                           pair(a["overflow_cf125"], a["mqb_overflow_cf125"], True))
            if lg0:
                row += ("| %.4f | %s | %s | %s " % (b["loss"], pair(b["seq_maxvio"], b["mqb_seq_maxvio"]),
                                                    pair(b["maxvio"], b["mqb_maxvio"]),
                                                    pair(b["overflow_cf125"], b["mqb_overflow_cf125"], True))
                        if b else "| - | - | - | - ")
            md.append(row + "|")
        row = "| random routing | %.2f | %.3f | %.1f%% " % (sh0["random_seq_maxvio"], sh0["random_maxvio"],
                                                         100 * sh0["random_overflow_cf125"])
        if lg0:
            row += "| | %.2f | %.3f | %.1f%% " % (lg0["random_seq_maxvio"], lg0["random_maxvio"],
                                                 100 * lg0["random_overflow_cf125"])
        md.append(row + "|")
        md.append("")
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="study output directory (one subdirectory per run)")
    ap.add_argument("--out", required=True, help="output directory of the plots and tables")
    ap.add_argument("--variants", nargs="+", default=["dense-first", "moe-first"])
    ap.add_argument("--methods", nargs="+",
                    default=["qb-exact", "qb-hist", "sign", "aux-1e-2", "aux-1e-1", "none", "sign-1e-2", "aux-1"])
    ap.add_argument("--tail", type=int, default=8, help="steps averaged for the final batch MaxVio")
    ap.add_argument("--doc", help="markdown file whose <!-- study-table:begin/end --> block is replaced")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    runs, S = {}, {}
    for v in a.variants:
        for m in a.methods:
            name = "%s-%s" % (v, m)
            if os.path.exists(os.path.join(a.runs, name, "metrics.jsonl")) and \
               os.path.exists(os.path.join(a.runs, name + ".eval.json")):
                runs[(v, m)] = load_run(a.runs, name)
                S[(v, m)] = summarize(runs[(v, m)], a.tail)
    if not runs:
        sys.exit("balancing_plots: no complete run (metrics.jsonl + .eval.json) under %s" % a.runs)

    written = []
    for v in a.variants:
        present = [m for m in a.methods if (v, m) in runs]
        if not present:
            continue
        colors = [color_of(m, i) for i, m in enumerate(present)]
        ev0 = runs[(v, present[0])]["eval"]
        layers = [L["layer"] for L in ev0["layers"]]
        E = ev0["experts"]
        # MaxVio over steps.
        panels = []
        for li, layer in enumerate(layers):
            data = {m: [(s["step"], s["maxvio"][li]) for s in runs[(v, m)]["steps"]] for m in present}
            panels.append(("MoE layer %d" % layer, data))
        svg = line_panels("%s: MaxVio of each training batch (%d tokens), per MoE layer" % (v, ev0["batch_tokens"]),
                          panels, present, colors, "step", "MaxVio (log scale)",
                          floor=ev0["random"]["batch_maxvio"], legend_note=" (same batch)")
        p = os.path.join(a.out, "maxvio-%s.svg" % v)
        open(p, "w").write(svg)
        written.append(p)
        # Sorted held-out loads.
        panels = []
        for li, layer in enumerate(layers):
            data = {}
            for m in present:
                L = runs[(v, m)]["eval"]["layers"][li]["loads"]
                mean = sum(L) / len(L)
                srt = sorted(L, reverse=True)
                data[m] = [(i + 1, (x / mean) if x > 0 else None) for i, x in enumerate(srt)]
            panels.append(("MoE layer %d" % layer, data))
        svg = line_panels("%s: held-out load of each expert / mean load, sorted (%d tokens)" % (v, ev0["targets"]),
                          panels, present, colors, "expert rank", "load / mean (log scale)", floor=None)
        p = os.path.join(a.out, "loaddist-%s.svg" % v)
        open(p, "w").write(svg)
        written.append(p)
        # Heat maps: first and last MoE layer.
        strips = []
        for li in sorted(set([0, len(layers) - 1])):
            for m in present:
                r = runs[(v, m)]
                rows = [("step %d" % st, loads[li]) for st, loads in r["loads"]]
                rows.append(("held-out", r["eval"]["layers"][li]["loads"]))
                strips.append(("layer %d, %s" % (layers[li], m), rows))
        svg = heat_svg("%s: per-expert load over training (logged steps) and on the held-out set" % v, strips, E)
        p = os.path.join(a.out, "heat-%s.svg" % v)
        open(p, "w").write(svg)
        written.append(p)

    md = tables(a.variants, a.methods, S)
    sq = seq_table(a.variants, a.methods, S)
    if sq:
        md += ("\n**Sequence level.** Each cell: first MoE layer (where the Moving QB figures are exact), "
               "then the worst layer in brackets.\n\n" + sq)
    open(os.path.join(a.out, "results.md"), "w").write(md + "\n")
    json.dump({"%s/%s" % k: s for k, s in S.items()}, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    written += [os.path.join(a.out, "results.md"), os.path.join(a.out, "results.json")]
    if a.doc:
        text = open(a.doc).read()
        b, e = "<!-- study-table:begin -->", "<!-- study-table:end -->"
        if b in text and e in text:
            i, j = text.index(b) + len(b), text.index(e)
            text = text[:i] + "\n" + md + "\n" + text[j:]
            open(a.doc, "w").write(text)
            written.append(a.doc)
        else:
            print("balancing_plots: %s has no study-table markers; table left in results.md" % a.doc)
    for p in written:
        print("wrote", p)


if __name__ == "__main__":
    main()
