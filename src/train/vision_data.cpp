// Vision training data (see vision_data.h).
#include "train/vision_data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "core/error.h"

namespace k3 {

namespace {

// SplitMix64: a per-example generator seeded by (seed, stream, index).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Image blank(int64_t h, int64_t w, float v) {
  Image im;
  im.height = h, im.width = w;
  im.rgb.assign(size_t(3 * h * w), v);
  return im;
}

void put(Image& im, int64_t y, int64_t x, const float c[3]) {
  if (y < 0 || x < 0 || y >= im.height || x >= im.width) return;
  for (int k = 0; k < 3; ++k) im.rgb[size_t((k * im.height + y) * im.width + x)] = c[k];
}

const float kColours[4][3] = {{0.9f, 0.1f, 0.1f}, {0.1f, 0.75f, 0.1f}, {0.1f, 0.2f, 0.9f}, {0.95f, 0.85f, 0.1f}};
const char* kColourNames[4] = {"red", "green", "blue", "yellow"};
const char* kShapeNames[3] = {"square", "circle", "triangle"};

// A shape of size s (pixels) with its top-left corner at (y0, x0).
void draw_shape(Image& im, int shape, int colour, int64_t y0, int64_t x0, int64_t s) {
  for (int64_t dy = 0; dy < s; ++dy)
    for (int64_t dx = 0; dx < s; ++dx) {
      bool in = true;
      const double cy = dy + 0.5 - s / 2.0, cx = dx + 0.5 - s / 2.0;
      if (shape == 1) in = cy * cy + cx * cx <= (s / 2.0) * (s / 2.0);
      if (shape == 2) in = std::fabs(cx) <= (dy + 0.5) / 2.0;  // apex at the top
      if (in) put(im, y0 + dy, x0 + dx, kColours[colour]);
    }
}

}  // namespace

const char* vision_task_name(VisionTask t) {
  switch (t) {
    case VisionTask::Fashion: return "fashion";
    case VisionTask::Scenes: return "scenes";
    case VisionTask::Arithmetic: return "arithmetic";
  }
  return "?";
}

VisionTask parse_vision_task(const std::string& name, const std::string& source) {
  if (name == "fashion") return VisionTask::Fashion;
  if (name == "scenes") return VisionTask::Scenes;
  if (name == "arithmetic") return VisionTask::Arithmetic;
  fail_input(source, "vision.tasks", "unknown task \"" + name + "\" (expected fashion, scenes or arithmetic)");
}

const std::vector<std::string>& fashion_class_names() {
  static const std::vector<std::string> n = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                             "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  return n;
}

const char* scene_question_type(int q) {
  static const char* n[4] = {"colour", "shape", "position", "count"};
  return q >= 0 && q < 4 ? n[q] : "?";
}
double scene_chance(int q) { return q == 1 ? 1.0 / 3 : q == 2 ? 0.5 : 0.25; }

Unifont Unifont::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail_input(path, "", "cannot open the font (apt install unifont; scripts/setup.sh)");
  Unifont u;
  std::string line;
  int64_t no = 0;
  while (std::getline(f, line)) {
    ++no;
    const size_t c = line.find(':');
    if (c == std::string::npos || c == 0) fail_input(path, "line " + std::to_string(no), "expected CODEPOINT:HEX");
    const uint32_t cp = uint32_t(std::stoul(line.substr(0, c), nullptr, 16));
    if (cp > 0x7e) continue;  // printable ASCII is all the renderer draws
    const std::string hex = line.substr(c + 1);
    if (hex.size() != 32 && hex.size() != 64)
      fail_input(path, "line " + std::to_string(no), "glyph of " + std::to_string(hex.size()) + " hex digits (expected 32 or 64)");
    Glyph g;
    g.width = hex.size() == 32 ? 8 : 16;
    const size_t per = size_t(g.width / 4);
    for (size_t r = 0; r < 16; ++r) g.rows.push_back(uint16_t(std::stoul(hex.substr(r * per, per), nullptr, 16)));
    u.glyphs_[cp] = std::move(g);
  }
  if (u.glyphs_.empty()) fail_input(path, "", "no ASCII glyphs");
  return u;
}

Image Unifont::render(const std::string& text) const {
  int64_t w = 0;
  for (unsigned char ch : text) w += glyphs_.count(ch) ? glyphs_.at(ch).width : 8;
  Image im = blank(16, std::max<int64_t>(w, 1), 1.0f);
  const float ink[3] = {0, 0, 0};
  int64_t x0 = 0;
  for (unsigned char ch : text) {
    auto it = glyphs_.find(ch);
    if (it == glyphs_.end()) {
      x0 += 8;
      continue;
    }
    const Glyph& g = it->second;
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t x = 0; x < g.width; ++x)
        if (g.rows[size_t(r)] >> (g.width - 1 - x) & 1) put(im, r, x0 + x, ink);
    x0 += g.width;
  }
  return im;
}

VisionExample render_scene(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(mix(seed ^ mix(uint64_t(index) * 4 + 1)));
  VisionExample ex;
  ex.task = VisionTask::Scenes;
  ex.image = blank(32, 32, 1.0f);
  ex.qtype = int(rng() % 4);
  const int colour = int(rng() % 4), shape = int(rng() % 3);
  if (ex.qtype == 3) {  // count: 1-4 shapes of one kind and colour in distinct cells
    const int n = 1 + int(rng() % 4);
    std::vector<int> cells = {0, 1, 2, 3};
    std::shuffle(cells.begin(), cells.end(), rng);
    for (int i = 0; i < n; ++i)
      draw_shape(ex.image, shape, colour, 2 + (cells[size_t(i)] / 2) * 16 + int64_t(rng() % 3), 2 + (cells[size_t(i)] % 2) * 16 + int64_t(rng() % 3), 11);
    ex.question = "how many?";
    ex.answer = std::to_string(n);
    return ex;
  }
  // One shape, in the left or the right half, at a random height.
  const int side = int(rng() % 2);
  draw_shape(ex.image, shape, colour, 2 + int64_t(rng() % 16), 1 + side * 16 + int64_t(rng() % 4), 12);
  if (ex.qtype == 0) ex.question = "what colour?", ex.answer = kColourNames[colour];
  if (ex.qtype == 1) ex.question = "what shape?", ex.answer = kShapeNames[shape];
  if (ex.qtype == 2) ex.question = "left or right?", ex.answer = side ? "right" : "left";
  return ex;
}

VisionDataSource::VisionDataSource(std::string fashion_dir, std::string unifont_path, uint64_t seed)
    : fashion_dir_(std::move(fashion_dir)), unifont_path_(std::move(unifont_path)), seed_(seed) {}

void VisionDataSource::load_fashion() {
  if (fashion_loaded_) return;
  const std::string d = fashion_dir_ + "/";
  fashion_train_ = load_idx_images(d + "train-images-idx3-ubyte.gz");
  fashion_train_labels_ = load_idx_labels(d + "train-labels-idx1-ubyte.gz");
  fashion_test_ = load_idx_images(d + "t10k-images-idx3-ubyte.gz");
  fashion_test_labels_ = load_idx_labels(d + "t10k-labels-idx1-ubyte.gz");
  if (int64_t(fashion_train_labels_.size()) != fashion_train_.n || int64_t(fashion_test_labels_.size()) != fashion_test_.n)
    fail_input(fashion_dir_, "", "image and label counts differ");
  fashion_loaded_ = true;
}

int64_t VisionDataSource::size(VisionTask task, bool test) {
  if (task != VisionTask::Fashion) return -1;
  load_fashion();
  return test ? fashion_test_.n : fashion_train_.n;
}

VisionExample VisionDataSource::example(VisionTask task, bool test, int64_t index) {
  // Test examples of the rendered tasks come from another seed stream than training ones.
  const uint64_t s = mix(seed_ ^ (test ? 0x7e57ULL : 0x7a1eULL));
  if (task == VisionTask::Scenes) return render_scene(s, index);
  VisionExample ex;
  ex.task = task;
  if (task == VisionTask::Fashion) {
    load_fashion();
    const IdxImages& im = test ? fashion_test_ : fashion_train_;
    const std::vector<uint8_t>& lab = test ? fashion_test_labels_ : fashion_train_labels_;
    const int64_t i = index % im.n, hw = im.rows * im.cols;
    ex.image = blank(im.rows, im.cols, 0.0f);
    for (int64_t p = 0; p < hw; ++p)
      for (int c = 0; c < 3; ++c) ex.image.rgb[size_t(c * hw + p)] = float(im.pixels[size_t(i * hw + p)]) / 255.0f;
    ex.label = lab[size_t(i)];
    ex.question = "what is this?";
    ex.answer = fashion_class_names()[size_t(ex.label)];
    return ex;
  }
  if (!font_loaded_) font_ = Unifont::load(unifont_path_), font_loaded_ = true;
  std::mt19937_64 rng(mix(s ^ mix(uint64_t(index) * 4 + 3)));
  const int a = 10 + int(rng() % 90), b = 10 + int(rng() % 90);
  return arithmetic_example(font_, a, b);
}

VisionExample arithmetic_example(const Unifont& font, int a, int b) {
  VisionExample ex;
  ex.task = VisionTask::Arithmetic;
  ex.image = font.render(std::to_string(a) + "+" + std::to_string(b));
  ex.question = "sum?";
  ex.answer = std::to_string(a + b);
  return ex;
}

}  // namespace k3
