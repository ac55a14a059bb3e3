// Images for the vision encoder: PNG (libpng: grey, grey + alpha, RGB, RGBA, palette, 8 or 16
// bits; alpha dropped) and binary PGM / PPM (P5 / P6, maxval up to 65535), read into planar RGB
// floats in [0, 1]; grey images fill all three planes. PGM/PPM/PNG written atomically (tests,
// rendered data). Bad input (missing file, bad signature, truncated data, an unsupported
// format) is a k3::Error naming the file and the problem.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace k3 {

struct Image {
  int64_t height = 0, width = 0;
  std::vector<float> rgb;  // [3, height, width]
};

Image load_image(const std::string& path);  // by content: PNG signature, else "P5" / "P6"
// The same from bytes in memory (`what` names them in errors, e.g. a request field). An image
// of more than `max_pixels` pixels (0: no limit beyond PGM/PPM's 32768 a side) is refused
// before its raster is decoded: ImageTooLarge, so a server can answer 413 to a small PNG that
// would inflate to gigabytes.
Image decode_image(const std::string& bytes, const std::string& what, int64_t max_pixels = 0);
struct ImageTooLarge : Error {
  using Error::Error;
};
// 8-bit PNG (RGB) or PPM (P6), chosen by the extension ".png" / otherwise; atomic.
void save_image(const std::string& path, const Image& img);

// Fashion-MNIST / MNIST idx files, gzip-compressed or not (zlib). idx3: images [n, rows, cols]
// u8; idx1: labels [n] u8. k3::Error naming the file on a bad magic number or a short file.
struct IdxImages {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};
IdxImages load_idx_images(const std::string& path);
std::vector<uint8_t> load_idx_labels(const std::string& path);

}  // namespace k3
