// Joint image-text step (see vision_step.h).
#include "train/vision_step.h"

#include <chrono>

#include "core/error.h"

namespace k3 {

std::vector<int32_t> expand_media_placeholders(const std::vector<int32_t>& ids, const std::vector<int64_t>& counts,
                                               int32_t media_id) {
  std::vector<int32_t> out;
  size_t img = 0;
  for (int32_t t : ids) {
    if (t != media_id) {
      out.push_back(t);
      continue;
    }
    if (img >= counts.size())
      fail("the text holds more media placeholders (id " + std::to_string(media_id) + ") than the " +
           std::to_string(counts.size()) + " image(s) given");
    out.insert(out.end(), size_t(counts[img++]), media_id);
  }
  if (img != counts.size())
    fail("the text holds " + std::to_string(img) + " media placeholder(s) (id " + std::to_string(media_id) + ") but " +
         std::to_string(counts.size()) + " image(s) were given");
  return out;
}

namespace {

template <typename R>
EmbedSpliceT<R> encode_images(const R* vparams, const VisionModelRef& vm, const VisionBatch<R>& images,
                              VisionScratchT<R>& vs, bool record) {
  EmbedSpliceT<R> sp;
  sp.media_id = vm.media_id;
  sp.n = images.token_count(*vm.dims);
  vs.rows.resize(size_t(sp.n * vm.dims->text_width));
  vision_forward<R>(vs.rows.data(), record ? &vs.acts : nullptr, vparams, *vm.layout, *vm.dims, images);
  sp.rows = vs.rows.data();
  return sp;
}

}  // namespace

template <typename R>
SequenceResult vision_forward_backward_t(const K3ModelT<R>& model, const R* vparams, const VisionModelRef& vm,
                                         const VisionBatch<R>& images, const int32_t* tokens, int64_t T,
                                         double grad_scale, R* grads, R* vgrads, TrainScratchT<R>& s,
                                         VisionScratchT<R>& vs, const LossOptions& opt, SequenceRouting* routing_out,
                                         KDAPath kda_path) {
  K3_ASSERT(vm.dims->text_width == model.dims().d);
  if (images.grids.empty()) return forward_backward_t<R>(model, tokens, T, grad_scale, grads, s, opt, routing_out, kda_path);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  EmbedSpliceT<R> sp = encode_images(vparams, vm, images, vs, vgrads != nullptr);
  double enc = std::chrono::duration<double>(Clock::now() - t0).count();
  vs.drows.assign(vs.rows.size(), R(0));
  sp.drows = vs.drows.data();
  const SequenceResult res = forward_backward_t<R>(model, tokens, T, grad_scale, grads, s, opt, routing_out, kda_path, &sp);
  const auto t1 = Clock::now();
  if (vgrads) vision_backward<R>(vgrads, vs.drows.data(), vs.acts, vparams, *vm.layout, *vm.dims, images);
  enc += std::chrono::duration<double>(Clock::now() - t1).count();
  vs.seconds_encoder += enc;
  vs.images += int64_t(images.grids.size());
  return res;
}

template <typename R>
SequenceResult vision_forward_loss_t(const K3ModelT<R>& model, const R* vparams, const VisionModelRef& vm,
                                     const VisionBatch<R>& images, const int32_t* tokens, int64_t T,
                                     TrainScratchT<R>& s, VisionScratchT<R>& vs, const LossOptions& opt,
                                     KDAPath kda_path) {
  if (images.grids.empty()) return forward_loss_t<R>(model, tokens, T, s, opt, kda_path);
  const EmbedSpliceT<R> sp = encode_images(vparams, vm, images, vs, false);
  return forward_loss_t<R>(model, tokens, T, s, opt, kda_path, &sp);
}

#define K3_INSTANTIATE(R)                                                                                           \
  template SequenceResult vision_forward_backward_t<R>(const K3ModelT<R>&, const R*, const VisionModelRef&,         \
                                                       const VisionBatch<R>&, const int32_t*, int64_t, double, R*, \
                                                       R*, TrainScratchT<R>&, VisionScratchT<R>&,                  \
                                                       const LossOptions&, SequenceRouting*, KDAPath);             \
  template SequenceResult vision_forward_loss_t<R>(const K3ModelT<R>&, const R*, const VisionModelRef&,             \
                                                   const VisionBatch<R>&, const int32_t*, int64_t,                 \
                                                   TrainScratchT<R>&, VisionScratchT<R>&, const LossOptions&,     \
                                                   KDAPath);
K3_INSTANTIATE(float)
K3_INSTANTIATE(double)
#undef K3_INSTANTIATE

}  // namespace k3
