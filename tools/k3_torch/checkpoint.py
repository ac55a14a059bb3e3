"""Loading a model directory (k3cpp's or the release's layout, src/model/checkpoint.h):
config.json plus safetensors shards under the released names. Dense tensors may be f32, bf16
or f16; routed experts plain `.weight` or MXFP4 `.weight_packed` + `.weight_scale` (decoded to
the logical `.weight`). Tensors outside `language_model.` are ignored. Returns the config and a
dict name -> tensor in the requested dtype; a missing or misshapen tensor is a ValueError.
"""
import os

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
    t[PREFIX + "final_res_norm.weight"] = (d,)
    t[PREFIX + "final_res_proj.weight"] = (1, d)
    t[PREFIX + "norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        t[LM_HEAD] = (V, d)
    return t


def load_model_dir(model_dir, dtype=torch.float32):
    cfg = load_config(os.path.join(model_dir, "config.json"))
    raw = {k: v for k, v in read_model_tensors(model_dir).items() if k.startswith("language_model.")}
    shapes = expected_shapes(cfg)
    params = {}
    for name, shape in shapes.items():
        if name in raw:
            t = raw.pop(name)
        elif name + "_packed" in raw and name + "_scale" in raw:
            t = decode_mxfp4(raw.pop(name + "_packed"), raw.pop(name + "_scale"))
        else:
            raise ValueError(f"{model_dir}: tensor {name} is missing")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{model_dir}: tensor {name}: expected shape {list(shape)}, found {list(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{model_dir}: tensor {name}: expected a float dtype, found {t.dtype}")
        params[name] = t.to(dtype)
    if raw:
        raise ValueError(f"{model_dir}: tensor {sorted(raw)[0]} is not part of this config ({len(raw)} unexpected)")
    return cfg, params
