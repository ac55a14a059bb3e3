#!/usr/bin/env python3
"""The report of scripts/posttrain_vision.sh (docs/post-training.md, "RL on images").

usage: posttrain_vision_report.py OUT_DIR SFT_SECONDS RL_SECONDS EVAL_SECONDS > report.md

Reads OUT_DIR/eval-{vision,sft,rl}.json (`k3cpp rl --eval`: per_problem entries
[digits, op, effort, tool, correct of k, carry]) and OUT_DIR/rl/metrics.jsonl; writes
OUT_DIR/report.json and a markdown table on stdout: pass@1 and pass@k of each model with
standard errors over problems, the paired difference RL - SFT (the same problems and draws for
both), by carry in the ones column, the reward curve per window of steps, response lengths.
Standard library only.
"""
import json
import math
import os
import sys


def mean_se(xs):
    n = len(xs)
    if n == 0:
        return 0.0, 0.0
    m = sum(xs) / n
    if n < 2:
        return m, 0.0
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def pm(m, se, sign=False):
    return ("%+.3f" if sign else "%.3f") % m + " +- %.3f" % se


def per_problem(ev, carry=None):
    k = ev["overall"]["k"]
    rows = [p for p in ev["per_problem"] if carry is None or (len(p) > 5 and p[5] == carry)]
    return [p[4] / k for p in rows], [1.0 if p[4] > 0 else 0.0 for p in rows]


def main():
    out, t_sft, t_rl, t_eval = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    evs = {}
    for name in ("vision", "sft", "rl"):
        with open(os.path.join(out, "eval-%s.json" % name)) as f:
            evs[name] = json.load(f)
    k = evs["sft"]["overall"]["k"]
    rep = {"k": k, "seconds": {"sft": t_sft, "rl": t_rl, "eval": t_eval}, "models": {}, "paired": {}}
    lines = ["| split | problems | SFT pass@1 | RL pass@1 | RL - SFT (paired) | "
             "SFT pass@%d | RL pass@%d | RL - SFT pass@%d (paired) |" % (k, k, k),
             "|---|---|---|---|---|---|---|---|"]
    for label, carry in (("all", None), ("no carry", 0), ("carry", 1)):
        p1 = {n: per_problem(evs[n], carry) for n in ("sft", "rl")}
        n = len(p1["sft"][0])
        if n == 0:
            continue
        d1 = [b - a for a, b in zip(p1["sft"][0], p1["rl"][0])]
        dk = [b - a for a, b in zip(p1["sft"][1], p1["rl"][1])]
        row = {m: {"pass@1": mean_se(p1[m][0]), "pass@k": mean_se(p1[m][1])} for m in p1}
        row["diff_pass@1"], row["diff_pass@k"] = mean_se(d1), mean_se(dk)
        row["problems"] = n
        rep["paired"][label] = row
        lines.append("| %s | %d | %s | %s | **%s** | %s | %s | %s |" % (
            label, n, pm(*row["sft"]["pass@1"]), pm(*row["rl"]["pass@1"]),
            pm(*row["diff_pass@1"], sign=True), pm(*row["sft"]["pass@k"]), pm(*row["rl"]["pass@k"]),
            pm(*row["diff_pass@k"], sign=True)))
    for m, ev in evs.items():
        rep["models"][m] = ev["overall"]
    vo = evs["vision"]["overall"]
    lines.append("")
    lines.append("The vision model as it is, in chat turns (%d problems x %d samples): pass@1 %.3f, "
                 "%.1f tokens per reply, %.3f over budget." % (vo["problems"], vo["k"], vo["pass@1"],
                                                            vo["mean_tokens"], vo["over_budget"]))
    lines.append("")
    lines.append("| model | mean generated tokens | over budget | malformed (no single integer) | wrong |")
    lines.append("|---|---|---|---|---|")
    for m in ("vision", "sft", "rl"):
        o = evs[m]["overall"]
        bad = o.get("malformed", 0.0)
        lines.append("| %s | %.2f | %.3f | %.3f | %.3f |" % (m, o["mean_tokens"], o["over_budget"], bad,
                                                       1.0 - o["pass@1"] - o["over_budget"] - bad))
    # The reward curve: windows of steps.
    steps = []
    with open(os.path.join(out, "rl", "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "step":
                steps.append(j)
    w = max(1, len(steps) // 10)
    curve = []
    for i in range(0, len(steps), w):
        s = steps[i:i + w]
        curve.append({"steps": [s[0]["step"], s[-1]["step"]],
                      "reward": sum(x["reward"] for x in s) / len(s),
                      "correct": sum(x["correct"] for x in s) / len(s),
                      "kept_share": sum(x["kept"] for x in s) / max(1, sum(x["trajectories"] for x in s)),
                      "mean_length": sum(x.get("mean_length", {}).get("low", 0.0) for x in s) / len(s),
                      "seconds_per_step": sum(x["seconds"] for x in s) / len(s)})
    rep["curve"] = curve
    lines.append("")
    lines.append("| RL steps | reward | share correct (training) | kept (reward variance) | reply tokens | s / step |")
    lines.append("|---|---|---|---|---|---|")
    for c in curve:
        lines.append("| %d-%d | %.3f | %.3f | %.2f | %.2f | %.2f |" % (
            c["steps"][0], c["steps"][1], c["reward"], c["correct"], c["kept_share"], c["mean_length"],
            c["seconds_per_step"]))
    lines.append("")
    lines.append("Wall time: SFT %.0f s, RL %.0f s (%d steps), evaluation %.0f s; %d samples per problem, "
                 "+- one standard error over problems; paired: the same problems and draws for both models."
                 % (t_sft, t_rl, len(steps), t_eval, k))
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
