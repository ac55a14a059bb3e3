// The RL objectives on per-token log-probabilities (no model here: the model glue is
// posttrain/token_grad.h). Each returns the loss and writes dL/dlogp for every token, so the
// same numbers drive the backward and the hand-computed tests.
//
// Group-relative advantages (GRPO, DeepSeekMath; Dr. GRPO: no std normalisation by default):
//   A_i = r_i - mean_group(r)   [/ std_group(r) with std_norm]
// A group whose rewards all agree (zero variance) carries no signal and is dropped (DAPO).
//
// DAPO (arXiv 2503.14476), the default: token-level loss over every loss token of the batch,
//   L = -(1/N) sum_i sum_t min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)
//       + beta (1/N) sum_t kl_t
//   rho_t = exp(logp_t - logp_behaviour_t): the ratio against the policy that produced the
//   token (truncated importance sampling for tokens of older policies: rho is capped at
//   is_cap, beyond which the token has no gradient); kl_t the k3 estimator
//   exp(ref - logp) - (ref - logp) - 1 (Schulman) against a reference policy.
//   dL/dlogp_t = -(1/N) A rho_t where the unclipped branch is the minimum, else 0;
//              + (beta/N) (1 - exp(ref_t - logp_t)).
// Mirror descent (Kimi k1.5, arXiv 2501.12599 eq. 3), the option:
//   L = (1/n) sum_i (r_i - mean_group(r) - tau sum_t (logp_t - logp_behaviour_t))^2
//   dL/dlogp_t = -(2 tau / n) (r_i - mean r - tau Delta_i), Delta_i the sequence log-ratio.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

enum class RLLossKind { dapo, mirror };

struct PolicyLossOptions {
  RLLossKind kind = RLLossKind::dapo;
  double clip_low = 0.2, clip_high = 0.28;  // DAPO's asymmetric clip
  double is_cap = 5.0;                      // truncated IS: rho beyond this gets no gradient
  double kl_coef = 0.0;                     // beta; > 0 needs reference logprobs
  double tau = 0.5;                         // mirror descent's regulariser
  bool std_norm = false;                    // GRPO's division by the group std (off: Dr. GRPO)
};

// One sampled completion as the loss sees it: its group, reward and per-token arrays over the
// completion's tokens (mask 0: not trained on, e.g. tool results).
struct LossSample {
  int64_t group = 0;
  double reward = 0;
  std::vector<double> logp;        // under the policy being trained
  std::vector<double> behav_logp;  // recorded when sampled
  std::vector<double> ref_logp;    // reference policy (kl_coef > 0 only)
  std::vector<uint8_t> mask;
};

struct PolicyLossResult {
  double loss = 0;
  int64_t tokens = 0;           // loss tokens of the kept samples (N)
  int64_t kept = 0, dropped = 0;  // samples in groups with / without reward variance
  int64_t clipped = 0;          // loss tokens whose gradient the clip (or IS cap) removed
  double mean_ratio = 0, kl = 0;  // mean rho and mean kl_t over the loss tokens
  std::vector<double> advantage;  // per sample (0 for dropped)
  std::vector<uint8_t> keep;      // per sample
};

// Advantages and kept flags per sample (see above); groups are identified by `group`.
void group_advantages(const std::vector<LossSample>& s, bool std_norm, std::vector<double>& adv,
                      std::vector<uint8_t>& keep);

// One kept sample's share of the loss given its advantage A, the batch's loss tokens N and
// kept samples n (dlogp resized to s.logp); adds its clip count and ratio / kl sums to r.
double sample_policy_loss(const LossSample& s, double A, int64_t N, int64_t n, const PolicyLossOptions& o,
                          std::vector<double>& dlogp, PolicyLossResult& r, double& ratio_sum, double& kl_sum);

// The loss of the batch; dlogp[i] (resized to s[i].logp) receives dL/dlogp for every token.
PolicyLossResult policy_loss(const std::vector<LossSample>& s, const PolicyLossOptions& o,
                             std::vector<std::vector<double>>& dlogp);

RLLossKind parse_rl_loss(const std::string& name, const std::string& file);  // "dapo" | "mirror"
const char* rl_loss_name(RLLossKind k);

}  // namespace k3
