// Image content parts of a chat request (OpenAI's {"type": "image_url", "image_url": {"url":
// "data:image/png;base64,..."}}) -> decoded images, in the order the prompt renders them
// (messages in order, each message's parts in order). The server reaches no network, so only
// inline data: URLs with base64 data are read (http(s) URLs are a 400 saying so); the bytes
// are PNG or binary PGM/PPM, sniffed by content (io/image.h). Errors are ApiErrors naming the
// part's field: 400 for a model without vision_config, a bad URL, bad base64 or bytes that are
// no image; 413 for an image over the pixel limit (checked before its raster is decoded).
#pragma once
#include <cstdint>
#include <vector>

#include "io/chat_types.h"
#include "io/image.h"
#include "serve/api_error.h"

namespace k3::serve {

struct RequestImages {
  std::vector<Image> images;
  std::vector<const Image*> ptrs() const;
};

// `has_vision`: the model has an encoder. `max_pixels` > 0: larger images are a 413.
RequestImages decode_request_images(const chat::Conversation& conv, bool has_vision, int64_t max_pixels);

// One data: URL -> its bytes (base64-decoded); `field` names it in the ApiError.
std::string data_url_bytes(const std::string& url, const std::string& field);

}  // namespace k3::serve
