#!/usr/bin/env python3
"""Writes tests/data/k3-release-tiny/: a tiny K3 model in the released checkpoint layout.

Everything about the layout is the release's (moonshotai/Kimi-K3, as public loaders and
converters of the real checkpoint read it; docs/architecture.md "Tensor names" cites them),
only the sizes are tiny:
  - config.json with every field of the released one: top level `architectures`, `auto_map`,
    token ids, `model_type` "kimi_k3", `text_config` (model_type "kimi_linear", with
    `linear_attn_config` and `quantization_config`: compressed-tensors, mxfp4-pack-quantized)
    and `vision_config`;
  - shards named `model-%05d-of-%06d.safetensors` (five-digit index, six-digit count) plus
    `model.safetensors.index.json`; text layers first, then the shard with embed_tokens /
    lm_head / norm / output_attn_res_*, then one shard of mm_projector.* and one of
    vision_tower.*, as the release orders them;
  - the release's dtypes per tensor: A_log, dt_bias, the conv1d kernels, o_norm and
    e_score_correction_bias F32, routed experts MXFP4 (weight_packed + weight_scale, U8),
    everything else BF16; A_log F32 [head_dim]: the H per-head values, then zeros (K3: 96
    values in 128 entries);
  - the output AttnRes read as `language_model.model.output_attn_res_{norm,proj}.weight`;
  - tiktoken.model (`<base64 bytes> <rank>` per line) with 256 byte tokens and 32 merges, then
    256 reserved special ids laid out as K3's after its base vocabulary (docs/model.md section 14:
    [BOS] +0, [EOS] +1, <|end_of_msg|> +2, <|open|> +3, <|close|> +4, <|sep|> +5,
    <|media_begin|> +18 .. <|media_pad|> +21, [UNK] +254, [PAD] +255), named in
    tokenizer_config.json's added_tokens_decoder.

Deterministic: values come from SplitMix64 and plain arithmetic (no library RNG, no
transcendental functions), so the bytes are the same on every machine; a test re-runs this
script and compares every file with the committed copy. Standard library only.

usage: make_release_fixture.py [--out DIR]   (default: tests/data/k3-release-tiny)
"""
import argparse
import base64
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "data", "k3-release-tiny")

# ---- sizes (tiny) -----------------------------------------------------------------------
D_MODEL, N_LAYERS = 64, 4
FULL_ATTN = [4]                      # 1-based MLA layers (K3: every 4th, and the last)
KDA_LAYERS = [1, 2, 3]
KDA_H, KDA_D, CONV_K = 2, 16, 4      # A_log stored [KDA_D]: 2 values, then 14 zeros
MLA_H, Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 2, 32, 16, 16, 8, 16
N_EXPERTS, TOP_K, N_SHARED = 4, 2, 2
LATENT, MOE_F = 32, 32               # MXFP4 needs input widths that are multiples of 32
DENSE_I = 96
BLOCK = 2
N_MERGES = 32
BASE_VOCAB = 256 + N_MERGES          # K3: 163584
VOCAB = BASE_VOCAB + 256             # K3: 163840
VT_LAYERS, VT_D, VT_I, VT_HEADS, VT_QKV, PATCH, MERGE, POS = 2, 16, 32, 2, 16, 4, 2, 4

PREFIX = "language_model.model."


# ---- deterministic numbers -------------------------------------------------------------
class SplitMix64:
    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def uniform(self, lo, hi):
        # 24 random bits: k / 2^24 is exact in float64, so is the affine map up to one rounding.
        return lo + (hi - lo) * ((self.next() >> 40) / float(1 << 24))

    def byte(self):
        return self.next() >> 56


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def bf16_bytes(values):
    out = bytearray()
    for v in values:
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (no NaN here)
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


class Tensors:
    """name -> (dtype, shape, bytes), in insertion order."""

    def __init__(self, seed):
        self.rng = SplitMix64(seed)
        self.t = {}

    def add(self, name, dtype, shape, values=None, raw=None):
        assert name not in self.t, name
        if raw is None:
            assert len(values) == numel(shape), name
            raw = f32_bytes(values) if dtype == "F32" else bf16_bytes(values)
        self.t[name] = (dtype, list(shape), raw)

    def uniform(self, name, shape, lo, hi, dtype="BF16"):
        self.add(name, dtype, shape, [self.rng.uniform(lo, hi) for _ in range(numel(shape))])

    def linear(self, name, out_f, in_f):
        b = 1.0 / (in_f ** 0.5)  # the square root of a float is correctly rounded
        self.uniform(name, [out_f, in_f], -b, b)

    def gain(self, name, n, dtype="BF16"):  # RMSNorm gains around 1
        self.uniform(name, [n], 0.9, 1.1, dtype)

    def mxfp4(self, name, rows, cols):
        # Any nibble is a valid E2M1 code; scales 2^-6 .. 2^-3 keep the experts' outputs small.
        packed = bytes(self.rng.byte() for _ in range(rows * cols // 2))
        scales = bytes(121 + self.rng.byte() % 4 for _ in range(rows * cols // 32))
        self.add(name + "_packed", "U8", [rows, cols // 2], raw=packed)
        self.add(name + "_scale", "U8", [rows, cols // 32], raw=scales)


def text_layer(T, i):
    p = f"{PREFIX}layers.{i}."
    T.gain(p + "input_layernorm.weight", D_MODEL)
    T.gain(p + "post_attention_layernorm.weight", D_MODEL)
    T.gain(p + "self_attention_res_norm.weight", D_MODEL)
    T.uniform(p + "self_attention_res_proj.weight", [1, D_MODEL], -0.1, 0.1)
    T.gain(p + "mlp_res_norm.weight", D_MODEL)
    T.uniform(p + "mlp_res_proj.weight", [1, D_MODEL], -0.1, 0.1)
    a = p + "self_attn."
    if (i + 1) in FULL_ATTN:
        T.linear(a + "q_a_proj.weight", Q_LORA, D_MODEL)
        T.gain(a + "q_a_layernorm.weight", Q_LORA)
        T.linear(a + "q_b_proj.weight", MLA_H * (NOPE + ROPE), Q_LORA)
        T.linear(a + "kv_a_proj_with_mqa.weight", KV_LORA + ROPE, D_MODEL)
        T.gain(a + "kv_a_layernorm.weight", KV_LORA)
        T.linear(a + "kv_b_proj.weight", MLA_H * (NOPE + V_HEAD), KV_LORA)
        T.linear(a + "g_proj.weight", MLA_H * V_HEAD, D_MODEL)
        T.linear(a + "o_proj.weight", D_MODEL, MLA_H * V_HEAD)
    else:
        HD = KDA_H * KDA_D
        for n in ("q_proj", "k_proj", "v_proj"):
            T.linear(a + n + ".weight", HD, D_MODEL)
        for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
            T.uniform(a + n + ".weight", [HD, 1, CONV_K], -0.5, 0.5, "F32")
        T.linear(a + "f_a_proj.weight", KDA_D, D_MODEL)
        T.linear(a + "f_b_proj.weight", HD, KDA_D)
        T.linear(a + "b_proj.weight", KDA_H, D_MODEL)
        T.linear(a + "g_proj.weight", HD, D_MODEL)
        T.gain(a + "o_norm.weight", KDA_D, "F32")
        T.linear(a + "o_proj.weight", D_MODEL, HD)
        # The release: one value per head, zero-padded to head_dim (K3: 96 in F32 [128]).
        a_log = [T.rng.uniform(-1.0, 1.0) for _ in range(KDA_H)] + [0.0] * (KDA_D - KDA_H)
        T.add(a + "A_log", "F32", [KDA_D], a_log)
        T.uniform(a + "dt_bias", [HD], -0.5, 0.5, "F32")
    if i == 0:  # first_k_dense_replace = 1
        T.linear(p + "mlp.gate_proj.weight", DENSE_I, D_MODEL)
        T.linear(p + "mlp.up_proj.weight", DENSE_I, D_MODEL)
        T.linear(p + "mlp.down_proj.weight", D_MODEL, DENSE_I)
        return
    m = p + "block_sparse_moe."
    for e in range(N_EXPERTS):
        x = f"{m}experts.{e}."
        T.mxfp4(x + "w1.weight", MOE_F, LATENT)
        T.mxfp4(x + "w2.weight", LATENT, MOE_F)
        T.mxfp4(x + "w3.weight", MOE_F, LATENT)
    T.uniform(m + "gate.e_score_correction_bias", [N_EXPERTS], -0.05, 0.05, "F32")
    T.linear(m + "gate.weight", N_EXPERTS, D_MODEL)
    T.linear(m + "routed_expert_down_proj.weight", LATENT, D_MODEL)
    T.gain(m + "routed_expert_norm.weight", LATENT)
    T.linear(m + "routed_expert_up_proj.weight", D_MODEL, LATENT)
    SF = N_SHARED * MOE_F  # shared experts stored fused
    T.linear(m + "shared_experts.down_proj.weight", D_MODEL, SF)
    T.linear(m + "shared_experts.gate_proj.weight", SF, D_MODEL)
    T.linear(m + "shared_experts.up_proj.weight", SF, D_MODEL)


def build_tensors():
    """Shards in the release's order: layers, then the global text tensors, mm_projector, vision_tower."""
    shards = []
    for layers in ([0, 1], [2, 3]):
        T = Tensors(1000 + layers[0])
        for i in layers:
            text_layer(T, i)
        shards.append(T.t)
    T = Tensors(2000)
    T.uniform(PREFIX + "embed_tokens.weight", [VOCAB, D_MODEL], -1.0, 1.0)
    T.linear("language_model.lm_head.weight", VOCAB, D_MODEL)
    T.gain(PREFIX + "norm.weight", D_MODEL)
    T.gain(PREFIX + "output_attn_res_norm.weight", D_MODEL)
    T.uniform(PREFIX + "output_attn_res_proj.weight", [1, D_MODEL], -0.1, 0.1)
    shards.append(T.t)
    T = Tensors(3000)
    M = VT_D * MERGE * MERGE  # the 2x2 merge concatenates four patches
    T.gain("mm_projector.post_norm.weight", D_MODEL)
    T.linear("mm_projector.proj.0.weight", M, M)
    T.linear("mm_projector.proj.2.weight", D_MODEL, M)
    shards.append(T.t)
    T = Tensors(4000)
    for b in range(VT_LAYERS):
        v = f"vision_tower.encoder.blocks.{b}."
        T.linear(v + "mlp.fc0.weight", VT_I, VT_D)
        T.linear(v + "mlp.fc1.weight", VT_D, VT_I)
        T.gain(v + "norm0.weight", VT_D)
        T.gain(v + "norm1.weight", VT_D)
        T.linear(v + "wo.weight", VT_D, VT_QKV)
        T.linear(v + "wqkv.weight", 3 * VT_QKV, VT_D)
    T.gain("vision_tower.encoder.final_layernorm.weight", VT_D)
    T.uniform("vision_tower.patch_embed.pos_emb.weight", [POS, POS, VT_D], -0.1, 0.1)
    T.linear("vision_tower.patch_embed.proj.weight", VT_D, 3 * PATCH * PATCH)
    proj = T.t.pop("vision_tower.patch_embed.proj.weight")
    T.t["vision_tower.patch_embed.proj.weight"] = (proj[0], [VT_D, 3, PATCH, PATCH], proj[2])
    shards.append(T.t)
    return shards


# safetensors as the reference (Rust) writer lays it out: header JSON without spaces,
# __metadata__ first, tensors ordered by dtype (widest first) then name, data in that order,
# header padded with spaces to a multiple of 8.
DTYPE_RANK = {"F32": 0, "BF16": 1, "U8": 2}


def safetensors_bytes(tensors):
    order = sorted(tensors, key=lambda n: (DTYPE_RANK[tensors[n][0]], n))
    header = {"__metadata__": {"format": "pt"}}
    off, data = 0, []
    for n in order:
        dtype, shape, raw = tensors[n]
        header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(data)


# ---- tokenizer -------------------------------------------------------------------------
CORPUS = (
    "the quick brown fox jumps over the lazy dog. the dog sleeps in the sun, "
    "and the fox thinks about the other side of the river. there is nothing "
    "on the other side but more of the same: the sun, the river, the dog."
)


def bpe_merges(text, n):
    """n merges learned from `text` (most frequent adjacent pair, ties to the smallest pair)."""
    words = [[bytes([b]) for b in w.encode()] for w in text.replace(" ", " \x00").split("\x00")]
    merges = []
    for _ in range(n):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        (a, b), _ = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return merges


# K3's named special ids, as offsets after its base vocabulary (docs/model.md section 14);
# <|open|>, <|close|>, <|sep|> are not flagged special.
SPECIALS = [(0, "[BOS]", True), (1, "[EOS]", True), (2, "<|end_of_msg|>", True), (3, "<|open|>", False),
            (4, "<|close|>", False), (5, "<|sep|>", False), (18, "<|media_begin|>", True),
            (19, "<|media_content|>", True), (20, "<|media_end|>", True), (21, "<|media_pad|>", True),
            (254, "[UNK]", True), (255, "[PAD]", True)]


def tiktoken_model():
    tokens = [bytes([b]) for b in range(256)] + bpe_merges(CORPUS, N_MERGES)
    assert len(tokens) == BASE_VOCAB and len(set(tokens)) == BASE_VOCAB
    return "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)).encode()


def tokenizer_config():
    dec = {}
    for off, content, special in SPECIALS:
        dec[str(BASE_VOCAB + off)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": special}
    cfg = {
        "added_tokens_decoder": dec,
        "additional_special_tokens": [c for _, c, s in SPECIALS if s and c.startswith("<|")],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    return (json.dumps(cfg, indent=2, ensure_ascii=False) + "\n").encode()


# ---- config.json -----------------------------------------------------------------------
BOS, EOS_MSG, PAD, MEDIA_PAD = BASE_VOCAB + 0, BASE_VOCAB + 2, BASE_VOCAB + 255, BASE_VOCAB + 21


def config_json():
    quant = {
        "config_groups": {"group_0": {
            "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None,
            "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                        "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                        "strategy": "group", "symmetric": True, "type": "float", "zp_dtype": None}}},
        "format": "mxfp4-pack-quantized",
        "global_compression_ratio": None,
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                   "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }
    text = {
        "_name_or_path": "", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "add_cross_attention": False, "architectures": ["KimiLinearForCausalLM"], "attn_res_block_size": BLOCK,
        "auto_map": {"AutoConfig": "configuration_kimi_k3.KimiLinearConfig",
                     "AutoModel": "modeling_kimi_linear.KimiLinearModel",
                     "AutoModelForCausalLM": "modeling_kimi_linear.KimiLinearForCausalLM"},
        "bad_words_ids": None, "begin_suppress_tokens": None, "bos_token_id": BOS, "chunk_size_feed_forward": 0,
        "cross_attention_hidden_size": None, "decoder_start_token_id": None, "diversity_penalty": 0.0,
        "do_sample": False, "dtype": "bfloat16", "early_stopping": False, "encoder_no_repeat_ngram_size": 0,
        "eos_token_id": EOS_MSG, "exponential_decay_length_penalty": None, "finetuning_task": None,
        "first_k_dense_replace": 1, "forced_bos_token_id": None, "forced_eos_token_id": None, "hidden_act": "situ",
        "hidden_size": D_MODEL, "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_range": 0.02,
        "intermediate_size": DENSE_I, "is_decoder": False, "is_encoder_decoder": False, "kv_lora_rank": KV_LORA,
        "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "latent_moe_use_norm": True, "length_penalty": 1.0,
        "linear_attn_config": {"full_attn_layers": FULL_ATTN, "gate_lower_bound": -5.0, "head_dim": KDA_D,
                               "kda_layers": KDA_LAYERS, "num_heads": KDA_H, "short_conv_kernel_size": CONV_K,
                               "use_full_rank_gate": True},
        "max_length": 20, "max_position_embeddings": 4096, "min_length": 0, "mla_use_nope": True,
        "mla_use_output_gate": True, "model_type": "kimi_linear", "moe_intermediate_size": MOE_F,
        "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
        "no_repeat_ngram_size": 0, "num_attention_heads": MLA_H, "num_beam_groups": 1, "num_beams": 1,
        "num_expert_group": 1, "num_experts": N_EXPERTS, "num_experts_per_token": TOP_K,
        "num_hidden_layers": N_LAYERS, "num_key_value_heads": MLA_H, "num_nextn_predict_layers": 0,
        "num_return_sequences": 1, "num_shared_experts": N_SHARED, "output_attentions": False,
        "output_hidden_states": False, "output_scores": False, "pad_token_id": PAD, "prefix": None,
        "problem_type": None, "pruned_heads": {}, "q_lora_rank": Q_LORA, "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE, "quantization_config": quant, "remove_invalid_values": False,
        "repetition_penalty": 1.0, "return_dict": True, "return_dict_in_generate": False, "rms_norm_eps": 1e-05,
        "routed_expert_hidden_size": LATENT, "routed_scaling_factor": 1.0, "sep_token_id": None,
        "suppress_tokens": None, "task_specific_params": None, "temperature": 1.0, "tf_legacy_loss": False,
        "tie_encoder_decoder": False, "tie_word_embeddings": False, "tokenizer_class": None, "top_k": 50,
        "top_p": 1.0, "topk_group": 1, "topk_method": "noaux_tc", "torchscript": False,
        "transformers_version": "4.56.2", "typical_p": 1.0, "use_bfloat16": False, "use_cache": True,
        "use_grouped_topk": True, "v_head_dim": V_HEAD, "vocab_size": VOCAB,
    }
    vision = {
        "_attn_implementation": "flash_attention_2", "activation_func": "gelu_pytorch_tanh", "attn_bias": False,
        "init_pos_emb_height": POS, "init_pos_emb_time": 4, "init_pos_emb_width": POS, "linear_bias": False,
        "merge_kernel_size": [MERGE, MERGE], "merge_type": "sd2_tpool", "mlp_type": "mlp2", "mm_hidden_size": VT_D,
        "mm_projector_type": "patchmergerv2", "norm_type": "rmsnorm", "patch_embed_proj_bias": False,
        "patch_size": PATCH, "pos_emb_interpolation_mode": "bilinear", "pos_emb_type": "divided_fixed",
        "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05, "qkv_hidden_size": VT_QKV,
        "text_hidden_size": D_MODEL, "vt_hidden_size": VT_D, "vt_intermediate_size": VT_I,
        "vt_num_attention_heads": VT_HEADS, "vt_num_hidden_layers": VT_LAYERS,
    }
    top = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k3.KimiK3Config",
                     "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
                     "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration"},
        "bos_token_id": BOS, "dtype": "bfloat16", "eos_token_id": EOS_MSG, "ignore_index": -100,
        "image_placeholder": "<|kimi_image_placeholder|>", "media_placeholder_token_id": MEDIA_PAD,
        "model_type": "kimi_k3", "pad_token_id": PAD, "text_config": text, "tie_word_embeddings": False,
        "vision_config": vision,
    }
    return (json.dumps(top, indent=2, sort_keys=True) + "\n").encode()


def files():
    """file name -> bytes of the whole fixture."""
    out = {}
    shards = build_tensors()
    total = len(shards)
    weight_map, total_size = {}, 0
    for i, t in enumerate(shards):
        fn = "model-%05d-of-%06d.safetensors" % (i + 1, total)
        out[fn] = safetensors_bytes(t)
        for n, (_, _, raw) in t.items():
            weight_map[n] = fn
            total_size += len(raw)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    out["model.safetensors.index.json"] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    out["config.json"] = config_json()
    out["tiktoken.model"] = tiktoken_model()
    out["tokenizer_config.json"] = tokenizer_config()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fs = files()
    for fn, data in fs.items():
        with open(os.path.join(args.out, fn), "wb") as f:
            f.write(data)
    print(f"{args.out}: {len(fs)} files, {sum(len(d) for d in fs.values())} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
