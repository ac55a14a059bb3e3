// Checkpoint averaging (model/weight_average.h): every parameter of the result is the weighted
// mean of the inputs' (checked against a float64 recomputation from the saved files, MXFP4
// inputs widened as the loader widens them), the weights are normalised, and every refusal
// names the directory and the field: one model, a weight count that is not the model count, a
// negative weight, a zero sum, another architecture (the field named), a vision tower, a
// non-finite weight.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/random_model.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/weight_average.h"

using namespace k3;
using k3::test::has;

namespace {

std::string avg_save_init(const k3::test::TempDir& t, const std::string& name, const K3Config& c, uint64_t seed,
                      ExpertStorage experts = ExpertStorage::Plain) {
  InitOptions io;
  io.seed = seed;
  const WeightStore w = init_weights(c, io);
  SaveOptions so;
  so.experts = experts;
  save_checkpoint(t.sub(name), w, so);
  return t.sub(name);
}

WeightStore avg_load_plain(const std::string& dir) {
  LoadOptions lo;
  lo.dequantize_experts = true;
  const ModelDir md = open_model_dir(dir);
  return load_weights(CheckpointReader::open(md.dir), md.config, lo);
}

std::string avg_error_of(const std::vector<std::string>& dirs, const std::vector<double>& w) {
  try {
    average_model_dirs(dirs, w);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(WeightAverage, EveryParameterIsTheWeightedMeanInFloat64) {
  k3::test::TempDir t("k3_avg");
  const K3Config c = k3::test::four_layer_config();
  const std::string a = avg_save_init(t, "a", c, 1), b = avg_save_init(t, "b", c, 2);
  const std::string m = avg_save_init(t, "m", c, 3, ExpertStorage::Mxfp4);  // widened as the loader widens it
  const AveragedModel avg = average_model_dirs({a, b, m}, {1.0, 3.0, 4.0});
  ASSERT_EQ(avg.coefficients.size(), 3u);
  EXPECT_DOUBLE_EQ(avg.coefficients[0], 0.125);
  EXPECT_DOUBLE_EQ(avg.coefficients[1], 0.375);
  EXPECT_DOUBLE_EQ(avg.coefficients[2], 0.5);
  const WeightStore wa = avg_load_plain(a), wb = avg_load_plain(b), wm = avg_load_plain(m);
  const ParamLayout& layout = avg.weights.layout();
  ASSERT_EQ(layout.size(), wa.layout().size());
  int64_t checked = 0, differing_inputs = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const int64_t n = layout.spec(i).numel();
    const float *pa = wa.param(i), *pb = wb.param(i), *pm = wm.param(i), *po = avg.weights.param(i);
    for (int64_t k = 0; k < n; ++k) {
      const float want = float(0.125 * double(pa[k]) + 0.375 * double(pb[k]) + 0.5 * double(pm[k]));
      ASSERT_EQ(po[k], want) << layout.spec(i).name << " [" << k << "]";
      differing_inputs += pa[k] != pb[k];
      ++checked;
    }
  }
  EXPECT_EQ(checked, [&] {
    int64_t s = 0;
    for (size_t i = 0; i < layout.size(); ++i) s += layout.spec(i).numel();
    return s;
  }());
  EXPECT_GT(differing_inputs, checked / 2);  // the inputs really differ: the mean is not a copy
}

TEST(WeightAverage, EqualWeightsOfOneModelTwiceGiveTheModel) {
  k3::test::TempDir t("k3_avg");
  const K3Config c = k3::test::four_layer_config();
  const std::string a = avg_save_init(t, "a", c, 5);
  const AveragedModel avg = average_model_dirs({a, a}, {1.0, 1.0});
  const WeightStore wa = avg_load_plain(a);
  for (size_t i = 0; i < wa.layout().size(); ++i)
    for (int64_t k = 0; k < wa.layout().spec(i).numel(); ++k) ASSERT_EQ(avg.weights.param(i)[k], wa.param(i)[k]);
}

TEST(WeightAverage, RefusalsNameTheOptionDirectoryAndField) {
  k3::test::TempDir t("k3_avg");
  const K3Config c = k3::test::four_layer_config();
  const std::string a = avg_save_init(t, "a", c, 1), b = avg_save_init(t, "b", c, 2);
  EXPECT_TRUE(has(avg_error_of({a}, {1.0}), "at least two model directories")) << avg_error_of({a}, {1.0});
  EXPECT_TRUE(has(avg_error_of({a, b}, {1.0}), "--weights: 1 weight(s) for 2 models"));
  EXPECT_TRUE(has(avg_error_of({a, b}, {1.0, -0.5}), "--weights: entry 2"));
  EXPECT_TRUE(has(avg_error_of({a, b}, {1.0, std::numeric_limits<double>::quiet_NaN()}), "--weights: entry 2"));
  EXPECT_TRUE(has(avg_error_of({a, b}, {0.0, 0.0}), "sum to 0"));

  K3Config wide = c;
  wide.intermediate_size = c.intermediate_size * 2;
  const std::string w = avg_save_init(t, "wide", wide, 1);
  const std::string e = avg_error_of({a, w}, {1.0, 1.0});
  EXPECT_TRUE(has(e, w + "/config.json") && has(e, "text_config.intermediate_size") && has(e, a + "/config.json"))
      << e;

  // A differing storage (MXFP4 experts: quantization_config) is the same architecture.
  const std::string m = avg_save_init(t, "m", c, 2, ExpertStorage::Mxfp4);
  EXPECT_EQ(avg_error_of({a, m}, {1.0, 1.0}), "");

  // A non-finite weight in an input: named with its tensor.
  {
    WeightStore bad = avg_load_plain(b);
    const size_t i = bad.layout().index("language_model.model.norm.weight");
    bad.param(i)[3] = std::numeric_limits<float>::infinity();
    save_checkpoint(t.sub("bad"), bad);
    const std::string eb = avg_error_of({a, t.sub("bad")}, {1.0, 1.0});
    EXPECT_TRUE(has(eb, t.sub("bad")) && has(eb, "language_model.model.norm.weight") && has(eb, "not finite")) << eb;
  }
  // A vision tower: refused, naming vision_config.
  {
    const std::string v = t.sub("vision");
    avg_save_init(t, "vision", c, 1);
    K3Config vc = load_config(v + "/config.json");
    vc.vision.present = true;
    vc.vision.text_hidden_size = vc.hidden_size;
    write_text_file_atomic(v + "/config.json", config_to_hf_json(vc));
    const std::string ev = avg_error_of({a, v}, {1.0, 1.0});
    EXPECT_TRUE(has(ev, "vision_config") && has(ev, v)) << ev;
  }
}
