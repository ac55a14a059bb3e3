#!/usr/bin/python3
"""The table scripts/gpu_check.sh ends with, from the results in its output folder: the steps
(exit code, seconds), every test (passed / FAILED / skipped), each op case on the GPU with its
largest error against the reference (relative RMS; the tolerance beside it) and its time from
the performance mode, and the speed goals of issue 31 with what was measured.

  gpu_check_table.py OUT_DIR
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tests(doc):
    """(suite.name, status, properties, first failure line) for every test of a gtest JSON report."""
    out = []
    for suite in (doc or {}).get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = suite["name"] + "." + t["name"]
            if t.get("failures"):
                status = "FAILED"
            elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                status = "skipped"
            else:
                status = "passed"
            msg = t["failures"][0]["failure"].splitlines()[0] if t.get("failures") else ""
            if status == "skipped":
                msg = (t.get("skipped", {}) or {}).get("message", "") if isinstance(t.get("skipped"), dict) else ""
            out.append((name, status, t, msg))
    return out


def bench_rows(doc):
    return [b for b in (doc or {}).get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]


def main():
    out = sys.argv[1]
    lines = []
    p = lines.append
    p("== steps ==")
    try:
        for ln in open(os.path.join(out, "steps.txt")):
            name, rc, ms = ln.split()
            p(f"  {name:<18} exit {rc:>3}  {int(ms) / 1000:7.1f} s")
    except OSError:
        p("  (no steps.txt)")

    p("== tests ==")
    counts = {}
    for report in ("test_cuda.json", "test_ops.json"):
        for name, status, t, msg in tests(load(os.path.join(out, report))):
            counts[status] = counts.get(status, 0) + 1
            if report == "test_cuda.json":
                p(f"  {status:<8} {name}" + (f": {msg[:150]}" if msg else ""))
    p("  totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))

    p("== ops on the GPU: largest error against the reference (tolerance) and time ==")
    times = {}
    for b in bench_rows(load(os.path.join(out, "bench_ops.json"))):
        name = b["name"].replace("/real_time", "")
        times[name.rsplit("/", 1)[0]] = b
    for name, status, t, msg in tests(load(os.path.join(out, "test_ops.json"))):
        if not name.endswith("_cuda"):
            continue
        case = t.get("case", name)
        errs = [(k[4:], float(v), float(t.get("tol_" + k[4:], "nan"))) for k, v in t.items() if k.startswith("err_")]
        worst = max(errs, key=lambda e: e[1] / e[2] if e[2] > 0 else e[1], default=None)
        err = f"{worst[0]} {worst[1]:.2e} ({worst[2]:.0e})" if worst else "-"
        op, _, rest = case.partition(" ")
        bt = times.get(op + "/" + rest)
        tm = f"{bt['real_time']:.1f} {bt['time_unit']}" if bt else ""
        p(f"  {status:<8} {case[:70]:<70} {err:<28} {tm}")
    for key, b in times.items():
        extra = "".join(f" {k}={b[k]:.3g}" for k in ("GFLOP/s", "GB/s") if k in b)
        p(f"  perf     {key[:90]:<90} {b['real_time']:.1f} {b['time_unit']}{extra}")

    p("== speed goals (issue 31) ==")
    model = {b["name"].split("/")[0] + ("/" + b["name"].split("/")[1] if b["name"].startswith("BM_Serve") else ""): b
             for b in bench_rows(load(os.path.join(out, "bench_gpu_model.json")))}
    peaks = model.get("BM_Peaks", {})
    if peaks:
        p(f"  peaks: copy {peaks.get('copy_GBps', 0):.0f} GB/s (read + written), cuBLAS bf16 {peaks.get('bf16_TFLOPs', 0):.0f} TFLOP/s")
    try:  # bench_cuda_kda prints its own table: its lines from the variants' table on
        kda = open(os.path.join(out, "bench_cuda_kda.log")).read().splitlines()
        start = next(i for i, ln in enumerate(kda) if ln.startswith("KDA chunked forward"))
        for ln in kda[start:]:
            p("  " + ln)
    except (OSError, StopIteration):
        p("  KDA chunked at T=8192 H=96 K=V=128: not measured (bench_cuda_kda absent or failed); goal <= 1.8 ms")
    d = model.get("BM_SliceDecode")
    if d and "pct_of_bound" in d:
        p(f"  decode, K3-width slice, 1 sequence: {d['tok_per_s']:.1f} tok/s = {d['pct_of_bound']:.1f} % of the memory bound"
          f" ({d['bytes_per_token_GB']:.2f} GB/token; goal >= 60 %)")
    pf = model.get("BM_SlicePrefill")
    if pf and "pct_of_bf16_peak" in pf:
        p(f"  prefill T=8192, same model: {pf['tok_per_s']:.0f} tok/s, {pf['matmul_TFLOPs']:.0f} TFLOP/s of matrix work = "
          f"{pf['pct_of_bf16_peak']:.1f} % of the bf16 peak (goal >= 40 %)")
    s1, s64 = model.get("BM_ServeAggregate/1"), model.get("BM_ServeAggregate/64")
    if s1 and s64 and s1.get("tok_per_s"):
        p(f"  serve (mid-1024): 1 sequence {s1['tok_per_s']:.0f} tok/s, 64 sequences {s64['tok_per_s']:.0f} tok/s = "
          f"{s64['tok_per_s'] / s1['tok_per_s']:.1f}x (goal >= 20x)")
    mp, tp = model.get("BM_MidPrefill"), load(os.path.join(out, "torch_prefill.json"))
    if mp and tp:
        p(f"  mid-1024 prefill (4 x 2048): k3cpp {mp['tok_per_s']:.0f} tok/s, PyTorch {tp['tokens_per_s']:.0f} tok/s = "
          f"{mp['tok_per_s'] / tp['tokens_per_s']:.1f}x (goal >= 20x)")
    elif mp:
        p(f"  mid-1024 prefill (4 x 2048): k3cpp {mp.get('tok_per_s', 0):.0f} tok/s; PyTorch not measured")
    for name, b in model.items():
        if b.get("error_occurred"):
            p(f"  {name}: {b.get('error_message', 'error')}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
