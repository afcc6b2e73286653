// One Pi0.5 training step for the exactness tests: forward and backward from zeroed gradients, with the loss, the
// velocity and every parameter's gradient copied out (to the CPU) for comparison.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "model/pi05.h"

namespace vlatune::test {

struct ModelStep {
  torch::Tensor loss, velocity;
  std::map<std::string, torch::Tensor> grads;
};

inline ModelStep model_step(vlatune::model::Pi05Impl& net, const vlatune::model::Pi05Batch& batch,
                            const vlatune::model::ForwardOptions& options) {
  net.zero_grad(/*set_to_none=*/true);
  auto out = net.forward(batch, options);
  out.loss.backward();
  net.fill_missing_grads();
  ModelStep s{out.loss.detach().cpu(), out.velocity.detach().cpu(), {}};
  for (const auto& item : net.named_parameters()) {
    REQUIRE(item.value().grad().defined());
    s.grads[item.key()] = item.value().grad().detach().cpu().clone();
  }
  return s;
}

}  // namespace vlatune::test
