// Memory-limited inference with the embedding and the lm_head streamed (docs/model.md section
// 9: for the full K3 they are 4.70 GB in bf16, more than half of an 8 GB budget): the model
// holds neither (ParamLayout::streamed) and a HeadProvider supplies embedding rows on demand
// and the lm_head in blocks of rows (infer/head_stream.h reads them from the checkpoint into
// owned buffers). The model computes the logits block by block with the same kernel call for
// every block whether the lm_head is held or streamed (K3Model::head_block_rows), so the
// logits are bitwise those of the resident run:
//   begin_head(); for b in 0..blocks-1: W = acquire_block(b); logits[:, rows of b] = h W^T;
//   release_block(b); end_head()
// A call that throws still ends (end_head releases what it holds).
#pragma once
#include <cstdint>

#include "kernels/weight_mat.h"

namespace k3 {

class HeadProvider {
 public:
  virtual ~HeadProvider() = default;
  // dst [T, d] = the embedding rows of ids as f32 (what mat_row gives for the held matrix);
  // k3::Error naming the file, the tensor and the offset when a read fails.
  virtual void embed_rows(float* dst, const int32_t* ids, int64_t T) = 0;
  // Rows of the lm_head per block (the last block may be shorter).
  virtual int64_t block_rows() const = 0;
  // One lm_head product at a time: a second thread's waits for the first one's end_head.
  virtual void begin_head() = 0;
  virtual void end_head() = 0;
  // Block b's rows [b * block_rows, ...) as held ([rows, d]), blocking until its bytes are
  // there (k3::Error naming the file, the offset and the tensor if the read failed; the next
  // acquire reads it again); the next block is read while this one computes. Valid until
  // release_block(b).
  virtual Mat acquire_block(int64_t b) = 0;
  virtual void release_block(int64_t b) = 0;
};

}  // namespace k3
