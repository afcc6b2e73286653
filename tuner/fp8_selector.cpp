#include "tuner/fp8_selector.h"

#include <algorithm>

#include "formats/fqn_pattern.h"
#include "formats/numbers.h"
#include "layout/pi05.h"
#include "tuner/cost_model.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;
// The first pattern of `patterns` covering one of `members`, or "".
std::string covering(const std::vector<std::string>& patterns, const std::vector<std::string>& members) {
  for (const std::string& p : patterns)
    for (const std::string& m : members)
      if (formats::pattern_covers(p, m)) return p;
  return "";
}

}  // namespace

const std::vector<std::string>& default_fp8_exclusions() {
  // The precision-sensitive set: measured thresholds decide the rest. Thin GEMMs here are also the ones FP8 cannot
  // speed up: M = batch for the time MLP and adaRMS, N = 32 for the action head. SigLIP is not in it: its FP8
  // q/k/v and fc1 pass the 200-step loss gate against bf16 and speed the step up (bench/RESULTS.md).
  static const std::vector<std::string> patterns = {
      layout::kProjector,
      layout::kActionInProj,
      layout::kActionOutProj,
      layout::kTimeMlpIn,
      layout::kTimeMlpOut,
      layout::kExpertLayerPrefix + "*.input_layernorm.dense",  // adaRMS modulation (scale, shift, gate)
      layout::kExpertLayerPrefix + "*.post_attention_layernorm.dense",
      layout::kExpertNorm + ".dense",
  };
  return patterns;
}

Fp8Selection solve_fp8_set(const std::vector<formats::GemmEntry>& gemms, const Fp8Options& o) {
  Fp8Selection out;
  out.effective_margin = std::max(o.margin, 1.0 + 2.0 * o.noise_rel);
  const std::string margin_text = out.effective_margin > o.margin
                                      ? fixed(out.effective_margin, 3) + " (raised from " + fixed(o.margin, 3) +
                                            ": twice the step noise " + fixed(100 * o.noise_rel, 1) + "%)"
                                      : fixed(out.effective_margin, 3);
  for (size_t g = 0; g < gemms.size(); ++g) {
    const formats::GemmEntry& e = gemms[g];
    Fp8Verdict v;
    v.gemm = static_cast<int>(g);
    v.name = e.name;
    v.members = e.members;
    const bool recomputed = o.recomputed && o.recomputed(e.members[0]);
    v.bf16_ms = gemm_ms(e, false, recomputed, o.batch_scale);
    const std::string user_excluded = covering(o.exclude, e.members);
    const std::string included = covering(o.include, e.members);
    const std::string default_excluded = covering(default_fp8_exclusions(), e.members);
    if (!e.fp8) {
      v.reason = "not measured in FP8 (" +
                 std::string(e.k % 16 || e.n % 16 ? "a dimension not divisible by 16" : "no FP8 time in the profile") +
                 "): stays bf16";
    } else if (!e.quant_ms) {
      v.reason = "no quantization time in the profile: the FP8 cost is unknown, stays bf16";
    } else {
      v.fp8_ms = gemm_ms(e, true, recomputed, o.batch_scale);
      v.ratio = v.fp8_ms > 0 ? v.bf16_ms / v.fp8_ms : 0;
    }
    const std::string numbers = v.fp8_ms > 0 ? "bf16 " + fixed(v.bf16_ms, 3) + " ms vs FP8 " + fixed(v.fp8_ms, 3) +
                                                   " ms incl. quantization (" + fixed(v.ratio, 2) + "x" +
                                                   (recomputed ? ", forward counted twice: recomputed" : "") + ")"
                                             : "";
    if (v.reason.empty()) {
      if (!user_excluded.empty()) {
        v.reason = "excluded by --fp8-exclude " + user_excluded + "; " + numbers;
      } else if (!default_excluded.empty() && included.empty()) {
        v.reason = "precision-sensitive by default (" + default_excluded + "; --fp8-include lifts it); " + numbers;
      } else if (v.ratio > out.effective_margin) {
        v.selected = true;
        v.saved_ms = v.bf16_ms - v.fp8_ms;
        v.reason = numbers + " > margin " + margin_text;
      } else {
        v.reason = numbers + " <= margin " + margin_text;
      }
    }
    if (v.selected) out.saved_ms += v.saved_ms;
    out.verdicts.push_back(std::move(v));
  }
  return out;
}

}  // namespace vlatune::tuner
