"""MoonViT-V2 (K3's vision encoder) in plain PyTorch, written from docs/model.md section 11 and
the released-config field meanings, not from k3cpp's C++: Conv2d patch embedding without bias,
the learned [ph, pw, D] table resampled by F.interpolate(bilinear, align_corners=False) to each
grid, blocks of RMSNorm -> wqkv -> 2D rotary (complex form) -> attention within the image only
-> wo, RMSNorm -> fc0 -> GELU(tanh) -> fc1, a final RMSNorm, the kh x kw merge by view/permute,
then Linear(4D, 4D) -> GELU(erf) -> Linear(4D, text) -> RMSNorm(text).
Block norms use nn.RMSNorm's default eps (float32 epsilon), the projector's post_norm
projector_ln_eps."""
import json
import math

import torch
import torch.nn.functional as F

F32_EPS = 1.1920928955078125e-07


class VisionCfg:
    def __init__(self, config_path):
        with open(config_path) as f:
            root = json.load(f)
        v = root["vision_config"]
        tc = root.get("text_config", root)
        self.layers = v.get("vt_num_hidden_layers", 27)
        self.width = v.get("vt_hidden_size", 1024)
        self.heads = v.get("vt_num_attention_heads", 12)
        self.qkv = v.get("qkv_hidden_size") or self.width
        self.mlp = v.get("vt_intermediate_size", 4096)
        self.patch = v.get("patch_size", 14)
        self.pos_h = v.get("init_pos_emb_height", 64)
        self.pos_w = v.get("init_pos_emb_width", 64)
        self.kh, self.kw = v.get("merge_kernel_size", [2, 2])
        self.text = tc["hidden_size"]
        self.post_eps = v.get("projector_ln_eps", 1e-5)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cis(h, w, hd, dtype):
    """[h*w, hd/2] complex: entry 2i rotates by column * f_i, entry 2i+1 by row * f_i."""
    i = torch.arange(hd // 4, dtype=dtype)
    f = 10000.0 ** (-4.0 * i / hd)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=dtype), torch.arange(w, dtype=dtype), indexing="ij")
    ang = torch.stack([xs.reshape(-1, 1) * f, ys.reshape(-1, 1) * f], dim=-1).reshape(h * w, hd // 2)
    return torch.polar(torch.ones_like(ang), ang)


def apply_rope(x, cis):
    """x [n, H, hd] real; adjacent (re, im) pairs times cis [n, hd/2]."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * cis.unsqueeze(1)).flatten(-2)


def encode(cfg, P, patches, grids):
    """patches [L, 3 p p] (channel-major patch rows), grids [(h, w)] -> [N, text]."""
    dt = patches.dtype
    p, D = cfg.patch, cfg.width
    x = F.conv2d(patches.reshape(-1, 3, p, p), P["vision_tower.patch_embed.proj.weight"], stride=p).reshape(-1, D)
    table = P["vision_tower.patch_embed.pos_emb.weight"]
    pos, cis, start = [], [], 0
    for h, w in grids:
        if (h, w) == (cfg.pos_h, cfg.pos_w):
            pos.append(table.reshape(-1, D))
        else:
            pos.append(F.interpolate(table.permute(2, 0, 1).unsqueeze(0), size=(h, w), mode="bilinear",
                                     align_corners=False)[0].permute(1, 2, 0).reshape(-1, D))
        cis.append(rope_cis(h, w, cfg.qkv // cfg.heads, dt))
    x = x + torch.cat(pos)
    cis = torch.cat(cis)
    H, hd = cfg.heads, cfg.qkv // cfg.heads
    bounds = []
    for h, w in grids:
        bounds.append((start, start + h * w))
        start += h * w
    for b in range(cfg.layers):
        pre = f"vision_tower.encoder.blocks.{b}."
        y = rms_norm(x, P[pre + "norm0.weight"], F32_EPS)
        qkv = (y @ P[pre + "wqkv.weight"].T).reshape(-1, 3, H, hd)
        q, k, v = apply_rope(qkv[:, 0], cis), apply_rope(qkv[:, 1], cis), qkv[:, 2]
        outs = []
        for s, e in bounds:  # each image attends to itself only
            att = torch.softmax(torch.einsum("ihc,jhc->hij", q[s:e], k[s:e]) / math.sqrt(hd), dim=-1)
            outs.append(torch.einsum("hij,jhc->ihc", att, v[s:e]).reshape(e - s, H * hd))
        x = x + torch.cat(outs) @ P[pre + "wo.weight"].T
        y = rms_norm(x, P[pre + "norm1.weight"], F32_EPS)
        x = x + F.gelu(y @ P[pre + "mlp.fc0.weight"].T, approximate="tanh") @ P[pre + "mlp.fc1.weight"].T
    x = rms_norm(x, P["vision_tower.encoder.final_layernorm.weight"], F32_EPS)
    merged = []
    for (h, w), (s, e) in zip(grids, bounds):
        t = x[s:e].reshape(h // cfg.kh, cfg.kh, w // cfg.kw, cfg.kw, D).permute(0, 2, 1, 3, 4)
        merged.append(t.reshape(-1, cfg.kh * cfg.kw * D))
    m = torch.cat(merged)
    y = F.gelu(m @ P["mm_projector.proj.0.weight"].T) @ P["mm_projector.proj.2.weight"].T
    return rms_norm(y, P["mm_projector.post_norm.weight"], cfg.post_eps)
