#include "model/weight_average.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "model/checkpoint.h"

namespace k3 {
namespace {

// The architecture as config.json states it, without what only says how the file stores it.
nlohmann::json architecture_json(K3Config c) {
  c.quantization = {};
  return nlohmann::json::parse(config_to_hf_json(c));
}

// "text_config.hidden_size: 128 here, 256 in <first>" for the first field that differs.
std::string first_difference(const nlohmann::json& here, const nlohmann::json& first, const std::string& first_path) {
  const nlohmann::json patch = nlohmann::json::diff(first, here);
  const std::string ptr = patch.empty() ? std::string() : patch[0].value("path", std::string());
  std::string field = ptr.empty() ? std::string("(root)") : ptr.substr(1);
  for (char& ch : field)
    if (ch == '/') ch = '.';
  const nlohmann::json::json_pointer jp(ptr);
  const std::string a = here.contains(jp) ? here.at(jp).dump() : "absent";
  const std::string b = first.contains(jp) ? first.at(jp).dump() : "absent";
  return field + ": " + a + " here, " + b + " in " + first_path + " (averaged models must have one architecture)";
}

}  // namespace

AveragedModel average_model_dirs(const std::vector<std::string>& dirs, const std::vector<double>& coefficients) {
  if (dirs.size() < 2) fail("averaging needs at least two model directories, got " + std::to_string(dirs.size()));
  if (coefficients.size() != dirs.size())
    fail("--weights: " + std::to_string(coefficients.size()) + " weight(s) for " + std::to_string(dirs.size()) +
         " models");
  double sum = 0;
  for (size_t i = 0; i < coefficients.size(); ++i) {
    if (!std::isfinite(coefficients[i]) || coefficients[i] < 0)
      fail("--weights: entry " + std::to_string(i + 1) + " is " + std::to_string(coefficients[i]) +
           ": weights must be finite and >= 0");
    sum += coefficients[i];
  }
  if (!(sum > 0)) fail("--weights: the weights sum to 0");

  AveragedModel out;
  for (double c : coefficients) out.coefficients.push_back(c / sum);
  std::vector<double> acc;
  nlohmann::json first_arch;
  LoadOptions lo;
  lo.dequantize_experts = true;  // MXFP4 experts widened: every tensor lies in the f32 buffer
  lo.log = [](const std::string&) {};
  for (size_t m = 0; m < dirs.size(); ++m) {
    const ModelDir md = open_model_dir(dirs[m]);
    if (md.config.vision.present)
      fail_input(md.config_path, "vision_config",
                 "the model has a vision tower, which averaging does not cover: average text models only");
    const nlohmann::json arch = architecture_json(md.config);
    if (m == 0) {
      first_arch = arch;
    } else if (arch != first_arch) {
      fail_input(md.config_path, "", first_difference(arch, first_arch, dirs[0] + "/config.json"));
    }
    const CheckpointReader ck = CheckpointReader::open(md.dir);
    if (ck.size() == 0) fail_input(md.dir, "", "no safetensors files in the model directory");
    WeightStore w = load_weights(ck, md.config, lo);
    const ParamLayout& layout = w.layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const float* p = w.param(i);
      const int64_t n = layout.spec(i).numel();
      for (int64_t k = 0; k < n; ++k)
        if (!std::isfinite(p[k]))
          fail_input(md.dir, layout.spec(i).name,
                     "element " + std::to_string(k) + " is not finite: the average would be too");
    }
    const float* data = w.data();
    if (m == 0) acc.assign(size_t(w.size()), 0.0);
    const double c = out.coefficients[m];
    for (size_t k = 0; k < acc.size(); ++k) acc[k] += c * double(data[k]);
    if (m + 1 == dirs.size()) {
      float* dst = w.data();
      for (size_t k = 0; k < acc.size(); ++k) dst[k] = float(acc[k]);
      out.weights = std::move(w);
    }
  }
  return out;
}

}  // namespace k3
