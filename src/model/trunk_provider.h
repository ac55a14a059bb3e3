// Memory-limited inference with the dense trunk streamed: the decoder layers' dense matrices
// are not held by the model (ParamLayout::streamed) and a TrunkProvider supplies each layer's
// weight views while that layer computes (infer/trunk_ring.h reads them from the checkpoint
// into a ring of owned slots; docs/model.md section 9). The float engine's forward and
// forward_batch (prefill chunks and decode steps alike) run, per call:
//   begin_call(); for i in 0..L-1: w = acquire(i); prefetch(i + 1, or P after the last); layer i
//   on w; release(i); end_call()   (layers i < P = first_streamed() pinned: the store's views)
// so layer i + 1 (and, at the last layer, layer 0 of the next call) is read while layer i
// computes. A call that throws still ends (end_call releases what it holds).
#pragma once
#include <cstdint>

#include "model/decoder.h"

namespace k3 {

class TrunkProvider {
 public:
  virtual ~TrunkProvider() = default;
  // One forward call at a time: a second thread's call waits for the first one's end_call.
  virtual void begin_call() = 0;
  virtual void end_call() = 0;
  // Layer `layer`'s views, blocking until its bytes are in a slot (k3::Error naming the file,
  // the offset and the tensor if the read failed; the next acquire reads it again). Valid
  // until release(layer); the routed experts carry shapes only, and the caller sets the
  // MoE block's expert-provider fields.
  virtual LayerWeights& acquire(int64_t layer) = 0;
  // Start reading `layer` into a free slot (no-op when it is there or on its way).
  virtual void prefetch(int64_t layer) = 0;
  virtual void release(int64_t layer) = 0;
  // Layers below this one are pinned: the model's store holds them and computes them from its
  // own views (acquire / prefetch / release only for layers >= first_streamed()).
  virtual int64_t first_streamed() const { return 0; }
};

}  // namespace k3
