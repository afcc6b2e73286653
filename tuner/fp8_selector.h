// The FP8 Linear set (anchors §4.6): per GEMM of the profile (a Linear, or a merged GEMM covering its members),
// FP8 only where the measured bf16 time divided by the FP8 time -- the three FP8 GEMMs plus the quantization as
// the trainer runs it, the forward counted twice when the module is recomputed -- exceeds a margin, and the
// margin exceeds the measured noise, outside the precision-sensitive default exclusions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "formats/profile.h"

namespace vlatune::tuner {

struct Fp8Options {
  double margin = 1.05;                                // --fp8-margin: required bf16/FP8 time ratio
  double noise_rel = 0;                                // relative step-time noise of the profile (MAD / median)
  std::vector<std::string> include;                    // --fp8-include: lifts default exclusions (still measured)
  std::vector<std::string> exclude;                    // --fp8-exclude: always bf16 (wins over include)
  double batch_scale = 1;                              // planned micro-batch / profiled batch (GEMM times scale with M)
  std::function<bool(const std::string&)> recomputed;  // is this Linear FQN inside a recomputed module?
};

struct Fp8Verdict {
  int gemm = -1;  // index into profile.gemms
  std::string name;
  std::vector<std::string> members;
  bool selected = false;
  std::string reason;   // why, in words
  double bf16_ms = 0;   // per step, as planned (recompute counted)
  double fp8_ms = 0;    // GEMMs + quantization, per step; 0 when not measured
  double ratio = 0;     // bf16_ms / fp8_ms; 0 when not measured
  double saved_ms = 0;  // bf16_ms - fp8_ms when selected
};

struct Fp8Selection {
  double effective_margin = 1.05;    // max(margin, 1 + 2 x noise)
  std::vector<Fp8Verdict> verdicts;  // one per GEMM, profile order
  double saved_ms = 0;
};

// Linears kept in bf16 unless --fp8-include names them: the precision-sensitive set (projector, action and time
// projections, adaRMS dense layers). Patterns exclude the modules they match and
// everything inside them.
const std::vector<std::string>& default_fp8_exclusions();

Fp8Selection solve_fp8_set(const std::vector<formats::GemmEntry>& gemms, const Fp8Options& options);

}  // namespace vlatune::tuner
