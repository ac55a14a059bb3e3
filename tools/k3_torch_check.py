#!/usr/bin/python3
"""Independent PyTorch reference for k3cpp (project issue 4): forward logits, loss and
gradients of a k3cpp / released checkpoint, and a self-test against the reference fixtures.
Run with Debian's /usr/bin/python3 (python3-torch, scripts/setup.sh). See tools/k3_torch/README.md.

  k3_torch_check.py selftest [--fixtures tests/data/k3-fixtures]
  k3_torch_check.py layer-f64 --out DIR [--fixtures tests/data/k3-fixtures]
      the two whole-layer fixtures (ops/layer_kda.json, ops/layer_mla.json) recomputed in float64
      from their own f32 inputs: DIR/<name> holds "out" and "block_residual_out" as JSON tensors
      of float64 values (17 significant digits), the reference tests/model/test_layer_fixtures.cpp
      checks every path against (tests/data/k3-f64/README.md says why)
  k3_torch_check.py forward <model dir> --ids 1,2,3 --out logits.f32 [--dtype float64]
      float32 logits [T, V], row-major, little-endian, no header (as `k3cpp forward --logits`)
  k3_torch_check.py grads <model dir> --tokens tokens.i32 --batch B --seq T --out grads.safetensors
                    [--dtype float64]
      tokens.i32: B*(T+1) little-endian int32, row b = tokens[b*(T+1) : (b+1)*(T+1)];
      loss = mean cross-entropy of tokens[:, 1:] given tokens[:, :T] over all B*T positions;
      writes every parameter's gradient (F32, released names; MXFP4 experts under their logical
      `.weight` name; no entry for e_score_correction_bias) with __metadata__ {"loss": "%.17g",
      "batch", "seq", "dtype", "torch"}.
  k3_torch_check.py vision <model dir> --inputs in.safetensors --out out.safetensors [--dtype float64]
      the vision encoder (k3_torch/vision.py) on the model directory's vision_tower.* /
      mm_projector.* tensors; in.safetensors holds "patches" [L, 3 p p], "grids" I32 [n, 2]
      and "dout" [N, text]; writes "out" [N, text] and d(sum(dout * out))/d(param) for every
      vision parameter (F64).
Exit status 0 on success, 1 on failure (one line on stderr), 2 on bad usage.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from k3_torch import model, selftest  # noqa: E402
from k3_torch.checkpoint import load_model_dir  # noqa: E402
from k3_torch.safetensors_io import write_safetensors  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def parse_ids(text):
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"error: --ids: {text!r} is not a comma-separated list of token ids")
    if not ids:
        raise SystemExit("error: --ids: no token ids given")
    return ids


def cmd_selftest(a):
    fixdir = a.fixtures or os.path.join(os.path.dirname(HERE), "tests", "data", "k3-fixtures")
    t0 = time.time()
    passed, failures = selftest.run(fixdir)
    print(f"selftest: {passed} passed, {len(failures)} failed ({time.time() - t0:.1f} s, torch {torch.__version__})")
    return 1 if failures else 0


def cmd_layer_f64(a):
    import json

    fixdir = a.fixtures or os.path.join(os.path.dirname(HERE), "tests", "data", "k3-fixtures")
    ops_dir = os.path.join(fixdir, "ops")
    os.makedirs(a.out, exist_ok=True)
    for name in ("layer_kda.json", "layer_mla.json"):
        j = selftest.load(ops_dir, name)
        partial, blocks = selftest.layer_forward(ops_dir, j, "recurrent", torch.float64)
        doc = {"source": f"k3_torch (tools/k3_torch_check.py layer-f64, torch {torch.__version__}) in float64 "
                         f"on the f32 inputs of k3-fixtures/ops/{name}, per-token KDA recurrence"}
        for key, t in (("out", partial), ("block_residual_out", blocks)):
            fix = selftest.T_(j, key)
            if list(t.shape) != list(fix.shape):
                raise ValueError(f"{name}: {key} shape {list(t.shape)} != fixture {list(fix.shape)}")
            doc[key] = {"shape": list(t.shape), "data": [float(v) for v in t.reshape(-1).tolist()]}
        path = os.path.join(a.out, name)
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)  # json writes repr(float): round-trips every double exactly
            f.write("\n")
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
    return 0


def cmd_forward(a):
    dt = DTYPES[a.dtype]
    cfg, params = load_model_dir(a.model_dir, dt)
    ids = parse_ids(a.ids)
    for i, t in enumerate(ids):
        if not 0 <= t < cfg.vocab_size:
            raise SystemExit(f"error: --ids: token id {t} at position {i} is outside the vocabulary [0, {cfg.vocab_size})")
    with torch.no_grad():
        logits = model.forward(cfg, params, torch.tensor([ids], dtype=torch.int64), a.kda)[0]
    with open(a.out + ".tmp", "wb") as f:
        f.write(logits.to(torch.float32).contiguous().numpy().tobytes())
    os.replace(a.out + ".tmp", a.out)
    print(f"wrote {a.out}: float32 logits [{logits.shape[0]}, {logits.shape[1]}] ({a.dtype})")
    return 0


def cmd_grads(a):
    dt = DTYPES[a.dtype]
    cfg, params = load_model_dir(a.model_dir, dt)
    B, T = a.batch, a.seq
    with open(a.tokens, "rb") as f:
        raw = f.read()
    if len(raw) != 4 * B * (T + 1):
        raise SystemExit(f"error: {a.tokens}: holds {len(raw)} bytes, expected {4 * B * (T + 1)} "
                         f"(B*(T+1) = {B}*{T + 1} int32)")
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.int32).to(torch.int64).reshape(B, T + 1)
    bad = ((tokens < 0) | (tokens >= cfg.vocab_size)).nonzero()
    if len(bad):
        b, t = bad[0].tolist()
        raise SystemExit(f"error: {a.tokens}: token {int(tokens[b, t])} at row {b}, position {t} is outside "
                         f"the vocabulary [0, {cfg.vocab_size})")
    leaves = {n: t.clone().requires_grad_(model.trainable(n)) for n, t in params.items()}
    names = [n for n in leaves if model.trainable(n)]
    loss = model.loss_fn(cfg, leaves, tokens, a.kda)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    out = {n: (g if g is not None else torch.zeros_like(leaves[n])).to(torch.float32) for n, g in zip(names, grads)}
    meta = {"loss": repr(float(loss)), "batch": B, "seq": T, "dtype": a.dtype, "torch": torch.__version__}
    write_safetensors(a.out, out, meta)
    print(f"wrote {a.out}: loss {float(loss):.10g}, {len(out)} gradient tensors ({a.dtype})")
    return 0


def cmd_vision(a):
    from k3_torch import vision
    from k3_torch.safetensors_io import read_model_tensors, read_safetensors
    dt = DTYPES[a.dtype]
    cfg = vision.VisionCfg(os.path.join(a.model_dir, "config.json"))
    tensors = read_model_tensors(a.model_dir)
    P = {n: t.to(dt).clone().requires_grad_(True) for n, t in tensors.items()
         if n.startswith("vision_tower.") or n.startswith("mm_projector.")}
    inp, _ = read_safetensors(a.inputs)
    grids = [tuple(int(v) for v in g) for g in inp["grids"].tolist()]
    out = vision.encode(cfg, P, inp["patches"].to(dt), grids)
    loss = (out * inp["dout"].to(dt)).sum()
    names = sorted(P)
    grads = torch.autograd.grad(loss, [P[n] for n in names])
    res = {"out": out.detach().to(torch.float64)}
    res.update({n: g.to(torch.float64) for n, g in zip(names, grads)})
    write_safetensors(a.out, res, {"dtype": a.dtype, "torch": torch.__version__})
    print(f"wrote {a.out}: out {list(out.shape)}, {len(names)} gradient tensors ({a.dtype})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="cmd", required=True)
    s = sp.add_parser("selftest")
    s.add_argument("--fixtures", default=None, help="k3-fixtures directory (default: the repository's)")
    s = sp.add_parser("layer-f64")
    s.add_argument("--out", required=True)
    s.add_argument("--fixtures", default=None, help="k3-fixtures directory (default: the repository's)")
    for name in ("forward", "grads"):
        s = sp.add_parser(name)
        s.add_argument("model_dir")
        s.add_argument("--out", required=True)
        s.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
        s.add_argument("--kda", choices=["recurrent", "chunked"], default="recurrent",
                       help="KDA core (default: the per-token recurrence)")
        s.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
        if name == "forward":
            s.add_argument("--ids", required=True)
        else:
            s.add_argument("--tokens", required=True)
            s.add_argument("--batch", type=int, required=True)
            s.add_argument("--seq", type=int, required=True)
    s = sp.add_parser("vision")
    s.add_argument("model_dir")
    s.add_argument("--inputs", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    a = ap.parse_args()
    if getattr(a, "threads", 0):
        torch.set_num_threads(a.threads)
    try:
        return {"selftest": cmd_selftest, "layer-f64": cmd_layer_f64, "forward": cmd_forward, "grads": cmd_grads, "vision": cmd_vision}[a.cmd](a)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
