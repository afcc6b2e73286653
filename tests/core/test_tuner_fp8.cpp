// FP8 selector: measured ratio over the margin, casts and recomputation counted, exclusions with reasons.
#include <catch2/catch.hpp>

#include "formats/fqn_pattern.h"
#include "tuner/fp8_selector.h"

using namespace vlatune;
using namespace vlatune::tuner;
using vlatune::formats::compact_patterns;
using vlatune::formats::pattern_covers;

namespace {

formats::GemmEntry gemm(const std::string& name, double bf16, double fp8, std::optional<double> quant) {
  formats::GemmEntry g;
  g.name = name;
  g.members = {name};
  g.m = 22784;
  g.k = 2048;
  g.n = 2048;
  g.bf16 = {bf16, bf16, bf16};
  if (fp8 > 0) g.fp8 = formats::GemmTimes{fp8, fp8, fp8};
  g.quant_ms = quant;
  return g;
}

const std::string kMlp = "paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.down_proj";

}  // namespace

TEST_CASE("FP8 is chosen only where bf16 / (FP8 + casts) beats the margin", "[tuner][fp8]") {
  Fp8Options o;
  const std::vector<formats::GemmEntry> gemms = {
      gemm(kMlp, 1.0, 0.6, 0.3),                 // 3.0 / 2.1 = 1.43: yes
      gemm(kMlp + "x", 1.0, 0.9, 0.25),          // 3.0 / 2.95: no
      gemm(kMlp + "y", 1.0, 0.0, std::nullopt),  // not measured
      gemm(kMlp + "z", 1.0, 0.5, std::nullopt),  // no cast time
      gemm("action_out_proj", 1.0, 0.1, 0.01),   // precision-sensitive
  };
  const Fp8Selection s = solve_fp8_set(gemms, o);
  REQUIRE(s.verdicts.size() == 5);
  CHECK(s.verdicts[0].selected);
  CHECK(s.verdicts[0].ratio == Approx(3.0 / 2.1));
  CHECK(s.verdicts[0].saved_ms == Approx(0.9));
  CHECK_FALSE(s.verdicts[1].selected);
  CHECK(s.verdicts[1].reason.find("<= margin") != std::string::npos);
  CHECK(s.verdicts[2].reason.find("not measured") != std::string::npos);
  CHECK(s.verdicts[3].reason.find("quantization") != std::string::npos);
  CHECK(s.verdicts[4].reason.find("precision-sensitive") != std::string::npos);
  CHECK(s.saved_ms == Approx(0.9));

  SECTION("a recomputed GEMM runs its forward (and its casts) twice") {
    Fp8Options r = o;
    r.recomputed = [](const std::string&) { return true; };
    const Fp8Verdict v = solve_fp8_set({gemms[0]}, r).verdicts[0];
    CHECK(v.bf16_ms == Approx(4.0));
    CHECK(v.fp8_ms == Approx(2.1 + 0.6 + 0.1));
  }
  SECTION("noise above the margin raises it") {
    Fp8Options noisy = o;
    noisy.noise_rel = 0.3;  // margin -> 1.6 > 1.43
    const Fp8Selection n = solve_fp8_set(gemms, noisy);
    CHECK(n.effective_margin == Approx(1.6));
    CHECK_FALSE(n.verdicts[0].selected);
  }
  SECTION("--fp8-include lifts a default exclusion, --fp8-exclude wins over it") {
    Fp8Options inc = o;
    inc.include = {"action_out_proj"};
    CHECK(solve_fp8_set(gemms, inc).verdicts[4].selected);
    inc.exclude = {"action_out_proj"};
    CHECK_FALSE(solve_fp8_set(gemms, inc).verdicts[4].selected);
  }
}

TEST_CASE("The vision tower's Linears are chosen by their measured times, with or without --fp8-include",
          "[tuner][fp8]") {
  const std::string vit = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.";
  formats::GemmEntry qkv = gemm(vit + "self_attn.q_proj+k_proj+v_proj", 1.0, 0.3, 0.05);
  qkv.members = {vit + "self_attn.q_proj", vit + "self_attn.k_proj", vit + "self_attn.v_proj"};
  const std::vector<formats::GemmEntry> gemms = {qkv, gemm(vit + "mlp.fc2", 1.0, 0.3, 0.05),
                                                 gemm(vit + "mlp.fc1", 1.0, 0.3, 0.05),
                                                 gemm(vit + "self_attn.out_proj", 1.0, 0.9, 0.2)};
  Fp8Options o;
  o.include = {"paligemma_with_expert.paligemma.model.vision_tower"};
  const Fp8Selection s = solve_fp8_set(gemms, o);
  REQUIRE(s.verdicts.size() == 4);
  CHECK(s.verdicts[0].selected);        // the merged q/k/v (with biases)
  CHECK(s.verdicts[1].selected);        // fc2 (its FP8 form casts the GELU kernel's output)
  CHECK(s.verdicts[2].selected);        // fc1
  CHECK_FALSE(s.verdicts[3].selected);  // out_proj: its cast costs more than the GEMM saves
  CHECK(s.verdicts[3].reason.find("<= margin") != std::string::npos);
  o.include.clear();  // the vision tower is not excluded by default: the same verdicts without --fp8-include
  const Fp8Selection d = solve_fp8_set(gemms, o);
  for (size_t i = 0; i < gemms.size(); ++i) CHECK(d.verdicts[i].selected == s.verdicts[i].selected);
}

TEST_CASE("FP8 exclusion patterns cover modules and everything inside them", "[tuner][fp8]") {
  CHECK(pattern_covers("paligemma_with_expert.paligemma.model.vision_tower",
                       "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.3.mlp.fc1"));
  CHECK(pattern_covers("paligemma_with_expert.gemma_expert.model.layers.*.input_layernorm.dense",
                       "paligemma_with_expert.gemma_expert.model.layers.7.input_layernorm.dense"));
  CHECK_FALSE(pattern_covers("action_in_proj", "action_out_proj"));
  CHECK_FALSE(pattern_covers("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.3",
                             "paligemma_with_expert.paligemma.model.vision_tower"));
}

TEST_CASE("compact patterns select exactly the chosen modules", "[tuner][patterns]") {
  const std::string l = "paligemma_with_expert.paligemma.model.language_model.layers.";
  std::vector<std::string> universe;
  for (int i = 0; i < 4; ++i)
    for (const char* sub : {"", ".mlp", ".self_attn"}) universe.push_back(l + std::to_string(i) + sub);
  CHECK(compact_patterns({l + "0.mlp", l + "1.mlp", l + "2.mlp", l + "3.mlp"}, universe) ==
        std::vector<std::string>{l + "*.mlp"});
  CHECK(compact_patterns({l + "0.mlp", l + "2.mlp"}, universe) == std::vector<std::string>{l + "0.mlp", l + "2.mlp"});
  CHECK(compact_patterns({l + "0", l + "1", l + "2", l + "3", l + "0.mlp"}, universe).front() == l + "*");
  CHECK(compact_patterns({}, universe).empty());
}
