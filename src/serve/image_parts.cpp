// Image content parts (see image_parts.h).
#include "serve/image_parts.h"

#include <cctype>

#include "core/error.h"
#include "io/tiktoken_file.h"  // base64

namespace k3::serve {

namespace {

bool starts_with_nocase(const std::string& s, const char* prefix) {
  size_t i = 0;
  for (; prefix[i]; ++i)
    if (i >= s.size() || std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

}  // namespace

std::vector<const Image*> RequestImages::ptrs() const {
  std::vector<const Image*> p;
  for (const Image& i : images) p.push_back(&i);
  return p;
}

std::string data_url_bytes(const std::string& url, const std::string& field) {
  if (starts_with_nocase(url, "http://") || starts_with_nocase(url, "https://"))
    throw ApiError(400,
                   field + ": image URLs are not fetched (this server reaches no network): send the image inline "
                           "as a data URL, data:image/png;base64,...",
                   field, "image_url_not_supported");
  if (!starts_with_nocase(url, "data:"))
    throw ApiError(400, field + ": expected a data URL (data:image/png;base64,...)", field, "invalid_image_url");
  const size_t comma = url.find(',');
  if (comma == std::string::npos)
    throw ApiError(400, field + ": a data URL needs a ',' before its data", field, "invalid_image_url");
  const std::string head = url.substr(5, comma - 5);
  if (head.size() < 7 || !starts_with_nocase(head.substr(head.size() - 7), ";base64"))
    throw ApiError(400, field + ": only base64 data URLs are read (data:image/png;base64,...)", field,
                   "invalid_image_url");
  std::string bytes;
  if (!base64_decode(std::string_view(url).substr(comma + 1), bytes))
    throw ApiError(400, field + ": the data URL's data is not valid base64", field, "invalid_base64");
  return bytes;
}

RequestImages decode_request_images(const chat::Conversation& conv, bool has_vision, int64_t max_pixels) {
  RequestImages out;
  for (const chat::Message& m : conv.messages)
    for (const chat::ImagePart& p : m.images) {
      if (!has_vision)
        throw ApiError(400,
                       p.field + ": this model has no vision encoder (its config.json has no vision_config), so it "
                                 "cannot read image parts",
                       p.field, "model_has_no_vision");
      const std::string bytes = data_url_bytes(p.url, p.field);
      try {
        out.images.push_back(decode_image(bytes, p.field, max_pixels));
      } catch (const ImageTooLarge& e) {
        throw ApiError(413, e.what(), p.field, "image_too_large");
      } catch (const k3::Error& e) {
        throw ApiError(400, e.what(), p.field, "invalid_image");
      }
    }
  return out;
}

}  // namespace k3::serve
