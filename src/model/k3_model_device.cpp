// A K3 model on a device backend (see K3ModelT::to_backend in k3_model.h): every weight copied
// once into the device's memory as it is held on the host (f32, bf16 matrices as stored, MXFP4
// routed experts as packed bytes and scales), and the layer views rebuilt over those copies, so
// the one wiring (model/decoder.h) runs there unchanged.
#include <memory>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "model/bind_layer.h"
#include "model/k3_model.h"
#include "model/param_specs.h"

namespace k3 {

namespace {

// A Tensor viewing n bytes of `t` copied to dev (the copy kept alive by the view).
Tensor device_copy(Device* dev, const Tensor& t) {
  auto b = std::make_shared<Buf<uint8_t>>();
  b->place(dev);
  b->append(static_cast<const uint8_t*>(t.raw()), t.nbytes());
  return Tensor::view_of(t.dtype(), t.shape(), b->data(), b);
}

}  // namespace

template <typename R>
int64_t K3ModelT<R>::device_weight_bytes() const {
  const ParamLayout& lay = store_.layout();
  int64_t n = int64_t(sizeof(R)) * store_.size();
  for (size_t i = 0; i < lay.size(); ++i) {
    if (lay.bf16_held(i)) n += int64_t(store_.bf16(i).nbytes());
    if (store_.expert_storage() == ExpertStorage::Mxfp4 && store_.has_mxfp4(i))
      n += int64_t(store_.mxfp4(i).packed.nbytes() + store_.mxfp4(i).scales.nbytes());
  }
  return n;
}

template <typename R>
void K3ModelT<R>::to_backend(std::shared_ptr<const OpsT<R>> ops) {
  K3_ASSERT(ops != nullptr, "to_backend: no backend");
  Device* dev = ops->device();
  if (!dev) {
    ops_ = std::move(ops);
    dev_.reset();
    return;
  }
  if constexpr (!std::is_same_v<R, float>) {
    fail("the double model runs on the CPU only (it exists for gradient checks)");
  } else {
    if (trunk_streamed_ || head_streamed_ || store_.experts_external() || provider_ || trunk_ || head_)
      fail("a model whose weights are streamed from disk (--ram-budget) runs on the CPU only; on " + dev->name() +
           " every weight must fit in device memory");
    const int64_t need = device_weight_bytes(), free = dev->free_bytes();
    if (need > free)
      fail("the model's weights take " + std::to_string(need >> 20) + " MiB of device memory, " + dev->name() + " has " +
           std::to_string(free >> 20) + " MiB free (k3cpp plan --device-gib says how many GPUs the model needs)");
    auto dw = std::make_unique<DeviceWeights>();
    dw->params.place(dev);
    dw->params.append(store_.data(), size_t(store_.size()));
    const ParamLayout& lay = store_.layout();
    dw->bf16.resize(lay.size());
    dw->mx.resize(lay.size());
    for (size_t i = 0; i < lay.size(); ++i) {
      if (lay.bf16_held(i)) {
        const Tensor& t = store_.bf16(i);
        auto b = std::make_shared<Buf<uint16_t>>();
        b->place(dev);
        b->append(t.data<uint16_t>(), size_t(t.numel()));
        dw->bf16[i] = std::move(b);
      }
      if (store_.expert_storage() == ExpertStorage::Mxfp4 && store_.has_mxfp4(i)) {
        const Mxfp4Matrix& m = store_.mxfp4(i);
        Mxfp4Matrix d;
        d.packed = device_copy(dev, m.packed);
        d.scales = device_copy(dev, m.scales);
        d.rows = m.rows;
        d.cols = m.cols;
        dw->mx[i] = std::move(d);
      }
    }
    DeviceWeights& D = *dw;
    auto P = [&](const std::string& name) -> Mat {
      const size_t i = lay.index(name);
      if (lay.bf16_held(i)) return Mat::from_bf16(D.bf16[i]->data());
      return Mat(D.params.data() + lay.offset(i));
    };
    auto X = [&](auto&& name_fn, int) {
      const size_t i = lay.index(name_fn());
      ExpertMatrix m;
      m.rows = lay.spec(i).shape[0];
      m.cols = lay.spec(i).shape[1];
      if (lay.in_buffer(i)) m.f32 = D.params.data() + lay.offset(i);
      else m.mx = &D.mx[i];
      return m;
    };
    D.layers.reserve(size_t(dims_.L));
    for (int64_t i = 0; i < dims_.L; ++i) D.layers.push_back(bind_layer<float>(config(), i, P, X));
    D.embed = P(kModelPrefix + "embed_tokens.weight");
    D.lm_head = config().tie_word_embeddings ? D.embed : P(kLmHeadName);
    D.out = {P(kOutputAttnResNormName), P(kOutputAttnResProjName), P(kModelPrefix + "norm.weight")};
    dev->synchronize();
    dev_ = std::move(dw);
    ops_ = std::move(ops);
  }
}

template <typename R>
typename K3ModelT<R>::OutputViews K3ModelT<R>::output_views() const {
  if (dev_) return dev_->out;
  return {final_res_norm_, final_res_proj_, final_norm_};
}

template <typename R>
MatT<R> K3ModelT<R>::dev_embed() const {
  return dev_->embed;
}

template <typename R>
MatT<R> K3ModelT<R>::dev_lm_head() const {
  return dev_->lm_head;
}

template <typename R>
const LayerWeightsT<R>& K3ModelT<R>::dev_layer(int64_t i) const {
  return dev_->layers.at(size_t(i));
}

#define K3_MODEL_DEVICE_MEMBERS(R)                                                     \
  template int64_t K3ModelT<R>::device_weight_bytes() const;                           \
  template void K3ModelT<R>::to_backend(std::shared_ptr<const OpsT<R>>);               \
  template K3ModelT<R>::OutputViews K3ModelT<R>::output_views() const;                 \
  template MatT<R> K3ModelT<R>::dev_embed() const;                                     \
  template MatT<R> K3ModelT<R>::dev_lm_head() const;                                   \
  template const LayerWeightsT<R>& K3ModelT<R>::dev_layer(int64_t) const;              \

K3_MODEL_DEVICE_MEMBERS(float)
K3_MODEL_DEVICE_MEMBERS(double)
#undef K3_MODEL_DEVICE_MEMBERS

}  // namespace k3
