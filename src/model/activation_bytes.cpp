// Activation bytes of a training forward by role (see activation_bytes.h).
#include "model/activation_bytes.h"

namespace k3 {

namespace {

template <typename V>
int64_t cap(const V& v) {
  return int64_t(v.capacity() * sizeof(typename V::value_type));
}

}  // namespace

template <typename R>
std::map<std::string, int64_t> activation_bytes(const ForwardRecordT<R>& rec) {
  std::map<std::string, int64_t> m;
  auto add = [&](const std::string& role, int64_t b) {
    if (b) m[role] += b;
  };
  add("stack.blocks", cap(rec.blocks));
  add("stack.partial", cap(rec.partial));
  add("output.alpha", cap(rec.alpha_out));
  add("output.h_out", cap(rec.h_out));
  add("output.rstd", cap(rec.rstd_final));
  add("output.h_final", cap(rec.h_final));
  for (const LayerRecordT<R>& l : rec.layers) {
    add("layer.partial_in", cap(l.partial_in));
    add("layer.alpha", cap(l.alpha_attn) + cap(l.alpha_mlp));
    add("layer.rstd", cap(l.rstd_attn) + cap(l.rstd_mlp));
    add("layer.partial_mid", cap(l.partial_mid));
    add("dense.gu", cap(l.dense_gu));
    const KDASavedT<R>& k = l.kda;
    add("kda.x", cap(k.x));
    add("kda.state0", cap(k.S0) + cap(k.conv_q0) + cap(k.conv_k0) + cap(k.conv_v0));
    add("kda.lin", cap(k.q_lin) + cap(k.k_lin) + cap(k.v_lin));
    add("kda.small", cap(k.q_inv) + cap(k.k_inv) + cap(k.beta) + cap(k.fa) + cap(k.o_rstd));
    add("kda.z", cap(k.z));
    add("kda.o_gate", cap(k.o) + cap(k.gate_lin));
    add("kda.chunk_states", int64_t(k.ws.bytes()));
    const MLASavedT<R>& a = l.mla;
    add("mla.x", cap(a.x));
    add("mla.rest", cap(a.cq_raw) + cap(a.cq_rstd) + cap(a.cq) + cap(a.q) + cap(a.kva) + cap(a.ckv_rstd) + cap(a.ckv) +
                        cap(a.kv) + cap(a.o) + cap(a.lse) + cap(a.gate_lin));
    const LatentMoESavedT<R>& e = l.moe;
    add("moe.x", cap(e.x));
    add("moe.routing", cap(e.routing.idx) + cap(e.routing.weight) + cap(e.routing.scores));
    add("moe.z_u", cap(e.z) + cap(e.u) + cap(e.u_rstd));
    add("moe.slot_gu", cap(e.slot_gu));
    add("moe.slot_y", cap(e.slot_y));
    add("moe.shared_gu", cap(e.shared_gu));
  }
  return m;
}

template <typename R>
int64_t activation_bytes_total(const ForwardRecordT<R>& rec) {
  int64_t t = 0;
  for (const auto& [role, b] : activation_bytes(rec)) t += b;
  return t;
}

template std::map<std::string, int64_t> activation_bytes<float>(const ForwardRecordT<float>&);
template std::map<std::string, int64_t> activation_bytes<double>(const ForwardRecordT<double>&);
template int64_t activation_bytes_total<float>(const ForwardRecordT<float>&);
template int64_t activation_bytes_total<double>(const ForwardRecordT<double>&);

}  // namespace k3
