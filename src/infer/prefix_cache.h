// Prefix cache for a hybrid model. KDA and conv states cannot be truncated back to an earlier
// position, so the cache keeps snapshots of a sequence's whole decode state at prefill chunk
// boundaries (every `chunk` tokens from position 0), keyed by the token prefix. Snapshots form
// a tree: a node holds the tokens of its chunk, the KDA/conv states after it, and only its
// chunk's rows of each MLA latent cache, so sequences that share a prefix share those rows
// (a repeated system prompt, the turns of a conversation, branches that re-join a prefix).
// Because the engine prefills in chunks aligned to absolute positions, a snapshot is bitwise
// the state an uncached run reaches at that boundary: restoring it changes no logits.
// Eviction: least recently used leaf that no running sequence pins. Not thread-safe (the
// engine's scheduler thread owns it).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "model/k3_model.h"

namespace k3 {

class PrefixCache {
 public:
  struct Node;
  // dev: the device the restored states live on (the model's; null: the host). Snapshots are
  // kept in host memory either way.
  PrefixCache(const ModelDims& dims, int64_t chunk, Device* dev = nullptr);
  ~PrefixCache();

  // The deepest snapshot whose prefix equals ids[0, pos) with pos <= limit; restores it into
  // st (reset first; st.n_tokens = pos) and returns it pinned. Nothing cached: the root
  // (pos 0, st reset), also pinned.
  Node* restore(const int32_t* ids, int64_t limit, DecodeState& st);
  // The snapshot after `parent`'s prefix plus ids [chunk tokens], st being the state there
  // (st.n_tokens == parent pos + chunk): found, or added; returned pinned, parent unpinned.
  Node* extend(Node* parent, const int32_t* ids, const DecodeState& st);
  void unpin(Node* n);
  static int64_t position(const Node* n);

  // Drops least recently used unpinned leaves until bytes() <= target; false if it cannot.
  bool shrink_to(int64_t target_bytes);
  int64_t bytes() const { return bytes_; }
  int64_t snapshots() const { return count_; }
  int64_t chunk() const { return chunk_; }
  int64_t snapshot_bytes() const;  // one snapshot's KDA/conv part (the MLA rows come per token)

 private:
  ModelDims dims_;
  Device* dev_ = nullptr;
  int64_t chunk_;
  std::unique_ptr<Node> root_;
  int64_t bytes_ = 0, count_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace k3
