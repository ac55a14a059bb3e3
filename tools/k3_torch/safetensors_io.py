"""Safetensors read/write without the safetensors package, plus MXFP4 decoding.

Format: 8-byte little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
raw little-endian data (offsets relative to the end of the header). bf16 is widened to f32
exactly (bits << 16). MXFP4 (docs/model.md section 8): U8 weight_packed [rows, cols/2], the low
nibble is the even element; U8 weight_scale [rows, cols/32] E8M0;
value = E2M1[nibble] * 2^(scale - 127).
"""
import json
import os
import struct

import torch

_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (None, 2),  # decoded by hand: torch.frombuffer with bfloat16 works too, but be explicit
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class SafetensorsError(Exception):
    pass


def read_safetensors(path):
    """Returns (tensors: dict name -> torch.Tensor (bf16 widened to f32), metadata: dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise SafetensorsError(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}")
    data = memoryview(blob)[8 + n :]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r}: unsupported dtype {dt!r}")
        shape = [int(s) for s in info["shape"]]
        b, e = (int(x) for x in info["data_offsets"])
        tdtype, size = _DTYPES[dt]
        numel = 1
        for s in shape:
            numel *= s
        if e - b != numel * size or e > len(data) or b < 0:
            raise SafetensorsError(f"{path}: tensor {name!r}: data_offsets [{b}, {e}] do not fit {dt} {shape}")
        raw = bytes(data[b:e])
        if numel == 0:
            t = torch.zeros(shape, dtype=torch.float32 if dt == "BF16" else tdtype)
        elif dt == "BF16":
            bits = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int32) & 0xFFFF
            t = (bits << 16).view(torch.float32).reshape(shape)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=tdtype).reshape(shape)
        out[name] = t
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes f32/f64/i32/u8 tensors (dict name -> tensor) with optional string metadata."""
    rev = {v[0]: k for k, v in _DTYPES.items() if v[0] is not None}
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": rev[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def decode_mxfp4(packed, scale):
    """packed U8 [rows, cols/2], scale U8 [rows, cols/32] -> f32 [rows, cols]."""
    rows, half = packed.shape
    cols = half * 2
    if tuple(scale.shape) != (rows, cols // 32) or cols % 32:
        raise SafetensorsError(f"MXFP4 scale shape {list(scale.shape)} does not fit packed {list(packed.shape)}")
    lut = torch.tensor(E2M1, dtype=torch.float32)
    p = packed.to(torch.int64)
    vals = torch.stack([lut[p & 0xF], lut[p >> 4]], dim=-1).reshape(rows, cols)  # low nibble first
    # 2^(s - 127) exactly: build the f32 bit pattern for s in 1..254, handle 0 (2^-127) via ldexp
    s = scale.to(torch.float64) - 127.0
    mult = torch.pow(torch.tensor(2.0, dtype=torch.float64), s).to(torch.float32)
    return vals * mult.repeat_interleave(32, dim=1)


def read_model_tensors(model_dir):
    """All tensors of a model directory: the shards named by model.safetensors.index.json if
    present, else every *.safetensors file. A name stored twice is an error."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(model_dir) if x.endswith(".safetensors"))
    if not files:
        raise SafetensorsError(f"{model_dir}: no .safetensors files")
    out = {}
    for fn in files:
        t, _ = read_safetensors(os.path.join(model_dir, fn))
        for k, v in t.items():
            if k in out:
                raise SafetensorsError(f"{model_dir}: tensor {k!r} is stored in more than one shard")
            out[k] = v
    return out
