#!/usr/bin/python3
"""Training-speed baseline: the K3 model (tools/k3_torch) trained by PyTorch, so k3cpp's
trainer can be compared against a fair, independent implementation in one run.

The model is the same function the reference checks use, in float32, with the training-speed
choices a PyTorch user would make: KDA in chunked form (fla's naive_chunk_kda, batched over
batch, heads and chunks; ops.kda_chunked), the routed experts grouped by expert (one
index_select per expert, one index_add back; ops.routed_experts), AdamW (torch.optim,
foreach=True: multi-tensor updates). The router correction bias stays fixed (Quantile
Balancing is not part of this baseline); every other parameter trains.

  k3_torch_train_bench.py (--model DIR | --config config.json [--seed N])
      [--tokens tokens.i32] --batch B --seq T --steps N [--warmup W] [--threads N]
      [--lr 3e-4] [--weight-decay 0.1] [--kda chunked|recurrent] [--chunk 32]

--model loads a k3cpp checkpoint (e.g. from `k3cpp init`), so both engines start from the same
weights; --config draws a torch-side init (k3cpp's recipes, model/init.h, with torch's RNG).
--tokens: a flat stream of little-endian int32 ids; step s, row b reads the T+1 ids starting at
((s * B + b) * (T + 1)) mod (len - T); without it, ids are drawn uniformly (seed 0).
Timing covers steps W+1..W+N (forward, backward, optimizer step), after W untimed warm-up steps.
Prints one JSON line: {"tokens_per_s", "seconds", "steps", "batch", "seq", "threads",
"loss_first", "loss_last", "params", "kda", "chunk", "torch", "omp_wait_policy"}.
On a machine whose cores are busy with other work, torch's OpenMP threads spin-wait and can
collapse (seen: 2 threads at 19 tokens/s instead of ~1000 on a loaded 2-core box); run both
engines with the same OMP_WAIT_POLICY (PASSIVE there) and compare on a quiet machine.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from k3_torch import model  # noqa: E402
from k3_torch.checkpoint import expected_shapes, load_model_dir  # noqa: E402
from k3_torch.config import load_config  # noqa: E402


def torch_init(cfg, seed, std=0.02):
    """k3cpp's init recipes (src/model/init.h) drawn with torch's generator."""
    g = torch.Generator().manual_seed(seed)
    L = cfg.num_hidden_layers
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("_res_proj.weight") or name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = torch.ones(shape)
        elif name.endswith("A_log"):
            t = torch.log(torch.empty(shape).uniform_(1, 16, generator=g))
        elif name.endswith("dt_bias"):
            dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=g)).clamp(min=1e-4)
            t = dt + torch.log(-torch.expm1(-dt))  # softplus^-1
        elif "conv1d" in name:
            b = 1 / math.sqrt(shape[-1])
            t = torch.empty(shape).uniform_(-b, b, generator=g)
        elif any(k in name for k in ("o_proj", "down_proj", "routed_expert_up_proj", ".w2.")):
            t = torch.randn(shape, generator=g) * (std / math.sqrt(2 * L))
        else:
            t = torch.randn(shape, generator=g) * std
        out[name] = t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="k3cpp checkpoint directory")
    src.add_argument("--config", help="config.json (torch-side init)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--kda", choices=["chunked", "recurrent"], default="chunked")
    ap.add_argument("--chunk", type=int, default=32)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    if a.model:
        cfg, params = load_model_dir(a.model, torch.float32)
    else:
        cfg = load_config(a.config)
        params = torch_init(cfg, a.seed)
    B, T = a.batch, a.seq
    if a.tokens:
        with open(a.tokens, "rb") as f:
            stream = torch.frombuffer(bytearray(f.read()), dtype=torch.int32).to(torch.int64)
        if stream.numel() < T + 1:
            sys.exit(f"error: {a.tokens}: {stream.numel()} tokens, need at least T+1 = {T + 1}")
        if int(stream.min()) < 0 or int(stream.max()) >= cfg.vocab_size:
            sys.exit(f"error: {a.tokens}: token ids outside the vocabulary [0, {cfg.vocab_size})")
    else:
        stream = torch.randint(0, cfg.vocab_size, (B * (T + 1) * (a.steps + a.warmup),),
                               generator=torch.Generator().manual_seed(0))
    span = stream.numel() - T

    def batch(step):
        rows = [stream[((step * B + b) * (T + 1)) % span:][: T + 1] for b in range(B)]
        return torch.stack(rows)

    leaves = {n: torch.nn.Parameter(t.clone()) if model.trainable(n) else t.clone() for n, t in params.items()}
    train = [t for n, t in leaves.items() if model.trainable(n)]
    opt = torch.optim.AdamW(train, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay, foreach=True)
    n_params = sum(t.numel() for t in leaves.values())

    losses = []
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        loss = model.loss_fn(cfg, leaves, batch(step), a.kda, a.chunk)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    sec = time.perf_counter() - t0
    print(json.dumps({
        "tokens_per_s": B * T * a.steps / sec, "seconds": sec, "steps": a.steps, "batch": B, "seq": T,
        "threads": torch.get_num_threads(), "loss_first": losses[0], "loss_last": losses[-1],
        "params": n_params, "kda": a.kda, "chunk": a.chunk, "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
