// Prefix cache of decode-state snapshots (see prefix_cache.h).
#include "infer/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace k3 {

struct PrefixCache::Node {
  Node* parent = nullptr;
  int64_t pos = 0;                 // tokens of the prefix this node ends
  std::vector<int32_t> tokens;     // its chunk: ids [parent->pos, pos)
  std::vector<float> kda;          // per KDA layer: S, conv_q, conv_k, conv_v after pos tokens
  std::vector<float> mla;          // per MLA layer: c_kv then k_rope rows [parent->pos, pos)
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  int64_t pins = 0;
  uint64_t used = 0;
  int64_t bytes() const {
    return int64_t(sizeof(float) * (kda.size() + mla.size()) + sizeof(int32_t) * tokens.size() + sizeof(Node));
  }
};

PrefixCache::PrefixCache(const ModelDims& dims, int64_t chunk, Device* dev)
    : dims_(dims), dev_(dev), chunk_(chunk), root_(new Node) {
  K3_ASSERT(chunk > 0, "PrefixCache: chunk must be positive");
}
PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::position(const Node* n) { return n->pos; }

int64_t PrefixCache::snapshot_bytes() const {
  const KDADims& k = dims_.kda;
  const int64_t per_layer = k.H * k.D * k.D + 3 * k.H * k.D * (k.conv_k - 1);
  int64_t n_kda = 0;
  for (bool m : dims_.mla) n_kda += m ? 0 : 1;
  return int64_t(sizeof(float)) * per_layer * n_kda;
}

PrefixCache::Node* PrefixCache::restore(const int32_t* ids, int64_t limit, DecodeState& st) {
  Node* n = root_.get();
  std::vector<int32_t> key(static_cast<size_t>(chunk_));
  while (n->pos + chunk_ <= limit) {
    key.assign(ids + n->pos, ids + n->pos + chunk_);
    auto it = n->children.find(key);
    if (it == n->children.end()) break;
    n = it->second.get();
  }
  st.reset(dims_, dev_);
  // MLA rows come from every node on the path, oldest first.
  std::vector<const Node*> path;
  for (const Node* p = n; p != root_.get(); p = p->parent) path.push_back(p);
  std::reverse(path.begin(), path.end());
  const int64_t L = dims_.mla_dims.kv_lora, Rr = dims_.mla_dims.rope;
  for (const Node* p : path) {
    const int64_t rows = p->pos - p->parent->pos;
    size_t off = 0;
    for (int64_t i = 0; i < dims_.L; ++i) {
      if (!dims_.mla[size_t(i)]) continue;
      MLACache& c = st.layers[size_t(i)].mla;
      c.c_kv.append(p->mla.data() + off, size_t(rows * L));
      off += size_t(rows * L);
      c.k_rope.append(p->mla.data() + off, size_t(rows * Rr));
      off += size_t(rows * Rr);
      c.n += rows;
    }
  }
  if (n != root_.get()) {
    size_t off = 0;
    for (int64_t i = 0; i < dims_.L; ++i) {
      if (dims_.mla[size_t(i)]) continue;
      KDAState& k = st.layers[size_t(i)].kda;
      for (Buf<float>* v : {&k.S, &k.conv_q, &k.conv_k, &k.conv_v}) {
        v->write(0, n->kda.data() + off, v->size());
        off += v->size();
      }
    }
  }
  st.n_tokens = n->pos;
  ++n->pins;
  for (Node* p = n; p; p = p->parent) p->used = ++tick_;
  return n;
}

namespace {

// dst += n elements of src from `from` (src on the host or a device; snapshots live on the host).
void append_from(std::vector<float>& dst, const Buf<float>& src, size_t from, size_t n) {
  const size_t at = dst.size();
  dst.resize(at + n);
  src.read(dst.data() + at, from, n);
}

}  // namespace

PrefixCache::Node* PrefixCache::extend(Node* parent, const int32_t* ids, const DecodeState& st) {
  K3_ASSERT(st.n_tokens == parent->pos + chunk_, "PrefixCache::extend: state is not one chunk past the parent");
  std::vector<int32_t> key(ids, ids + chunk_);
  auto it = parent->children.find(key);
  Node* n;
  if (it != parent->children.end()) {
    n = it->second.get();
  } else {
    auto node = std::make_unique<Node>();
    node->parent = parent;
    node->pos = st.n_tokens;
    node->tokens = key;
    const int64_t L = dims_.mla_dims.kv_lora, Rr = dims_.mla_dims.rope, p0 = parent->pos;
    for (int64_t i = 0; i < dims_.L; ++i) {
      const LayerState& ls = st.layers[size_t(i)];
      if (dims_.mla[size_t(i)]) {
        append_from(node->mla, ls.mla.c_kv, size_t(p0 * L), size_t(chunk_ * L));
        append_from(node->mla, ls.mla.k_rope, size_t(p0 * Rr), size_t(chunk_ * Rr));
      } else {
        for (const Buf<float>* v : {&ls.kda.S, &ls.kda.conv_q, &ls.kda.conv_k, &ls.kda.conv_v})
          append_from(node->kda, *v, 0, v->size());
      }
    }
    n = node.get();
    bytes_ += n->bytes();
    ++count_;
    parent->children.emplace(std::move(key), std::move(node));
  }
  ++n->pins;
  unpin(parent);
  n->used = ++tick_;
  return n;
}

void PrefixCache::unpin(Node* n) {
  K3_ASSERT(n && n->pins > 0, "PrefixCache::unpin: node not pinned");
  --n->pins;
}

bool PrefixCache::shrink_to(int64_t target) {
  while (bytes_ > target) {
    // The least recently used unpinned leaf (a depth-first walk: the tree holds at most a few
    // thousand snapshots, each far costlier to recompute than to find).
    Node* best = nullptr;
    std::vector<Node*> stack = {root_.get()};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (auto& [k, c] : n->children) stack.push_back(c.get());
      if (n != root_.get() && n->children.empty() && n->pins == 0 && (!best || n->used < best->used)) best = n;
    }
    if (!best) return false;
    bytes_ -= best->bytes();
    --count_;
    best->parent->children.erase(best->tokens);
  }
  return true;
}

}  // namespace k3
