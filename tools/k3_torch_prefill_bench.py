#!/usr/bin/python3
"""Prefill speed of the project's PyTorch implementation (tools/k3_torch) on one device, the
baseline scripts/gpu_check.sh sets beside k3cpp's CUDA backend on the same checkpoint.

  k3_torch_prefill_bench.py --model DIR [--device cuda] --batch B --seq T [--reps N] [--json OUT]

The model runs eagerly in float32 with TF32 matrix products allowed (what a PyTorch user gets
with torch.backends.cuda.matmul.allow_tf32), KDA in chunked form (chunk 32), under no_grad; B
random sequences of T tokens per repetition, after one untimed warm-up. Prints (and writes
with --json) one JSON object: tokens_per_s, seconds, batch, seq, reps, device, torch.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from k3_torch import model  # noqa: E402
from k3_torch.checkpoint import load_model_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda: torch sees no GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg, params = load_model_dir(a.model, torch.float32)
    params = {n: t.to(a.device) for n, t in params.items()}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g).to(a.device)

    def run():
        with torch.no_grad():
            out = model.forward(cfg, params, ids, "chunked", 32)
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    run()  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.reps):
        run()
    sec = time.perf_counter() - t0
    res = {"tokens_per_s": a.batch * a.seq * a.reps / sec, "seconds": sec, "batch": a.batch, "seq": a.seq,
           "reps": a.reps, "device": a.device, "torch": torch.__version__}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
