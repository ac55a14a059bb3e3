// Checkpoint averaging: the weighted mean of several checkpoints of one model, w = sum_i c_i w_i
// with c_i >= 0 normalised to sum 1 (stochastic / latest weight averaging of the snapshots one
// run passes through late in training: Izmailov et al. 2018, arXiv:1803.05407; Kaddour 2022,
// arXiv:2209.14981). The models must be the same architecture (config.json equal apart from how
// the file stores the experts: quantization_config); each is read with its experts widened to
// f32 and added into a float64 accumulator in the order given, so the result does not depend
// on the machine and memory holds one model plus the accumulator. Text models only: a
// checkpoint with a vision tower is refused (its tower would not be averaged).
#pragma once
#include <string>
#include <vector>

#include "model/weights.h"

namespace k3 {

struct AveragedModel {
  WeightStore weights;               // f32, plain experts
  std::vector<double> coefficients;  // the normalised c_i, in input order
};

// Every refusal is a k3::Error naming the directory (or the option) and the field or tensor:
// fewer than two models, a coefficient count that is not the model count, a negative or
// non-finite coefficient or a zero sum, a config that differs from the first model's (the
// first differing field is named), a vision tower, a non-finite weight in an input.
AveragedModel average_model_dirs(const std::vector<std::string>& dirs, const std::vector<double>& coefficients);

}  // namespace k3
