// Image-text training data for the vision encoder (docs/vision.md): three tasks, each example
// an image, a question and a short answer, generated deterministically from (task, split,
// index, seed):
//  - fashion: Fashion-MNIST (Debian's dataset-fashion-mnist idx files), "name the item"; the
//    train split reads the 60k training images, the test split the 10k test images;
//  - scenes: rendered 32 x 32 scenes of 1-4 coloured shapes (square, disc, triangle in red,
//    green, blue, yellow) with one question each about colour, shape, position (left/right
//    of a single shape) or count;
//  - arithmetic: "a+b" (a, b in 10..99) drawn with unifont's 8 x 16 glyphs (unifont.hex),
//    answered with the sum: a verifiable reward for post-training.
// Test examples use a different seed stream from training ones (scenes, arithmetic) or the
// test images (fashion).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/image.h"

namespace k3 {

enum class VisionTask { Fashion, Scenes, Arithmetic };
const char* vision_task_name(VisionTask t);           // "fashion", "scenes", "arithmetic"
VisionTask parse_vision_task(const std::string& name, const std::string& source);  // k3::Error naming source

struct VisionExample {
  Image image;
  std::string question, answer;
  VisionTask task = VisionTask::Fashion;
  int qtype = 0;   // scenes: 0 colour, 1 shape, 2 position, 3 count; else 0
  int label = -1;  // fashion: the class 0..9
};

// The ten Fashion-MNIST class names, as the answers spell them.
const std::vector<std::string>& fashion_class_names();
const char* scene_question_type(int qtype);  // "colour", "shape", "position", "count"
// Chance accuracy of a scene question type (1/4 colours, 1/3 shapes, 1/2 sides, 1/4 counts).
double scene_chance(int qtype);

// unifont.hex glyphs (code point -> rows of 16 bits, 8- or 16-pixel wide).
class Unifont {
 public:
  static Unifont load(const std::string& path);  // k3::Error naming the file and line
  // Renders `text` in black on white, 16 pixels high, each glyph its own width.
  Image render(const std::string& text) const;
  bool has(uint32_t cp) const { return glyphs_.count(cp) != 0; }

 private:
  struct Glyph {
    int width = 8;
    std::vector<uint16_t> rows;  // 16 rows, the leftmost pixel in the top bit of `width`
  };
  std::map<uint32_t, Glyph> glyphs_;
};

class VisionDataSource {
 public:
  // fashion_dir: the idx files (loaded on first use of the fashion task); unifont_path: unifont.hex.
  VisionDataSource(std::string fashion_dir, std::string unifont_path, uint64_t seed);
  VisionExample example(VisionTask task, bool test, int64_t index);
  int64_t size(VisionTask task, bool test);  // fashion: 60000 / 10000; rendered: unbounded (-1)

 private:
  void load_fashion();
  std::string fashion_dir_, unifont_path_;
  uint64_t seed_;
  bool fashion_loaded_ = false;
  IdxImages fashion_train_, fashion_test_;
  std::vector<uint8_t> fashion_train_labels_, fashion_test_labels_;
  bool font_loaded_ = false;
  Unifont font_;
};

// The rendered arithmetic example for operands a, b: the image of "a+b" in unifont, the
// question "sum?" and the answer a + b (the training stream draws a, b in 10..99; RL on
// images, posttrain/image_task.h, draws its own and checks this answer).
VisionExample arithmetic_example(const Unifont& font, int a, int b);

// Renders one scene (exposed for tests): shapes at fixed cells of a 2 x 2 grid of a 32 x 32
// white canvas.
VisionExample render_scene(uint64_t seed, int64_t index);

}  // namespace k3
