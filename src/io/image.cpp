// Image and idx file reading (see image.h).
#include "io/image.h"

#include <png.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "io/atomic_file.h"

namespace k3 {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_input(path, "", "cannot open the image file");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void check_pixels(const std::string& path, int64_t height, int64_t width, int64_t max_pixels) {
  if (max_pixels > 0 && height * width > max_pixels)
    throw ImageTooLarge(path + ": the image is " + std::to_string(width) + " x " + std::to_string(height) + " = " +
                        std::to_string(height * width) + " pixels, more than the limit of " +
                        std::to_string(max_pixels));
}

Image decode_png(const std::string& path, const std::string& bytes, int64_t max_pixels) {
  png_image im;
  std::memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&im, bytes.data(), bytes.size()))
    fail_input(path, "", std::string("not a readable PNG: ") + im.message);
  check_pixels(path, int64_t(im.height), int64_t(im.width), max_pixels);
  im.format = PNG_FORMAT_RGB;  // libpng converts grey, palette, alpha and 16-bit to 8-bit RGB
  std::vector<uint8_t> buf(PNG_IMAGE_SIZE(im));
  if (!png_image_finish_read(&im, nullptr, buf.data(), 0, nullptr)) {
    const std::string msg = im.message;
    png_image_free(&im);
    fail_input(path, "", "PNG data: " + msg);
  }
  Image out;
  out.height = im.height, out.width = im.width;
  out.rgb.resize(size_t(3 * out.height * out.width));
  const int64_t hw = out.height * out.width;
  for (int64_t p = 0; p < hw; ++p)
    for (int64_t c = 0; c < 3; ++c) out.rgb[size_t(c * hw + p)] = float(buf[size_t(p * 3 + c)]) / 255.0f;
  return out;
}

// Netpbm header: magic, width, height, maxval, separated by whitespace and # comments, then
// one whitespace byte before the raster.
Image decode_pnm(const std::string& path, const std::string& b, int64_t max_pixels) {
  const bool colour = b[1] == '6';
  size_t i = 2;
  auto number = [&](const char* what) {
    while (i < b.size() && (std::isspace(static_cast<unsigned char>(b[i])) || b[i] == '#')) {
      if (b[i] == '#')
        while (i < b.size() && b[i] != '\n') ++i;
      else
        ++i;
    }
    int64_t v = 0;
    size_t digits = 0;
    while (i < b.size() && b[i] >= '0' && b[i] <= '9' && digits < 9) v = v * 10 + (b[i++] - '0'), ++digits;
    if (digits == 0 || v <= 0) fail_input(path, what, "missing or not a positive number in the PGM/PPM header");
    return v;
  };
  Image out;
  out.width = number("width");
  out.height = number("height");
  const int64_t maxval = number("maxval");
  if (maxval > 65535) fail_input(path, "maxval", std::to_string(maxval) + " exceeds 65535");
  ++i;  // the single whitespace byte
  const int64_t ch = colour ? 3 : 1, bps = maxval > 255 ? 2 : 1, hw = out.height * out.width;
  if (out.width > 1 << 15 || out.height > 1 << 15) fail_input(path, "", "image larger than 32768 pixels on a side");
  check_pixels(path, out.height, out.width, max_pixels);
  if (int64_t(b.size()) - int64_t(i) < hw * ch * bps)
    fail_input(path, "", "truncated: the raster needs " + std::to_string(hw * ch * bps) + " bytes, the file has " +
                             std::to_string(int64_t(b.size()) - int64_t(i)));
  out.rgb.resize(size_t(3 * hw));
  const unsigned char* r = reinterpret_cast<const unsigned char*>(b.data()) + i;
  for (int64_t p = 0; p < hw; ++p)
    for (int64_t c = 0; c < 3; ++c) {
      const int64_t k = (p * ch + (colour ? c : 0)) * bps;
      const double v = bps == 2 ? double(r[k] << 8 | r[k + 1]) : double(r[k]);
      out.rgb[size_t(c * hw + p)] = float(v / double(maxval));
    }
  return out;
}

// The whole file, gunzipped when it starts with the gzip magic (zlib reads plain files too).
std::string read_maybe_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail_input(path, "", "cannot open the file");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  const bool bad = n < 0;
  gzclose(f);
  if (bad) fail_input(path, "", "gzip data is corrupt");
  return out;
}

uint32_t be32(const std::string& s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + at;
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

}  // namespace

Image load_image(const std::string& path) { return decode_image(read_all(path), path); }

Image decode_image(const std::string& b, const std::string& what, int64_t max_pixels) {
  if (b.size() >= 8 && png_sig_cmp(reinterpret_cast<png_const_bytep>(b.data()), 0, 8) == 0)
    return decode_png(what, b, max_pixels);
  if (b.size() >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return decode_pnm(what, b, max_pixels);
  fail_input(what, "", "not a PNG or binary PGM/PPM (P5/P6) image");
}

void save_image(const std::string& path, const Image& img) {
  const int64_t hw = img.height * img.width;
  std::vector<uint8_t> px(size_t(3 * hw));
  for (int64_t p = 0; p < hw; ++p)
    for (int64_t c = 0; c < 3; ++c) {
      const float v = std::min(1.0f, std::max(0.0f, img.rgb[size_t(c * hw + p)]));
      px[size_t(p * 3 + c)] = uint8_t(v * 255.0f + 0.5f);
    }
  std::string bytes;
  const bool png = path.size() >= 4 && path.compare(path.size() - 4, 4, ".png") == 0;
  if (png) {
    png_image im;
    std::memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = png_uint_32(img.width), im.height = png_uint_32(img.height), im.format = PNG_FORMAT_RGB;
    png_alloc_size_t n = 0;
    if (!png_image_write_to_memory(&im, nullptr, &n, 0, px.data(), 0, nullptr))
      fail_input(path, "", std::string("PNG encode: ") + im.message);
    bytes.resize(n);
    if (!png_image_write_to_memory(&im, bytes.data(), &n, 0, px.data(), 0, nullptr))
      fail_input(path, "", std::string("PNG encode: ") + im.message);
    bytes.resize(n);
  } else {
    bytes = "P6\n" + std::to_string(img.width) + " " + std::to_string(img.height) + "\n255\n";
    bytes.append(reinterpret_cast<const char*>(px.data()), px.size());
  }
  write_text_file_atomic(path, bytes);  // binary-safe: writes the bytes as given
}

IdxImages load_idx_images(const std::string& path) {
  const std::string b = read_maybe_gz(path);
  if (b.size() < 16 || be32(b, 0) != 0x00000803) fail_input(path, "magic", "not an idx3 (u8 images) file");
  IdxImages out;
  out.n = be32(b, 4), out.rows = be32(b, 8), out.cols = be32(b, 12);
  const int64_t need = out.n * out.rows * out.cols;
  if (int64_t(b.size()) - 16 < need)
    fail_input(path, "", "truncated: " + std::to_string(need) + " pixel bytes expected");
  out.pixels.assign(b.begin() + 16, b.begin() + 16 + need);
  return out;
}

std::vector<uint8_t> load_idx_labels(const std::string& path) {
  const std::string b = read_maybe_gz(path);
  if (b.size() < 8 || be32(b, 0) != 0x00000801) fail_input(path, "magic", "not an idx1 (u8 labels) file");
  const int64_t n = be32(b, 4);
  if (int64_t(b.size()) - 8 < n) fail_input(path, "", "truncated: " + std::to_string(n) + " labels expected");
  return std::vector<uint8_t>(b.begin() + 8, b.begin() + 8 + n);
}

}  // namespace k3
