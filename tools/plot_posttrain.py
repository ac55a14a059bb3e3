#!/usr/bin/env python3
"""Plots and the report of the post-training demonstration (standard library only: SVG).

usage: plot_posttrain.py OUT.svg METRICS.jsonl [METRICS.jsonl ...]
       plot_posttrain.py --report REPORT.json DEMO_DIR T_PRETRAIN T_SFT T_RL T_RL_VARIANTS T_EVAL
       plot_posttrain.py --edge REPORT.json EDGE_DIR T_CHECKS T_RL T_EVAL

The first form draws, from k3cpp sft / rl metrics.jsonl files: the SFT loss; per RL run the
mean reward and the share correct per step; the mean response length per effort level and the
share over budget per step; the wall time of each step. The second gathers the demo's
evaluations (eval-{sft,rl}-tool{0,1}.json) and RL metrics into one JSON report and prints its
tables in Markdown. The third is the edge run's report (scripts/posttrain_edge.sh): SFT vs RL
pass@1 on the edge band from the per-problem counts of eval-edge-{sft,rl}.json, each with its
standard error clustered by problem (sd of the per-problem pass rates / sqrt(problems)) and
the paired difference RL - SFT with its standard error (the same problems, the same draws).
"""
import math
import json
import os
import sys

W, H, PAD = 460, 260, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(x0, y0, title, series, ylabel):
    """series: [(label, [(x, y)...])] -> SVG elements of one panel at (x0, y0)."""
    pts = [p for _, s in series for p in s]
    out = [f'<g transform="translate({x0},{y0})">',
           f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">{esc(title)}</text>']
    if not pts:
        out.append(f'<text x="{W/2}" y="{H/2}" text-anchor="middle" font-size="11">no data</text></g>')
        return out
    xmin, xmax = min(p[0] for p in pts), max(p[0] for p in pts)
    ymin, ymax = min(p[1] for p in pts), max(p[1] for p in pts)
    if xmax == xmin:
        xmax = xmin + 1
    if ymax == ymin:
        ymax = ymin + 1
    fx = lambda x: PAD + (x - xmin) / (xmax - xmin) * (W - 2 * PAD)
    fy = lambda y: H - PAD + 10 - (y - ymin) / (ymax - ymin) * (H - 2 * PAD)
    out.append(f'<rect x="{PAD}" y="{PAD-10}" width="{W-2*PAD}" height="{H-2*PAD}" fill="none" stroke="#888"/>')
    for v in (ymin, (ymin + ymax) / 2, ymax):
        out.append(f'<text x="{PAD-4}" y="{fy(v)+4}" text-anchor="end" font-size="10">{v:.3g}</text>')
    for v in (xmin, xmax):
        out.append(f'<text x="{fx(v)}" y="{H-PAD+24}" text-anchor="middle" font-size="10">{v:.0f}</text>')
    out.append(f'<text x="{W/2}" y="{H-8}" text-anchor="middle" font-size="11">step</text>')
    out.append(f'<text x="12" y="{H/2}" font-size="11" transform="rotate(-90 12 {H/2})" text-anchor="middle">{esc(ylabel)}</text>')
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        if len(s) > 1:
            d = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in s)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for x, y in s:
            out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="2" fill="{c}"/>')
        out.append(f'<text x="{W-PAD-4}" y="{PAD+6+14*i}" text-anchor="end" font-size="10" fill="{c}">{esc(label)}</text>')
    out.append("</g>")
    return out


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(out_svg, files):
    runs = [(os.path.basename(os.path.dirname(p)) or p, load(p)) for p in files]
    panels = []
    sft = [(n, [(r["step"], r["loss"]) for r in recs if r.get("type") == "step" and "reward" not in r])
           for n, recs in runs if any(r.get("kind") == "sft" for r in recs)]
    rl = [(n, [r for r in recs if r.get("type") == "step" and "reward" in r]) for n, recs in runs]
    rl = [(n, s) for n, s in rl if s]
    panels.append(("SFT loss (assistant tokens)", sft, "nats/token"))
    panels.append(("RL mean reward", [(n, [(r["step"], r["reward"]) for r in s]) for n, s in rl], "reward"))
    panels.append(("RL share correct", [(n, [(r["step"], r["correct"]) for r in s]) for n, s in rl], "correct"))
    if rl:
        n, s = rl[0]
        efforts = sorted({e for r in s for e in r.get("mean_length", {})})
        panels.append((f"{n}: mean response length", [(e, [(r["step"], r["mean_length"][e]) for r in s if e in r.get("mean_length", {})]) for e in efforts], "tokens"))
        panels.append((f"{n}: share over budget", [(e, [(r["step"], r["over_budget"][e]) for r in s if e in r.get("over_budget", {})]) for e in efforts], "share"))
    panels.append(("RL step wall time", [(n, [(r["step"], r["seconds"]) for r in s]) for n, s in rl], "seconds"))
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols*W}" height="{rows*H}" font-family="sans-serif">',
           f'<rect width="{cols*W}" height="{rows*H}" fill="white"/>']
    for i, (title, series, ylabel) in enumerate(panels):
        svg += panel((i % cols) * W, (i // cols) * H, title, series, ylabel)
    svg.append("</svg>")
    with open(out_svg, "w") as f:
        f.write("\n".join(svg) + "\n")


def by_digits(ev):
    """Buckets merged over op and effort -> {digits: {"pass@1", "pass@k", ...}} weighted by problems."""
    out = {}
    for b in ev["buckets"]:
        d = out.setdefault(str(b["digits"]) + b["op"], {"problems": 0, "p1": 0.0, "pk": 0.0})
        d["problems"] += b["problems"]
        d["p1"] += b["pass@1"] * b["problems"]
        d["pk"] += b["pass@k"] * b["problems"]
    return {k: {"problems": v["problems"], "pass@1": v["p1"] / v["problems"], "pass@k": v["pk"] / v["problems"]}
            for k, v in sorted(out.items())}


def by_effort(ev):
    out = {}
    for b in ev["buckets"]:
        d = out.setdefault(b["effort"], {"n": 0, "tok": 0.0, "over": 0.0})
        n = b["problems"] * b["k"]
        d["n"] += n
        d["tok"] += b["mean_tokens"] * n
        d["over"] += b["over_budget"] * n
    return {k: {"mean_tokens": v["tok"] / v["n"], "over_budget": v["over"] / v["n"]} for k, v in out.items()}


def report(path, demo, times):
    rep = {"seconds": dict(zip(["pretrain", "sft", "rl", "rl_variants", "eval"], map(float, times)))}
    for m in ("sft", "rl"):
        for share in (0, 1):
            p = os.path.join(demo, f"eval-{m}-tool{share}.json")
            if os.path.exists(p):
                ev = json.load(open(p))
                rep[f"{m}_tool{share}"] = {"overall": ev["overall"], "by_digits": by_digits(ev), "by_effort": by_effort(ev)}
    def steps(name):
        p = os.path.join(demo, name, "metrics.jsonl")
        return [r for r in load(p) if r.get("type") == "step"] if os.path.exists(p) else []
    rl = steps("rl")
    rep["rl_reward_curve"] = [[r["step"], r["reward"], r["correct"]] for r in rl]
    for name in ("rl", "rl-lambda1", "rl-mirror", "rl-partial"):
        s = steps(name)
        n = len(steps("rl-partial")) or len(s)
        s = s[:n]
        if s:
            rep[f"{name}_step_seconds"] = {"steps": len(s), "mean": sum(r["seconds"] for r in s) / len(s),
                                           "max": max(r["seconds"] for r in s),
                                           "mean_reward": sum(r["reward"] for r in s) / len(s),
                                           "stale_tokens": sum(r["stale_tokens"] for r in s),
                                           "generated_tokens": sum(r["generated_tokens"] for r in s)}
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)
    print("| model | tool | band | problems | pass@1 | pass@k |\n|---|---|---|---|---|---|")
    for m in ("sft", "rl"):
        for share in (0, 1):
            r = rep.get(f"{m}_tool{share}")
            if not r:
                continue
            for band, v in r["by_digits"].items():
                print(f"| {m} | {'yes' if share else 'no'} | {band} | {v['problems']} | {v['pass@1']:.3f} | {v['pass@k']:.3f} |")
            o = r["overall"]
            print(f"| {m} | {'yes' if share else 'no'} | all | {o['problems']} | {o['pass@1']:.3f} | {o['pass@k']:.3f} |")
    print("\n| model | tool | effort | mean tokens | over budget |\n|---|---|---|---|---|")
    for m in ("sft", "rl"):
        for share in (0, 1):
            r = rep.get(f"{m}_tool{share}")
            for e, v in (r or {}).get("by_effort", {}).items():
                print(f"| {m} | {'yes' if share else 'no'} | {e} | {v['mean_tokens']:.1f} | {v['over_budget']:.3f} |")
    print("\n| model | tool calls per answer | tool success |\n|---|---|---|")
    for m in ("sft", "rl"):
        r = rep.get(f"{m}_tool1")
        if r:
            print(f"| {m} | {r['overall']['tool_calls_per_answer']:.3f} | {r['overall']['tool_success']:.3f} |")
    print("\n| run | steps | mean step s | max step s | mean reward | stale tokens |\n|---|---|---|---|---|---|")
    for name in ("rl", "rl-lambda1", "rl-mirror", "rl-partial"):
        v = rep.get(f"{name}_step_seconds")
        if v:
            print(f"| {name} | {v['steps']} | {v['mean']:.2f} | {v['max']:.2f} | {v['mean_reward']:.3f} | {v['stale_tokens']} |")


def mean_se(xs):
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, None  # no standard error from one problem
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def pm(m, se, sign=False):
    return (f"{m:+.3f}" if sign else f"{m:.3f}") + (f" +- {se:.3f}" if se is not None else "")


def edge_report(path, demo, times):
    rep = {"seconds": dict(zip(["tool_check", "rl", "eval"], map(float, times)))}
    sft = json.load(open(os.path.join(demo, "eval-edge-sft.json")))
    rl = json.load(open(os.path.join(demo, "eval-edge-rl.json")))
    k = sft["overall"]["k"]
    a, b = sft["per_problem"], rl["per_problem"]
    if len(a) != len(b) or any(x[:4] != y[:4] for x, y in zip(a, b)):
        sys.exit("plot_posttrain.py --edge: the two evaluations are not of the same problems")
    groups = {}
    for x, y in zip(a, b):
        band = f"{x[0]}{x[1]}"
        for key in (band + " " + x[2], band + " all", "all"):
            groups.setdefault(key, []).append((x[4] / k, y[4] / k))
    rows = {}
    for key, v in sorted(groups.items()):
        s_m, s_se = mean_se([p for p, _ in v])
        r_m, r_se = mean_se([q for _, q in v])
        d_m, d_se = mean_se([q - p for p, q in v])
        rows[key] = {"problems": len(v), "k": k, "sft": s_m, "sft_se": s_se, "rl": r_m, "rl_se": r_se,
                     "diff": d_m, "diff_se": d_se}
    rep["edge"] = rows
    steps = [r for r in load(os.path.join(demo, "rl", "metrics.jsonl")) if r.get("type") == "step"]
    if steps:
        w = max(1, len(steps) // 10)
        rep["rl"] = {"steps": len(steps), "mean_step_seconds": sum(r["seconds"] for r in steps) / len(steps),
                     "trajectories": sum(r["trajectories"] for r in steps), "kept": sum(r["kept"] for r in steps),
                     "lr": steps[-1]["lr"], "window": w,
                     "correct_by_window": [sum(r["correct"] for r in steps[i:i + w]) / len(steps[i:i + w])
                                           for i in range(0, len(steps), w)],
                     "reward_curve": [[r["step"], r["reward"], r["correct"]] for r in steps]}
    for name in ("budgets", "plain"):
        p = os.path.join(demo, f"eval-toolcheck-{name}.json")
        if os.path.exists(p):
            o = json.load(open(p))["overall"]
            rep[f"tool_check_{name}"] = {kk: o[kk] for kk in ("problems", "k", "pass@1", "mean_tokens", "over_budget",
                                                               "tool_calls_per_answer", "tool_success")}
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)
    print(f"SFT vs RL on the edge band: pass@1 (+- standard error clustered by problem), {k} samples per problem, "
          "the same problems and draws for both; diff = RL - SFT (+- paired standard error).\n")
    print("| band | effort | problems | SFT pass@1 | RL pass@1 | RL - SFT |\n|---|---|---|---|---|---|")
    for key, v in rows.items():
        band, _, effort = key.partition(" ")
        print(f"| {band} | {effort or 'all'} | {v['problems']} | {pm(v['sft'], v['sft_se'])} | "
              f"{pm(v['rl'], v['rl_se'])} | {pm(v['diff'], v['diff_se'], True)} |")
    if "rl" in rep:
        r = rep["rl"]
        print(f"\nRL: {r['steps']} steps, {r['mean_step_seconds']:.1f} s per step, {r['kept']} of {r['trajectories']} "
              f"trajectories in groups with reward variance; training share correct per {r['window']}-step window: "
              + ", ".join(f"{x:.2f}" for x in r["correct_by_window"]))
    print("\n| low-effort answers with the calculator | samples | pass@1 | mean tokens | over budget | calls per answer |"
          "\n|---|---|---|---|---|---|")
    for name, label in (("plain", "budgets only (earlier runs)"), ("budgets", "tool_budgets")):
        v = rep.get(f"tool_check_{name}")
        if v:
            print(f"| {label} | {v['problems'] * v['k']} | {v['pass@1']:.3f} | {v['mean_tokens']:.1f} | "
                  f"{v['over_budget']:.3f} | {v['tool_calls_per_answer']:.3f} |")
    print("\nwall time (s): " + ", ".join(f"{kk} {vv:.0f}" for kk, vv in rep["seconds"].items()))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--edge":
        if len(sys.argv) != 7:
            sys.exit(__doc__)
        edge_report(sys.argv[2], sys.argv[3], sys.argv[4:7])
        sys.exit(0)
    elif len(sys.argv) >= 2 and sys.argv[1] == "--report":
        if len(sys.argv) != 9:
            sys.exit(__doc__)
        report(sys.argv[2], sys.argv[3], sys.argv[4:9])
    elif len(sys.argv) >= 3:
        plot(sys.argv[1], sys.argv[2:])
    else:
        sys.exit(__doc__)
