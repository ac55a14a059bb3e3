#!/usr/bin/env python3
"""Plain-PyTorch chunked KDA forward, timed on the inputs that bench_kda writes.

The baseline for docs/benchmarks.md ("KDA chunked kernel"): the structure of
flash-linear-attention's naive_chunk_kda (docs/model.md section 3), f32, batched over heads
and chunks: the in-chunk decays are formed pairwise per key position j (e^(G_i - G_j), the
upper triangle masked), the UT transform by a batched triangular solve, then the sequential
chunk loop with batched matmuls over heads. Output and final state are written back so that
bench_kda can check they match its own kernel on the same inputs.

Usage (normally called by bench_kda):
  /usr/bin/python3 tools/kda_torch_bench.py --dir DIR --T 16384 --H 8 --D 128 --threads 2
DIR holds q.bin, k.bin, g.bin [T, H, D], v.bin [T, H, D], beta.bin [T, H] (raw little-endian
f32, token-major); it writes o_torch.bin [T, H, D], state_torch.bin [H, D, D] and prints one
JSON line {"seconds": best wall time, "cpu_seconds": best process CPU time (all threads),
"repeats": n, "torch": version, "threads": n}.
"""
import argparse
import json
import os
import time

import numpy as np
import torch


def chunk_kda(q, k, v, g, beta, scale, chunk=64):
    """q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; returns o [T, H, V], state [H, K, V]."""
    T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    NT = (T + C - 1) // C
    pad = NT * C - T
    if pad:  # padded tokens: k = q = v = 0, g = 0, beta = 0 leave the state unchanged
        q, k, v, g = (torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) for x in (q, k, v, g))
        beta = torch.cat([beta, beta.new_zeros(pad, H)])

    def chunks(x):  # [T, H, ...] -> [H, NT, C, ...]
        return x.reshape(NT, C, H, *x.shape[2:]).movedim(2, 0)

    q, k, v, g = chunks(q) * scale, chunks(k), chunks(v), chunks(g)
    beta = chunks(beta)  # [H, NT, C]
    G = g.cumsum(-2)
    # A[i, j] = sum_d K_i K_j e^(G_i - G_j), Aqk[i, j] = sum_d Q_i K_j e^(G_i - G_j), j <= i
    A = q.new_zeros(H, NT, C, C)
    Aqk = q.new_zeros(H, NT, C, C)
    for j in range(C):
        kd = k[..., j : j + 1, :] * (G - G[..., j : j + 1, :]).exp()  # [H, NT, C, K], rows i
        A[..., j] = (k * kd).sum(-1)
        Aqk[..., j] = (q * kd).sum(-1)
    strict = torch.triu(torch.ones(C, C, dtype=torch.bool), diagonal=0)
    incl = torch.triu(torch.ones(C, C, dtype=torch.bool), diagonal=1)
    A = A.masked_fill(strict, 0) * beta[..., None]
    Aqk = Aqk.masked_fill(incl, 0)
    # Tm = (I + diag(beta) A)^-1 diag(beta)
    L = A + torch.eye(C)
    Tm = torch.linalg.solve_triangular(L, torch.diag_embed(beta), upper=False, unitriangular=True)
    E = G.exp()
    W = Tm @ (k * E)
    U = Tm @ v
    Qe = q * E
    Kd = k * (G[..., -1:, :] - G).exp()
    El = G[..., -1, :].exp()  # [H, NT, K]
    S = q.new_zeros(H, K, V)
    o = torch.empty(H, NT, C, V)
    for n in range(NT):
        vn = U[:, n] - W[:, n] @ S
        o[:, n] = Qe[:, n] @ S + Aqk[:, n] @ vn
        S = S * El[:, n, :, None] + Kd[:, n].transpose(-1, -2) @ vn
    o = o.movedim(0, 2).reshape(NT * C, H, V)[:T]
    return o, S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--T", type=int, required=True)
    ap.add_argument("--H", type=int, required=True)
    ap.add_argument("--D", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    T, H, D = a.T, a.H, a.D

    def load(name, shape):
        return torch.from_numpy(np.fromfile(os.path.join(a.dir, name), dtype=np.float32).reshape(shape))

    q, k, v, g = (load(n + ".bin", (T, H, D)) for n in "qkvg")
    beta = load("beta.bin", (T, H))
    scale = D ** -0.5
    best, best_cpu = float("inf"), float("inf")
    with torch.no_grad():
        for _ in range(a.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            o, S = chunk_kda(q, k, v, g, beta, scale, a.chunk)
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
    o.contiguous().numpy().astype(np.float32).tofile(os.path.join(a.dir, "o_torch.bin"))
    S.contiguous().numpy().astype(np.float32).tofile(os.path.join(a.dir, "state_torch.bin"))
    print(json.dumps({"seconds": best, "cpu_seconds": best_cpu, "repeats": a.repeats, "torch": torch.__version__,
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
