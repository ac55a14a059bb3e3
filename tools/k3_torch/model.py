"""The K3 stack (docs/model.md section 2) over a dict of parameters by released name
(language_model.model.*, language_model.lm_head.weight; src/model/param_specs.cpp), so the same
function serves the reference checks (float64, leaf tensors with requires_grad) and the
training baseline (float32 nn.Parameters).

Per layer i with block size S, carrying `blocks` (completed block sums) and `partial`:
  x = AttnRes_attn(blocks + [partial]) if blocks else partial
  if i % S == 0: blocks.append(partial); partial = None
  partial += Mixer_i(RMSNorm_in(x))
  x = AttnRes_mlp(blocks + [partial])
  partial += FFN_i(RMSNorm_post(x))
then h = AttnRes_out(blocks + [partial]), final RMSNorm, lm_head.
"""
import torch
import torch.nn.functional as Fn

from . import ops

PREFIX = "language_model.model."
LM_HEAD = "language_model.lm_head.weight"
ROUTER_BIAS_SUFFIX = "block_sparse_moe.gate.e_score_correction_bias"


def sub(params, prefix):
    """The tensors under `prefix`, keyed by the rest of the name."""
    n = len(prefix)
    return {k[n:]: v for k, v in params.items() if k.startswith(prefix)}


def layer_prefix(i):
    return f"{PREFIX}layers.{i}."


def decoder_layer(cfg, i, lp, blocks, partial, kda_impl="recurrent", chunk=32):
    """Layer i (0-based) with its parameters `lp` (short names under layers.{i}.).
    Returns the new (blocks, partial); `blocks` is not modified in place."""
    eps = cfg.rms_norm_eps
    b1, b2 = cfg.situ_beta, cfg.situ_linear_beta
    if blocks:
        x = ops.attn_res(blocks + [partial], lp["self_attention_res_norm.weight"],
                         lp["self_attention_res_proj.weight"], eps)
    else:
        x = partial
    if i % cfg.attn_res_block_size == 0:
        blocks = blocks + [partial]
        partial = None
    h = ops.rms_norm(x, lp["input_layernorm.weight"], eps)
    ap = sub(lp, "self_attn.")
    if cfg.is_mla_layer(i):
        a, _, _ = ops.mla_mixer(h, ap, cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                cfg.v_head_dim, eps, cfg.mla_use_output_gate)
    else:
        a, _ = ops.kda_mixer(h, ap, cfg.kda_num_heads, cfg.kda_head_dim, eps, cfg.gate_lower_bound,
                             impl=kda_impl, chunk=chunk)
    partial = a if partial is None else partial + a
    x = ops.attn_res(blocks + [partial], lp["mlp_res_norm.weight"], lp["mlp_res_proj.weight"], eps)
    h = ops.rms_norm(x, lp["post_attention_layernorm.weight"], eps)
    if cfg.is_moe_layer(i):
        f = ops.latent_moe(h, sub(lp, "block_sparse_moe."), cfg.num_experts, cfg.num_experts_per_token, b1, b2, eps,
                           cfg.moe_renormalize, cfg.routed_scaling_factor, cfg.latent_moe_use_norm,
                           cfg.num_shared_experts)
    else:
        f = ops.glu_ffn(h, lp["mlp.gate_proj.weight"], lp["mlp.up_proj.weight"], lp["mlp.down_proj.weight"], b1, b2)
    return blocks, partial + f


def split_layers(cfg, params):
    """Per-layer dicts of short names (one pass over the names)."""
    layers = [{} for _ in range(cfg.num_hidden_layers)]
    lp = PREFIX + "layers."
    for name, t in params.items():
        if name.startswith(lp):
            i, rest = name[len(lp):].split(".", 1)
            layers[int(i)][rest] = t
    return layers


def forward(cfg, params, ids, kda_impl="recurrent", chunk=32):
    """ids [B, T] int64 -> logits [B, T, V] in the parameters' dtype."""
    eps = cfg.rms_norm_eps
    partial = Fn.embedding(ids, params[PREFIX + "embed_tokens.weight"])
    blocks = []
    for i, lp in enumerate(split_layers(cfg, params)):
        blocks, partial = decoder_layer(cfg, i, lp, blocks, partial, kda_impl, chunk)
    h = ops.attn_res(blocks + [partial], params[PREFIX + "output_attn_res_norm.weight"],
                     params[PREFIX + "output_attn_res_proj.weight"], eps)
    h = ops.rms_norm(h, params[PREFIX + "norm.weight"], eps)
    head = params[PREFIX + "embed_tokens.weight"] if cfg.tie_word_embeddings else params[LM_HEAD]
    return ops.linear(h, head)


def loss_fn(cfg, params, tokens, kda_impl="recurrent", chunk=32):
    """tokens [B, T+1]: mean cross-entropy of tokens[:, 1:] given tokens[:, :T] over all B*T positions."""
    logits = forward(cfg, params, tokens[:, :-1], kda_impl, chunk)
    return Fn.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def trainable(name):
    """Every parameter but the router's correction bias (docs/model.md section 5: never differentiated)."""
    return not name.endswith(ROUTER_BIAS_SUFFIX)
