// The vision encoder against the independent PyTorch implementation (tools/k3_torch/vision.py,
// `k3_torch_check.py vision`): a random encoder (2 blocks, width 16, 2 heads of 8, MLP 32,
// patch 2, a 4 x 4 position table, 2 x 2 merge, text width 12) saved as a model directory,
// three images packed in one batch (grid 4 x 4 = the table's size, 4 x 6 and 2 x 2: resampled),
// run by both: the output (double path, max |diff| / max |out| < 1e-10; float path < 1e-4)
// and the gradient of sum(dout * out) for every vision parameter (relative RMS < 1e-9).
// Needs /usr/bin/python3 with torch (scripts/setup.sh installs python3-torch); without it
// the test fails and says why (the project counts a skip as a failure).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/config.h"
#include "io/safetensors.h"
#include "common/grad_check.h"
#include "model/vision_encoder.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return *status = -1, out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

}  // namespace

TEST(VisionTorch, OutputAndGradientsMatchPyTorch) {
  int st = 0;
  const std::string probe = run("/usr/bin/python3 -c 'import torch'", &st);
  ASSERT_EQ(st, 0) << "/usr/bin/python3 cannot import torch (apt install python3-torch): " << probe;

  const fs::path dir = fs::temp_directory_path() / ("k3_vision_torch_" + std::to_string(getpid()));
  fs::create_directories(dir);
  // A config with the released vision_config fields (sizes small).
  std::string cfg_text;
  {
    std::ifstream f(std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny/config.json");
    cfg_text.assign(std::istreambuf_iterator<char>(f), {});
  }
  K3Config cfg = parse_config(cfg_text, "k3-release-tiny/config.json");
  cfg.hidden_size = 12;
  cfg.vision.num_hidden_layers = 2, cfg.vision.hidden_size = 16, cfg.vision.num_attention_heads = 2;
  cfg.vision.qkv_hidden_size = 16, cfg.vision.intermediate_size = 32, cfg.vision.patch_size = 2;
  cfg.vision.init_pos_emb_height = 4, cfg.vision.init_pos_emb_width = 4, cfg.vision.mm_hidden_size = 16;
  cfg.vision.text_hidden_size = 12;
  {
    std::ofstream f(dir / "config.json");
    f << config_to_hf_json(cfg);
  }
  const VisionDims d = resolve_vision_dims(cfg, "config.json");
  const VisionLayout layout(d);
  std::vector<float> Wf(size_t(layout.total));
  init_vision_params(Wf.data(), layout, 3);
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (size_t i = 0; i < layout.specs.size(); ++i)
    for (int64_t k = 0; k < layout.specs[i].numel(); ++k) {
      float& w = Wf[size_t(layout.offsets[i] + k)];
      w = layout.specs[i].shape.size() == 1 ? 1.0f + nd(rng) : (layout.specs[i].name.find("pos_emb") != std::string::npos ? w : nd(rng));
    }
  SafetensorsWriter wr;
  std::vector<Tensor> keep;
  for (size_t i = 0; i < layout.specs.size(); ++i)
    wr.add(layout.specs[i].name, Tensor::from_f32(layout.specs[i].shape, Wf.data() + layout.offsets[i]));
  wr.write((dir / "model.safetensors").string());

  // Images: 8 x 8 (grid 4 x 4), 5 x 10 (grid 4 x 6), 3 x 2 (grid 2 x 2).
  VisionBatch<double> bd;
  VisionBatch<float> bf;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {5, 10}, {3, 2}}) {
    std::vector<float> img(size_t(3 * h * w));
    for (float& v : img) v = u(rng);
    append_image(bd, d, img.data(), h, w);
    append_image(bf, d, img.data(), h, w);
  }
  const int64_t N = bd.token_count(d), L = bd.patch_count();
  ASSERT_EQ(N, 4 + 6 + 1);
  std::vector<float> dout_f(size_t(N * d.text_width));
  for (float& v : dout_f) v = nd(rng);
  std::vector<int32_t> grids;
  for (const ImageGrid& g : bd.grids) grids.push_back(int32_t(g.h)), grids.push_back(int32_t(g.w));
  {
    SafetensorsWriter in;
    in.add("patches", Tensor::from_f32({L, d.patch_values()}, bf.patches.data()));
    Tensor gt = Tensor::empty(DType::I32, {int64_t(bd.grids.size()), 2});
    std::copy(grids.begin(), grids.end(), gt.data<int32_t>());
    in.add("grids", gt);
    in.add("dout", Tensor::from_f32({N, d.text_width}, dout_f.data()));
    in.write((dir / "in.safetensors").string());
  }
  const std::string cmd = std::string("/usr/bin/python3 -B ") + K3_SOURCE_DIR + "/tools/k3_torch_check.py vision " +
                          dir.string() + " --inputs " + (dir / "in.safetensors").string() + " --out " +
                          (dir / "out.safetensors").string();
  const std::string log = run(cmd, &st);
  ASSERT_EQ(st, 0) << cmd << "\n" << log;
  const CheckpointReader ref = CheckpointReader::open((dir / "out.safetensors").string());

  const std::vector<double> Wd(Wf.begin(), Wf.end()), dout(dout_f.begin(), dout_f.end());
  VisionActs<double> acts;
  std::vector<double> out(size_t(N * d.text_width)), g(Wd.size(), 0.0);
  vision_forward<double>(out.data(), &acts, Wd.data(), layout, d, bd);
  vision_backward<double>(g.data(), dout.data(), acts, Wd.data(), layout, d, bd);
  const Tensor ro = ref.get("out");
  ASSERT_EQ(ro.shape(), (Shape{N, d.text_width}));
  const double* r = ro.data<double>();
  double err = 0, scale = 0;
  for (int64_t k = 0; k < N * d.text_width; ++k)
    err = std::max(err, std::fabs(out[size_t(k)] - r[k])), scale = std::max(scale, std::fabs(r[k]));
  EXPECT_LT(err, 1e-10 * scale) << "double output vs torch";
  std::vector<float> outf(out.size());
  vision_forward<float>(outf.data(), nullptr, Wf.data(), layout, d, bf);
  double errf = 0;
  for (int64_t k = 0; k < N * d.text_width; ++k) errf = std::max(errf, std::fabs(double(outf[size_t(k)]) - r[k]));
  EXPECT_LT(errf, 1e-4 * scale) << "float output vs torch";
  for (size_t i = 0; i < layout.specs.size(); ++i) {
    const Tensor t = ref.get(layout.specs[i].name);
    ASSERT_EQ(t.shape(), layout.specs[i].shape) << layout.specs[i].name;
    const double e = test::rel_rms_mixed(g.data() + layout.offsets[i], t.data<double>(), layout.specs[i].numel());
    EXPECT_LT(e, 1e-9) << layout.specs[i].name;
  }
  fs::remove_all(dir);
}
