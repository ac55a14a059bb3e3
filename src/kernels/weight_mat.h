// A weight matrix as it is held in memory: f32 (or double, for the gradient checks), or bf16
// as the checkpoint stores it (inference: the decode step then reads 2 bytes per weight, and
// the kernels widen them in registers; kernels/gemm.h). Row-major [rows, cols] like nn.Linear.
// Converts implicitly from a plain pointer, so code that only ever sees f32 weights (training,
// the backward passes, the double wiring) keeps using pointers; asking a bf16 matrix for its
// f32 pointer is a broken invariant (K3_ASSERT).
#pragma once
#include <cstdint>

#include "core/error.h"

namespace k3 {

template <typename R>
struct MatT {
  const R* f = nullptr;            // f32 / double storage
  const uint16_t* bf16 = nullptr;  // bf16 storage (R = float only)

  MatT() = default;
  MatT(const R* p) : f(p) {}  // NOLINT: implicit on purpose (see above)
  static MatT from_bf16(const uint16_t* p) {
    MatT m;
    m.bf16 = p;
    return m;
  }
  bool present() const { return f || bf16; }
  bool is_bf16() const { return bf16 != nullptr; }
  operator const R*() const {  // NOLINT
    K3_ASSERT(!bf16, "a bf16-held weight matrix was used where only f32 weights are supported");
    return f;
  }
  // The view `n` elements further on (a row offset times the row length).
  MatT offset(int64_t n) const {
    MatT m;
    if (f) m.f = f + n;
    if (bf16) m.bf16 = bf16 + n;
    return m;
  }
};
using Mat = MatT<float>;

}  // namespace k3
