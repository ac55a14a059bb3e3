// Images in a prompt, one code path for `generate --image`, `chat --image` and the server's
// image content parts: the encoder runs on each image alone (model/vision_encoder.h), and each
// `<|media_pad|>` id of the prompt (one per image, in order) is expanded to that image's
// token count; the rows then replace those positions' embeddings (EmbedSpliceT). The prefix
// cache key is the prompt with every image token replaced by a value drawn from a hash of its
// image's pixels, so two different images behind the same text never share a snapshot.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/image.h"
#include "model/vision_encoder.h"

namespace k3 {

// Tokens the image contributes (the padding formula of model/vision_config.h).
int64_t image_token_count(const VisionModel& vm, const Image& img);
// The encoder's output for one image: [tokens, text width].
std::vector<float> encode_image(const VisionModel& vm, const Image& img);

struct ImagePrompt {
  std::vector<int32_t> ids;        // the prompt with each placeholder expanded
  std::vector<float> rows;         // [image tokens, text width], the images in order
  int64_t image_tokens = 0;
  std::vector<int32_t> cache_key;  // ids, image tokens replaced by negative image-hash values
};

// k3::Error ("`what`: ...") when the prompt's placeholder count differs from the images'.
ImagePrompt expand_image_prompt(const VisionModel& vm, const std::vector<int32_t>& ids,
                                const std::vector<const Image*>& images, const std::string& what);

// The count of `id` in ids.
int64_t count_id(const std::vector<int32_t>& ids, int32_t id);

}  // namespace k3
