// Image files (io/image.h): PNG and PPM written and read back exactly (8-bit), PGM grey into
// three equal planes, a 16-bit PGM, a comment in the header; bad files named in the error;
// the Fashion-MNIST idx files Debian installs (dataset-fashion-mnist, scripts/setup.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/image.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("k3_img_" + std::to_string(getpid()) + "_" + name)).string();
}
void write(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::string image_error_of(const std::string& path) {
  try {
    load_image(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Image, PngAndPpmRoundTrip) {
  Image img;
  img.height = 3, img.width = 5;
  for (int64_t i = 0; i < 3 * 15; ++i) img.rgb.push_back(float((i * 37) % 256) / 255.0f);
  for (const char* ext : {".png", ".ppm"}) {
    const std::string p = tmp(std::string("rt") + ext);
    save_image(p, img);
    const Image back = load_image(p);
    ASSERT_EQ(back.height, 3);
    ASSERT_EQ(back.width, 5);
    for (size_t i = 0; i < img.rgb.size(); ++i) EXPECT_FLOAT_EQ(back.rgb[i], img.rgb[i]) << ext << " " << i;
    fs::remove(p);
  }
}

TEST(Image, PgmGreyAnd16Bit) {
  const std::string p = tmp("g.pgm");
  write(p, std::string("P5\n# a comment\n2 1\n255\n") + char(0) + char(255));
  Image g = load_image(p);
  ASSERT_EQ(g.width, 2);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g.rgb[size_t(c * 2)], 0.0f);
    EXPECT_EQ(g.rgb[size_t(c * 2 + 1)], 1.0f);
  }
  write(p, std::string("P5 1 1 1000\n") + char(1) + char(244));  // 500 / 1000
  g = load_image(p);
  EXPECT_FLOAT_EQ(g.rgb[0], 0.5f);
  fs::remove(p);
}

TEST(Image, BadFilesAreNamed) {
  const std::string p = tmp("bad.pgm");
  EXPECT_NE(image_error_of(p).find(p), std::string::npos);  // missing
  write(p, "P5\n4 4\n255\nab");
  EXPECT_NE(image_error_of(p).find("truncated"), std::string::npos) << image_error_of(p);
  write(p, "GIF89a....");
  EXPECT_NE(image_error_of(p).find("not a PNG or binary PGM/PPM"), std::string::npos);
  write(p, std::string("\x89PNG\r\n\x1a\n", 8) + "garbage");
  EXPECT_NE(image_error_of(p).find("PNG"), std::string::npos);
  write(p, "P5\n0 4\n255\n");
  EXPECT_NE(image_error_of(p).find("width"), std::string::npos);
  fs::remove(p);
}

TEST(Image, FashionMnistIdxFiles) {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  ASSERT_TRUE(fs::exists(dir + "t10k-images-idx3-ubyte.gz")) << "apt install dataset-fashion-mnist (scripts/setup.sh)";
  const IdxImages im = load_idx_images(dir + "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(im.n, 10000);
  EXPECT_EQ(im.rows, 28);
  EXPECT_EQ(im.cols, 28);
  const std::vector<uint8_t> lab = load_idx_labels(dir + "t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(lab.size(), 10000u);
  std::vector<int> count(10, 0);
  for (uint8_t l : lab) {
    ASSERT_LT(l, 10);
    ++count[l];
  }
  for (int c : count) EXPECT_EQ(c, 1000);  // the test set is balanced
  EXPECT_THROW(load_idx_labels(dir + "t10k-images-idx3-ubyte.gz"), Error);
}

TEST(Image, DecodeFromMemoryWithAPixelLimit) {
  Image img;
  img.height = 3, img.width = 5;
  img.rgb.assign(45, 0.5f);
  const std::string p = tmp("mem.png");
  save_image(p, img);
  std::ifstream f(p, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  const Image back = decode_image(bytes, "req.image", 15);
  EXPECT_EQ(back.height, 3);
  EXPECT_EQ(back.width, 5);
  try {
    decode_image(bytes, "req.image", 14);
    FAIL() << "the limit was not applied";
  } catch (const ImageTooLarge& e) {
    EXPECT_NE(std::string(e.what()).find("req.image: the image is 5 x 3 = 15 pixels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_image("P5\n20000 20000\n255\n", "req.image", 100), ImageTooLarge);
  try {
    decode_image("GIF89a", "req.image");
    FAIL() << "a GIF was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("req.image: not a PNG or binary PGM/PPM"), std::string::npos) << e.what();
  }
  fs::remove(p);
}
