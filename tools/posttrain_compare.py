#!/usr/bin/env python3
"""Compares `k3cpp rl --eval` outputs of several models on the same problems (same config, same
seed, so the same problems and draws): pass@1 / pass@k per band (operand digits x operator, all
efforts merged), mean tokens per effort, and each model's paired difference from the first, with
the standard error over problems (docs/post-training.md, "The edge run").

usage: tools/posttrain_compare.py LABEL=EVAL.json [LABEL=EVAL.json ...]
Markdown on stdout. Standard library only.
"""
import json
import math
import sys
from collections import defaultdict


def load(arg):
    if "=" not in arg:
        sys.exit(f"posttrain_compare: '{arg}' is not LABEL=FILE")
    label, path = arg.split("=", 1)
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"posttrain_compare: {path}: {e}")
    for field in ("buckets", "overall", "per_problem"):
        if field not in r:
            sys.exit(f"posttrain_compare: {path}: no '{field}' (not a `k3cpp rl --eval` output)")
    return label, r


def by_band(r):
    agg = defaultdict(lambda: [0.0, 0.0, 0])
    for b in r["buckets"]:
        a = agg["%d%s" % (b["digits"], b["op"])]
        a[0] += b["pass@1"] * b["problems"]
        a[1] += b["pass@k"] * b["problems"]
        a[2] += b["problems"]
    return agg


def paired(base, other, k):
    # per_problem rows: [digits, op, effort, tool, correct samples of k]
    if [p[:4] for p in base] != [p[:4] for p in other]:
        return None
    d = [(o[4] - b[4]) / k for b, o in zip(base, other)]
    n = len(d)
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    return m, se


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [load(a) for a in sys.argv[1:]]
    k = runs[0][1]["overall"]["k"]
    bands = sorted({key for _, r in runs for key in by_band(r)}, key=lambda s: (int(s[:-1]), s[-1]))
    print("| band | " + " | ".join(f"{l}: pass@1 / pass@{k}" for l, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    tables = [by_band(r) for _, r in runs]
    for band in bands:
        cells = []
        for t in tables:
            a = t.get(band)
            cells.append("%.3f / %.3f" % (a[0] / a[2], a[1] / a[2]) if a else "")
        print(f"| {band} | " + " | ".join(cells) + " |")
    print("| all | " + " | ".join("%.3f / %.3f" % (r["overall"]["pass@1"], r["overall"]["pass@k"]) for _, r in runs) + " |")
    print()
    for label, r in runs:
        lengths = defaultdict(lambda: [0.0, 0.0, 0])
        for b in r["buckets"]:
            e = lengths[b["effort"]]
            e[0] += b["mean_tokens"] * b["problems"]
            e[1] += b["over_budget"] * b["problems"]
            e[2] += b["problems"]
        parts = ", ".join("%s %.1f tokens (%.3f over budget)" % (e, v[0] / v[2], v[1] / v[2]) for e, v in lengths.items())
        line = f"- {label}: {parts}"
        if label != runs[0][0]:
            p = paired(runs[0][1]["per_problem"], r["per_problem"], k)
            line += "; pass@1 minus %s: %s" % (runs[0][0], "%+.3f +- %.3f (paired, %d problems)" % (p[0], p[1], len(r["per_problem"])) if p else "not the same problems")
        print(line)


if __name__ == "__main__":
    main()
