"""Loading a model directory (k3cpp's or the release's layout, src/model/checkpoint.h):
config.json plus safetensors shards under the released names. Dense tensors may be f32, bf16
or f16; routed experts plain `.weight` or MXFP4 `.weight_packed` + `.weight_scale` (decoded to
the logical `.weight`). The release's other forms are read as k3cpp reads them
(src/model/release_layout.h): `A_log` 1-D zero-padded past the head count (the release stores
F32 [128] for K3's 96 heads; non-zero padding is a ValueError), the names k3cpp used before the
release for the output AttnRes read (`final_res_*`, one notice line on stderr), and
`vision_tower.*` / `mm_projector.*` tensors, skipped with one line. Other tensors outside
`language_model.` are ignored. Returns the config and a dict name -> tensor in the requested
dtype; a missing or misshapen tensor is a ValueError.
"""
import os
import sys

import torch

from .config import load_config
from .model import LM_HEAD, PREFIX
from .safetensors_io import decode_mxfp4, read_model_tensors


def expected_shapes(cfg):
    """name -> shape for every parameter of `cfg` (the table of src/model/param_specs.cpp)."""
    d, V = cfg.hidden_size, cfg.vocab_size
    H, D = cfg.kda_num_heads, cfg.kda_head_dim
    HD, Kc = H * D, cfg.short_conv_kernel_size
    Hm, qk = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    E, l, F = cfg.num_experts, cfg.routed_expert_hidden_size, cfg.moe_intermediate_size
    SF, I = cfg.num_shared_experts * F, cfg.intermediate_size
    t = {PREFIX + "embed_tokens.weight": (V, d)}
    for i in range(cfg.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            t[p + n + ".weight"] = (d,)
        t[p + "self_attention_res_proj.weight"] = (1, d)
        t[p + "mlp_res_proj.weight"] = (1, d)
        a = p + "self_attn."
        if cfg.is_mla_layer(i):
            t[a + "q_a_proj.weight"] = (cfg.q_lora_rank, d)
            t[a + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
            t[a + "q_b_proj.weight"] = (Hm * qk, cfg.q_lora_rank)
            t[a + "kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)
            t[a + "kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
            t[a + "kv_b_proj.weight"] = (Hm * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
            t[a + "o_proj.weight"] = (d, Hm * cfg.v_head_dim)
            if cfg.mla_use_output_gate:
                t[a + "g_proj.weight"] = (Hm * cfg.v_head_dim, d)
        else:
            for n in ("q_proj", "k_proj", "v_proj", "g_proj"):
                t[a + n + ".weight"] = (HD, d)
            for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
                t[a + n + ".weight"] = (HD, 1, Kc)
            t[a + "f_a_proj.weight"] = (D, d)
            t[a + "f_b_proj.weight"] = (HD, D)
            t[a + "b_proj.weight"] = (H, d)
            t[a + "o_norm.weight"] = (D,)
            t[a + "o_proj.weight"] = (d, HD)
            t[a + "A_log"] = (H,)
            t[a + "dt_bias"] = (HD,)
        if not cfg.is_moe_layer(i):
            t[p + "mlp.gate_proj.weight"] = (I, d)
            t[p + "mlp.up_proj.weight"] = (I, d)
            t[p + "mlp.down_proj.weight"] = (d, I)
            continue
        m = p + "block_sparse_moe."
        t[m + "gate.weight"] = (E, d)
        t[m + "gate.e_score_correction_bias"] = (E,)
        t[m + "routed_expert_down_proj.weight"] = (l, d)
        t[m + "routed_expert_up_proj.weight"] = (d, l)
        if cfg.latent_moe_use_norm:
            t[m + "routed_expert_norm.weight"] = (l,)
        if SF > 0:
            t[m + "shared_experts.gate_proj.weight"] = (SF, d)
            t[m + "shared_experts.up_proj.weight"] = (SF, d)
            t[m + "shared_experts.down_proj.weight"] = (d, SF)
        for e in range(E):
            x = f"{m}experts.{e}."
            t[x + "w1.weight"] = (F, l)
            t[x + "w3.weight"] = (F, l)
            t[x + "w2.weight"] = (l, F)
    t[PREFIX + "output_attn_res_norm.weight"] = (d,)
    t[PREFIX + "output_attn_res_proj.weight"] = (1, d)
    t[PREFIX + "norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        t[LM_HEAD] = (V, d)
    return t


# Released name -> the name k3cpp wrote before it adopted the release's (param_specs.h).
LEGACY_NAMES = {PREFIX + "output_attn_res_norm.weight": PREFIX + "final_res_norm.weight",
                PREFIX + "output_attn_res_proj.weight": PREFIX + "final_res_proj.weight"}
VISION_PREFIXES = ("vision_tower.", "mm_projector.")


def load_model_dir(model_dir, dtype=torch.float32):
    cfg = load_config(os.path.join(model_dir, "config.json"))
    everything = read_model_tensors(model_dir)
    raw = {k: v for k, v in everything.items() if k.startswith("language_model.")}
    vision = [k for k in everything if k.startswith(VISION_PREFIXES)]
    if vision:
        n_tower = sum(k.startswith(VISION_PREFIXES[0]) for k in vision)
        print(f"{model_dir}: skipped {len(vision)} vision tensor(s) (vision_tower.*: {n_tower}, "
              f"mm_projector.*: {len(vision) - n_tower}): text model only", file=sys.stderr)
    shapes = expected_shapes(cfg)
    params, legacy = {}, []
    for name, shape in shapes.items():
        old = LEGACY_NAMES.get(name)
        if name not in raw and old in raw:
            raw[name] = raw.pop(old)
            legacy.append(old)
        if name in raw:
            t = raw.pop(name)
        elif name + "_packed" in raw and name + "_scale" in raw:
            t = decode_mxfp4(raw.pop(name + "_packed"), raw.pop(name + "_scale"))
        else:
            raise ValueError(f"{model_dir}: tensor {name} is missing")
        if name.endswith(".A_log") and t.dim() == 1 and t.shape[0] > shape[0]:
            pad = t[shape[0]:].float()
            if bool((pad != 0).any()):
                raise ValueError(f"{model_dir}: tensor {name}: stored with {t.shape[0]} entries for {shape[0]} KDA heads, "
                                 f"but the padding is not zero")
            t = t[:shape[0]]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{model_dir}: tensor {name}: expected shape {list(shape)}, found {list(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{model_dir}: tensor {name}: expected a float dtype, found {t.dtype}")
        params[name] = t.to(dtype)
    if legacy:
        print(f"{model_dir}: note: read {', '.join(legacy)} (names k3cpp used before the release) under the "
              f"released names", file=sys.stderr)
    if raw:
        raise ValueError(f"{model_dir}: tensor {sorted(raw)[0]} is not part of this config ({len(raw)} unexpected)")
    return cfg, params
