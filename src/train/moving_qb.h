// Moving Quantile Balancing: sequence-level, causal balancing of one sequence's routing
// (docs/model.md section 6: "EMA of per-position score histograms along the sequence, lambda
// about 0.3"; Su, kexue.fm 11760). k3cpp's reading of that one line, stated here because the
// reference gives no more:
//
//  - The sequence is cut into chunks of C positions (C = 64, the KDA chunk). Chunk 0 is routed
//    with the global bias b (the QB bias the model carries). After each chunk n, every expert's
//    histogram of negated margins -r_tj = alpha_t - s_tj (alpha_t: the (k+1)-th largest of
//    s_t + c, c the bias the chunk was routed with) is folded into an exponential moving
//    average over chunks, H_n = (1 - lambda) H_(n-1) + lambda h_n (H_0 = h_0), and the bias of
//    chunk n + 1 is QB's update read off H_n: c_j = quantile_(k/E)(H_n[j]), then c -= mean(c).
//    A chunk is never routed with a bias derived from itself, so routing stays causal (usable
//    in decoding, with H as per-sequence state).
//  - Histograms as in K3's QB: `bins` uniform bins over [min(b) - 1, max(b) + 1] (values
//    outside fall into the edge bins), quantile by linear interpolation within a bin.
//  - lambda weighs chunks, not tokens: per token, lambda = 0.3 would leave ~3 samples for a
//    quantile at level k/E (1.8% at 896/16), which is noise; per chunk of 64 it leaves ~200.
//
// moving_qb_route is the histogram path; moving_qb_route_ref keeps every sample with its EMA
// weight and takes exact weighted quantiles (the plain reference; tests compare the two).
// Only the selection changes: mixture weights stay the unbiased scores of the chosen experts.
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct MovingQBOptions {
  double lambda = 0.3;  // EMA weight of the newest chunk, in (0, 1)
  int64_t chunk = 64;   // positions per chunk
  int64_t bins = 1000;  // histogram bins (histogram path only)
};

// Reusable buffers (grow only).
struct MovingQBScratch {
  std::vector<double> hist;   // [E, bins] EMA-weighted counts (scaled, see the .cpp)
  std::vector<float> bias;    // [E] the bias in force
  std::vector<float> sb;      // [E] s + bias of one token
  std::vector<double> next;   // [E]
  std::vector<std::vector<std::pair<float, double>>> samples;  // reference: per expert (value, weight)
};

// idx [T, k] (best biased score first, as the router): the moving-QB selection of one
// sequence with unbiased scores s [T, E] and the global bias b [E].
void moving_qb_route(int32_t* idx, const float* s, const float* b, int64_t T, int64_t E, int64_t k,
                     const MovingQBOptions& opt, MovingQBScratch& ws);
void moving_qb_route_ref(int32_t* idx, const float* s, const float* b, int64_t T, int64_t E, int64_t k,
                         const MovingQBOptions& opt, MovingQBScratch& ws);

}  // namespace k3
