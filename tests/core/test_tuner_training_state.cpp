// training_state_bytes: the parameter, gradient and optimizer-state bytes under freezing and LoRA.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tuner/cost_model.h"

using namespace vlatune::tuner;
using vlatune::formats::StateDtype;

namespace {

// A two-tower toy: tower "a" (a Linear [8, 4] with bias, a norm [4]) and tower "b" (a Linear [6, 8], no bias).
std::vector<ParameterShape> toy_params() {
  return {{"a.proj.weight", {8, 4}}, {"a.proj.bias", {8}}, {"a.norm.weight", {4}}, {"b.out.weight", {6, 8}}};
}

}  // namespace

TEST_CASE("Training state bytes count every parameter, and gradients and moments of the trainable ones",
          "[tuner][memory]") {
  const auto params = toy_params();  // 32 + 8 + 4 + 48 = 92 elements
  const TrainingStateBytes full = training_state_bytes(params, {}, 2, StateDtype::kAuto);
  CHECK(full.trainable_numel == 92);
  CHECK(full.frozen_numel == 0);
  CHECK(full.parameter_bytes == 92 * 2);
  CHECK(full.gradient_bytes == 92 * 2);
  CHECK(full.optimizer_bytes == 2 * 92 * 2);  // two bf16 moments

  // Freezing tower a: its 44 elements keep their bytes, lose gradients and moments.
  TrainableSelection frozen_a;
  frozen_a.frozen = {"a"};
  const TrainingStateBytes fa = training_state_bytes(params, frozen_a, 4, StateDtype::kAuto);
  CHECK(fa.frozen_numel == 44);
  CHECK(fa.trainable_numel == 48);
  CHECK(fa.parameter_bytes == 92 * 4);
  CHECK(fa.gradient_bytes == 48 * 4);
  CHECK(fa.optimizer_bytes == 2 * 48 * 4);

  // A module name is a whole-segment prefix: freezing "a.pro" freezes nothing.
  TrainableSelection partial;
  partial.frozen = {"a.pro"};
  CHECK(training_state_bytes(params, partial, 2, StateDtype::kAuto).frozen_numel == 0);
}

TEST_CASE("LoRA freezes the adapted Linear's weight and bias and trains rank x (in + out) adapter elements",
          "[tuner][memory]") {
  const auto params = toy_params();
  TrainableSelection lora;
  lora.lora = {{"a.proj", 2}, {"b.out", 3}};  // A [2, 4] + B [8, 2] = 24; A [3, 8] + B [6, 3] = 42
  const TrainingStateBytes s = training_state_bytes(params, lora, 2, StateDtype::kAuto);
  CHECK(s.adapter_numel == 24 + 42);
  CHECK(s.frozen_numel == 32 + 8 + 48);       // both weights and the bias
  CHECK(s.trainable_numel == 4 + 24 + 42);    // the norm and the adapters
  CHECK(s.parameter_bytes == (92 + 66) * 2);  // base weights stay, adapters are added
  CHECK(s.gradient_bytes == (4 + 66) * 2);
  CHECK(s.optimizer_bytes == 2 * (4 + 66) * 2);

  // With 8-bit moments each tensor pays one code per element and an fp32 absmax per 256-element block.
  const TrainingStateBytes q = training_state_bytes(params, lora, 2, StateDtype::kInt8Blockwise);
  const double tensors = 5;  // the norm, two A and two B
  CHECK(q.optimizer_bytes == 2 * (4 + 66) + 2 * 4 * tensors);

  // LoRA with a whole tower frozen (openpi's preset): the adapters still train.
  lora.frozen = {"a", "b"};
  const TrainingStateBytes f = training_state_bytes(params, lora, 2, StateDtype::kAuto);
  CHECK(f.trainable_numel == 66);
  CHECK(f.gradient_bytes == 66 * 2);
}

TEST_CASE("LoRA on a module without a Linear weight is a planning error naming it", "[tuner][memory]") {
  TrainableSelection bad;
  bad.lora = {{"a.norm", 2}};
  CHECK_THROWS_WITH(training_state_bytes(toy_params(), bad, 2, StateDtype::kAuto),
                    Catch::Contains("a.norm") && Catch::Contains("Linear weight"));
}
