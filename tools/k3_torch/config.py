"""The K3 config (docs/model.md section 1) from config.json: the Hugging Face nested form
({"text_config": {..., "linear_attn_config": {...}}}), a bare text_config, or the flat fixture
form (tests/data/k3-fixtures/ops/MANIFEST.json "config"). Only what the model needs is kept;
a missing required field is a ValueError naming the file and the field.
"""
import json
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class K3Config:
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: Optional[float]  # None: the unbounded Kimi Linear gate
    full_attn_layers: List[int]  # 1-based MLA layers
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_output_gate: bool
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    routed_expert_hidden_size: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    moe_renormalize: bool
    latent_moe_use_norm: bool
    first_k_dense_replace: int
    intermediate_size: int
    attn_res_block_size: int
    situ_beta: float
    situ_linear_beta: float
    extra: dict = field(default_factory=dict)

    def is_mla_layer(self, i):  # 0-based
        return (i + 1) in self.full_attn_layers

    def is_moe_layer(self, i):
        return i >= self.first_k_dense_replace


def parse_config(obj, source="config"):
    tc = obj.get("text_config", obj)
    lac = tc.get("linear_attn_config")

    def get(d, keys, where, default=KeyError):
        for k in keys:
            if k in d and d[k] is not None:
                return d[k]
        if default is KeyError:
            raise ValueError(f"{source}: {where}{keys[0]}: required field is missing")
        return default

    w = "text_config." if "text_config" in obj else ""
    if lac is not None:
        lw = w + "linear_attn_config."
        heads = get(lac, ["num_heads"], lw)
        hdim = get(lac, ["head_dim"], lw)
        conv = get(lac, ["short_conv_kernel_size"], lw, 4)
        lb = lac.get("gate_lower_bound")
        full = get(lac, ["full_attn_layers"], lw)
    else:
        heads = get(tc, ["kda_num_heads"], w)
        hdim = get(tc, ["kda_head_dim"], w)
        conv = get(tc, ["short_conv_kernel_size"], w, 4)
        lb = tc.get("gate_lower_bound")
        full = get(tc, ["full_attn_layers"], w)
    first_dense = int(get(tc, ["first_k_dense_replace"], w))
    return K3Config(
        hidden_size=int(get(tc, ["hidden_size"], w)),
        num_hidden_layers=int(get(tc, ["num_hidden_layers"], w)),
        vocab_size=int(get(tc, ["vocab_size"], w)),
        rms_norm_eps=float(get(tc, ["rms_norm_eps"], w)),
        tie_word_embeddings=bool(get(tc, ["tie_word_embeddings"], w, False)),
        kda_num_heads=int(heads),
        kda_head_dim=int(hdim),
        short_conv_kernel_size=int(conv),
        gate_lower_bound=None if lb is None else float(lb),
        full_attn_layers=[int(x) for x in full],
        num_attention_heads=int(get(tc, ["num_attention_heads"], w)),
        q_lora_rank=int(get(tc, ["q_lora_rank"], w)),
        kv_lora_rank=int(get(tc, ["kv_lora_rank"], w)),
        qk_nope_head_dim=int(get(tc, ["qk_nope_head_dim"], w)),
        qk_rope_head_dim=int(get(tc, ["qk_rope_head_dim"], w)),
        v_head_dim=int(get(tc, ["v_head_dim"], w)),
        mla_use_output_gate=bool(get(tc, ["mla_use_output_gate"], w, True)),
        num_experts=int(get(tc, ["num_experts"], w)),
        num_experts_per_token=int(get(tc, ["num_experts_per_token"], w)),
        num_shared_experts=int(get(tc, ["num_shared_experts"], w)),
        routed_expert_hidden_size=int(get(tc, ["routed_expert_hidden_size"], w)),
        moe_intermediate_size=int(get(tc, ["moe_intermediate_size"], w)),
        routed_scaling_factor=float(get(tc, ["routed_scaling_factor"], w, 1.0)),
        moe_renormalize=bool(get(tc, ["moe_renormalize"], w, True)),
        latent_moe_use_norm=bool(get(tc, ["latent_moe_use_norm"], w, True)),
        first_k_dense_replace=first_dense,
        intermediate_size=int(get(tc, ["intermediate_size"], w, 0 if first_dense == 0 else KeyError)),
        attn_res_block_size=int(get(tc, ["attn_res_block_size"], w)),
        situ_beta=float(get(tc, ["activation_situ_beta", "situ_beta"], w)),
        situ_linear_beta=float(get(tc, ["activation_situ_linear_beta", "situ_linear_beta"], w)),
    )


def load_config(path):
    with open(path) as f:
        return parse_config(json.load(f), path)
