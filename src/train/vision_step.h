// A joint image-text step of one sequence (docs/model.md section 11: the encoder trains with
// the text from the first step): the vision encoder turns the sequence's images into image
// tokens, they replace the expanded <|media_pad|> placeholders in the text embedding stream
// (K3ModelT::forward's EmbedSpliceT), the text stack's loss is back-propagated to those rows and
// on through the encoder. Parameter gradients accumulate (+=) into the text and vision buffers.
#pragma once
#include <cstdint>
#include <vector>

#include "model/vision_encoder.h"
#include "train/model_grad.h"

namespace k3 {

// ids with each occurrence of media_id (one per image, in order) repeated counts[i] times.
// k3::Error when the number of media_id tokens differs from counts.size().
std::vector<int32_t> expand_media_placeholders(const std::vector<int32_t>& ids, const std::vector<int64_t>& counts,
                                               int32_t media_id);

template <typename R>
struct VisionScratchT {
  VisionActs<R> acts;
  std::vector<R> rows, drows;  // [N, d] image tokens and their gradient
  double seconds_encoder = 0;  // accumulated wall time of the encoder's forward and backward
  int64_t images = 0;          // images encoded (training steps)
};

struct VisionModelRef {
  const VisionLayout* layout = nullptr;
  const VisionDims* dims = nullptr;
  int32_t media_id = -1;
};

// tokens [T + 1] (placeholders already expanded), images in placeholder order. Adds
// grad_scale * d(loss)/dW to grads (text) and vgrads (vision). loss: summed cross-entropy over
// the targets opt.target_mask keeps. vgrads may be null: no vision backward (a frozen encoder).
template <typename R>
SequenceResult vision_forward_backward_t(const K3ModelT<R>& model, const R* vparams, const VisionModelRef& vm,
                                         const VisionBatch<R>& images, const int32_t* tokens, int64_t T,
                                         double grad_scale, R* grads, R* vgrads, TrainScratchT<R>& s,
                                         VisionScratchT<R>& vs, const LossOptions& opt,
                                         SequenceRouting* routing_out = nullptr, KDAPath kda_path = KDAPath::Fast);
// The loss alone (evaluation, finite differences); images may be empty (then no splice).
template <typename R>
SequenceResult vision_forward_loss_t(const K3ModelT<R>& model, const R* vparams, const VisionModelRef& vm,
                                     const VisionBatch<R>& images, const int32_t* tokens, int64_t T,
                                     TrainScratchT<R>& s, VisionScratchT<R>& vs, const LossOptions& opt,
                                     KDAPath kda_path = KDAPath::Fast);

}  // namespace k3
