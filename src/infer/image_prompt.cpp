// Images in a prompt (see image_prompt.h).
#include "infer/image_prompt.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace k3 {

namespace {

// FNV-1a 64 over the image's size and pixels (the float bits: the decoded image, so a PNG and
// a PPM of the same pixels key alike).
uint64_t image_hash(const Image& img) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&img.height, sizeof img.height);
  mix(&img.width, sizeof img.width);
  mix(img.rgb.data(), img.rgb.size() * sizeof(float));
  return h;
}

// A negative key for token j of an image with hash h (token ids are >= 0, so no text token
// can match it); splitmix64 finaliser for the mixing.
int32_t key_of(uint64_t h, int64_t j) {
  uint64_t z = h + 0x9e3779b97f4a7c15ull * uint64_t(j + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return -1 - int32_t(z & 0x3fffffff);
}

}  // namespace

int64_t image_token_count(const VisionModel& vm, const Image& img) {
  return image_token_count(vm.dims, image_grid(vm.dims, img.height, img.width));
}

std::vector<float> encode_image(const VisionModel& vm, const Image& img) {
  VisionBatch<float> batch;
  append_image(batch, vm.dims, img.rgb.data(), img.height, img.width);
  std::vector<float> rows(size_t(batch.token_count(vm.dims) * vm.dims.text_width));
  vision_forward<float>(rows.data(), nullptr, vm.params.data(), vm.layout, vm.dims, batch);
  return rows;
}

int64_t count_id(const std::vector<int32_t>& ids, int32_t id) {
  return int64_t(std::count(ids.begin(), ids.end(), id));
}

ImagePrompt expand_image_prompt(const VisionModel& vm, const std::vector<int32_t>& ids,
                                const std::vector<const Image*>& images, const std::string& what) {
  const int64_t placeholders = count_id(ids, vm.media_id);
  if (placeholders != int64_t(images.size()))
    fail(what + ": the prompt holds " + std::to_string(placeholders) + " media placeholder(s) (id " +
         std::to_string(vm.media_id) + ") for " + std::to_string(images.size()) + " image(s)");
  ImagePrompt out;
  size_t next = 0;
  for (int32_t t : ids) {
    if (t != vm.media_id) {
      out.ids.push_back(t);
      out.cache_key.push_back(t);
      continue;
    }
    const Image& img = *images[next++];
    const std::vector<float> rows = encode_image(vm, img);
    const int64_t n = int64_t(rows.size()) / vm.dims.text_width;
    const uint64_t h = image_hash(img);
    for (int64_t j = 0; j < n; ++j) out.ids.push_back(t), out.cache_key.push_back(key_of(h, j));
    out.rows.insert(out.rows.end(), rows.begin(), rows.end());
    out.image_tokens += n;
  }
  return out;
}

}  // namespace k3
