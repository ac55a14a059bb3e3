"""The K3 ops in plain PyTorch (docs/model.md sections 2-5), batch-first, differentiable, in
whatever float dtype the inputs carry (float64 for reference checks, float32 for training).

Dimension letters (fla's glossary): B batch, T tokens, H heads, K key dim, V value dim,
C chunk, N chunks / sources, E experts, d model width, l latent width, F expert width.
Weights are [out, in] like nn.Linear; `linear(x, W)` is x W^T.
"""
import math

import torch
import torch.nn.functional as Fn


def linear(x, w):
    return x @ w.t()


def rms_norm(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w over the last dim (ops/rmsnorm.json)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def situ(g, u, b1, b2):
    """SiTU(g, u) = [b1 tanh(g/b1) sigmoid(g)] * [b2 tanh(u/b2)]; the sigmoid sees the uncapped g
    (section 5, ops/situ_glu.json)."""
    return (b1 * torch.tanh(g / b1) * torch.sigmoid(g)) * (b2 * torch.tanh(u / b2))


def glu_ffn(x, w_gate, w_up, w_down, b1, b2):
    """W_down SiTU(W_gate x, W_up x): the dense FFN, the shared experts and each routed expert."""
    return linear(situ(linear(x, w_gate), linear(x, w_up), b1, b2), w_down)


def short_conv_silu(x, w, state=None):
    """Causal depthwise conv with fused SiLU (section 3, ops/shortconv.json).
    x [B, T, C]; w [C, 1, K], taps oldest to newest; state [B, C, K-1] (the last K-1 inputs,
    zeros for a fresh sequence). Returns (y [B, T, C], new state [B, C, K-1])."""
    B, T, C = x.shape
    K = w.shape[-1]
    if state is None:
        state = x.new_zeros(B, C, K - 1)
    xs = torch.cat([state, x.transpose(1, 2)], dim=2)  # [B, C, K-1+T]
    y = Fn.conv1d(xs, w, groups=C)  # valid conv: out[t] = sum_j w[j] xs[t + j]
    return Fn.silu(y).transpose(1, 2), xs[:, :, xs.shape[2] - (K - 1) :]


def l2_norm(x, eps=1e-6):
    """x / sqrt(sum x^2 + eps) over the last dim (section 3)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_gate(z, A_log, dt_bias, lower_bound):
    """Log-decay g per key channel (section 3, ops/kda_decay.json).
    z [B, T, H, K]; A_log [H]; dt_bias [H*K]. lower_bound None: the unbounded Kimi Linear gate
    -exp(A_log) softplus(z + dt_bias); else lb * sigmoid(exp(A_log) (z + dt_bias))."""
    H, K = z.shape[-2], z.shape[-1]
    a = torch.exp(A_log).view(H, 1)
    zz = z + dt_bias.view(H, K)
    if lower_bound is None:
        return -a * Fn.softplus(zz)
    return lower_bound * torch.sigmoid(a * zz)


def kda_recurrent(q, k, v, g, beta, scale, state=None):
    """The KDA recurrence token by token (section 3), the plain reference.
    q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; state [B, H, K, V] or None.
    Per token: S = diag(e^g) S; u = S^T k; S = S + k (beta (v - u))^T; o = S^T (scale q).
    Returns (o [B, T, H, V], state)."""
    B, T, H, K = q.shape
    Vd = v.shape[-1]
    S = q.new_zeros(B, H, K, Vd) if state is None else state
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        u = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + k[:, t].unsqueeze(-1) * (beta[:, t].unsqueeze(-1) * (v[:, t] - u)).unsqueeze(-2)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale))
    return torch.stack(outs, dim=1), S


def kda_chunked(q, k, v, g, beta, scale, state=None, chunk=32, lower_bound=None):
    """The KDA recurrence in chunked (WY / UT-transform) form, fla's naive_chunk_kda batched
    (section 3): same signature and result as kda_recurrent. Within a chunk, with G the in-chunk
    cumulative log decay, A[i,j] = beta_i sum_c k_ic k_jc e^(G_ic - G_jc) (j < i) and
    Aqk[i,j] = sum_c q_ic k_jc e^(G_ic - G_jc) (j <= i). With a lower bound lb the pairwise
    factors are formed as two matrix products anchored at the chunk's middle row (every exponent
    within |lb| C / 2, finite in f32 for C <= 32); without one, pairwise differences are
    exponentiated directly (C^2 K memory per chunk)."""
    B, T, H, K = q.shape
    Vd = v.shape[-1]
    C = chunk
    NT = (T + C - 1) // C
    pad = NT * C - T
    if pad:  # padded tokens: q = k = v = 0, g = 0, beta = 0 leave the state unchanged
        zpad = lambda x: torch.cat([x, x.new_zeros(B, pad, *x.shape[2:])], dim=1)
        q, k, v, g, beta = zpad(q), zpad(k), zpad(v), zpad(g), zpad(beta)

    def chunks(x):  # [B, T, H, ...] -> [B, H, NT, C, ...]
        return x.reshape(B, NT, C, H, *x.shape[3:]).movedim(3, 1)

    q, k, v, g, beta = chunks(q) * scale, chunks(k), chunks(v), chunks(g), chunks(beta)
    G = g.cumsum(-2)  # [B, H, NT, C, K]
    lower_strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
    lower_incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=0)
    if lower_bound is not None and abs(lower_bound) * C / 2 <= 80:
        Gm = G[..., C // 2 : C // 2 + 1, :]
        kn = k * torch.exp(Gm - G)
        A = (k * torch.exp(G - Gm)) @ kn.transpose(-1, -2)
        Aqk = (q * torch.exp(G - Gm)) @ kn.transpose(-1, -2)
    else:
        D = G.unsqueeze(-2) - G.unsqueeze(-3)  # [.., i, j, K] = G_i - G_j
        D = D.masked_fill(~lower_incl.unsqueeze(-1), float("-inf"))
        E = torch.exp(D)
        A = torch.einsum("...ic,...jc,...ijc->...ij", k, k, E)
        Aqk = torch.einsum("...ic,...jc,...ijc->...ij", q, k, E)
    # masked_fill (not multiply): the masked entries of the anchored products may be inf
    A = A.masked_fill(~lower_strict, 0) * beta.unsqueeze(-1)
    Aqk = Aqk.masked_fill(~lower_incl, 0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(A + eye, torch.diag_embed(beta), upper=False, unitriangular=True)
    EG = torch.exp(G)
    W = Tm @ (k * EG)
    U = Tm @ v
    Qe = q * EG
    Kd = k * torch.exp(G[..., -1:, :] - G)
    El = torch.exp(G[..., -1, :]).unsqueeze(-1)  # [B, H, NT, K, 1]
    S = q.new_zeros(B, H, K, Vd) if state is None else state
    outs = []
    for n in range(NT):
        vn = U[:, :, n] - W[:, :, n] @ S
        outs.append(Qe[:, :, n] @ S + Aqk[:, :, n] @ vn)
        S = S * El[:, :, n] + Kd[:, :, n].transpose(-1, -2) @ vn
    o = torch.stack(outs, dim=2)  # [B, H, NT, C, V]
    o = o.movedim(1, 3).reshape(B, NT * C, H, Vd)[:, :T]
    return o, S


def kda_mixer(x, p, H, K, eps, lower_bound, state=None, impl="recurrent", chunk=32):
    """Whole KDA mixer (section 3, ops/kda_layer8.json). x [B, T, d] (after the input norm);
    p: dict of this layer's `self_attn.` tensors by short name (q_proj.weight, q_conv1d.weight,
    f_a_proj.weight, f_b_proj.weight, b_proj.weight, g_proj.weight, o_norm.weight,
    o_proj.weight, A_log, dt_bias). state: None or (S, conv_q, conv_k, conv_v).
    Returns (y [B, T, d], new state)."""
    B, T, _ = x.shape
    S0, cq, ck, cv = state if state is not None else (None, None, None, None)
    q, cq = short_conv_silu(linear(x, p["q_proj.weight"]), p["q_conv1d.weight"], cq)
    k, ck = short_conv_silu(linear(x, p["k_proj.weight"]), p["k_conv1d.weight"], ck)
    v, cv = short_conv_silu(linear(x, p["v_proj.weight"]), p["v_conv1d.weight"], cv)
    q = l2_norm(q.view(B, T, H, K))
    k = l2_norm(k.view(B, T, H, K))
    v = v.view(B, T, H, K)
    beta = torch.sigmoid(linear(x, p["b_proj.weight"]))  # [B, T, H]
    z = linear(linear(x, p["f_a_proj.weight"]), p["f_b_proj.weight"]).view(B, T, H, K)
    g = kda_gate(z, p["A_log"], p["dt_bias"], lower_bound)
    scale = K ** -0.5
    if impl == "recurrent":
        o, S = kda_recurrent(q, k, v, g, beta, scale, S0)
    else:
        o, S = kda_chunked(q, k, v, g, beta, scale, S0, chunk=chunk, lower_bound=lower_bound)
    o = rms_norm(o, p["o_norm.weight"], eps).reshape(B, T, H * K)
    o = o * torch.sigmoid(linear(x, p["g_proj.weight"]))
    return linear(o, p["o_proj.weight"]), (S, cq, ck, cv)


def mla_mixer(x, p, Hm, nope, rope, vdim, eps, use_gate=True):
    """Gated MLA, NoPE (section 4, ops/mla.json). x [B, T, d]; p: this layer's `self_attn.`
    tensors by short name. Returns (y [B, T, d], c_kv [B, T, kv_lora] normed, k_rope [B, T, rope])."""
    B, T, _ = x.shape
    c_q = rms_norm(linear(x, p["q_a_proj.weight"]), p["q_a_layernorm.weight"], eps)
    q = linear(c_q, p["q_b_proj.weight"]).view(B, T, Hm, nope + rope)
    kva = linear(x, p["kv_a_proj_with_mqa.weight"])
    r = p["kv_a_layernorm.weight"].shape[0]
    c_kv = rms_norm(kva[..., :r], p["kv_a_layernorm.weight"], eps)
    k_rope = kva[..., r:]
    kv = linear(c_kv, p["kv_b_proj.weight"]).view(B, T, Hm, nope + vdim)
    k = torch.cat([kv[..., :nope], k_rope.unsqueeze(2).expand(B, T, Hm, rope)], dim=-1)
    v = kv[..., nope:]
    scores = torch.einsum("bihc,bjhc->bhij", q, k) * (nope + rope) ** -0.5
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
    a = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
    o = torch.einsum("bhij,bjhc->bihc", a, v).reshape(B, T, Hm * vdim)
    if use_gate:
        o = o * torch.sigmoid(linear(x, p["g_proj.weight"]))
    return linear(o, p["o_proj.weight"]), c_kv, k_rope


def router(x, w, bias, k, renormalize=True, scale=1.0):
    """Sigmoid router (section 5, ops/router.json). x [N, d]; w [E, d]; bias [E] (selection only,
    never differentiated). Selection: top-k of s + b, ties to the lower expert index, ordered by
    biased score; weights: the unbiased s of the selected experts, renormalised, times scale.
    Returns (idx [N, k] int64, weights [N, k])."""
    s = torch.sigmoid(linear(x, w))
    biased = s.detach() + bias.detach().to(s.dtype)
    idx = torch.sort(biased, dim=-1, descending=True, stable=True)[1][:, :k]
    p = s.gather(1, idx)
    if renormalize:
        p = p / p.sum(-1, keepdim=True)
    return idx, p * scale


def routed_experts(z, idx, p, experts, b1, b2):
    """u = sum_i p_i W2_i SiTU(W1_i z, W3_i z), grouped by expert (index_select per expert, one
    index_add back). z [N, l]; idx, p [N, k]; experts: list of (w1, w3, w2) per expert."""
    N, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True)[1]
    tok = order // k
    counts = torch.bincount(flat, minlength=len(experts)).tolist()
    zs = z.index_select(0, tok)
    outs = []
    start = 0
    for e, c in enumerate(counts):
        if c:
            w1, w3, w2 = experts[e]
            outs.append(glu_ffn(zs[start : start + c], w1, w3, w2, b1, b2))
        start += c
    h = torch.cat(outs, 0) * p.reshape(-1).index_select(0, order).unsqueeze(-1)
    return z.new_zeros(N, z.shape[1]).index_add(0, tok, h)


def latent_moe(x, p, E, k, b1, b2, eps, renormalize=True, scale=1.0, use_norm=True, n_shared=1):
    """Stable LatentMoE (section 5, ops/moe.json). x [..., d]; p: this layer's
    `block_sparse_moe.` tensors by short name. y = Shared(x) + W_up RMSNorm(sum_i p_i E_i(W_down x))."""
    shp = x.shape
    x2 = x.reshape(-1, shp[-1])
    idx, pw = router(x2, p["gate.weight"], p["gate.e_score_correction_bias"], k, renormalize, scale)
    z = linear(x2, p["routed_expert_down_proj.weight"])
    experts = [(p[f"experts.{e}.w1.weight"], p[f"experts.{e}.w3.weight"], p[f"experts.{e}.w2.weight"]) for e in range(E)]
    u = routed_experts(z, idx, pw, experts, b1, b2)
    if use_norm:
        u = rms_norm(u, p["routed_expert_norm.weight"], eps)
    y = linear(u, p["routed_expert_up_proj.weight"])
    if n_shared > 0:
        y = y + glu_ffn(x2, p["shared_experts.gate_proj.weight"], p["shared_experts.up_proj.weight"],
                        p["shared_experts.down_proj.weight"], b1, b2)
    return y.reshape(shp)


def attn_res(sources, w_norm, w_proj, eps):
    """One Attention-Residual read (section 2, ops/attnres.json): score_s = w_p . (w_n * RMSNorm(src_s)),
    alpha = softmax over sources, output sum_s alpha_s src_s over the raw sources. No scaling.
    sources: list of [..., d]; w_proj [d] or [1, d]."""
    S = torch.stack(sources, dim=0)  # [N, ..., d]
    score = (rms_norm(S, w_norm, eps) * w_proj.reshape(-1)).sum(-1)  # [N, ...]
    alpha = torch.softmax(score, dim=0)
    return (alpha.unsqueeze(-1) * S).sum(0)
