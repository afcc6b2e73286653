// The policy `vlatune serve` runs: openpi's pi05_libero input and output transforms around model::Sampler.
//
// Observation (openpi-client's dict; keys configurable, defaults are LiberoInputs'):
//   camera_keys[i]  image for camera slot i (base, left wrist, right wrist): uint8 [H, W, 3] or [3, H, W]; float
//                   images are taken as [0, 1] and converted as openpi's _parse_image does ((255 x).astype(uint8),
//                   clamped here to [0, 255] first). resize_with_pad to the model's side (PIL bilinear, black
//                   padding), then x / 255 * 2 - 1; slots past the cameras are masked (openpi: the right wrist).
//   state_key       the robot state, a 1-D numeric array of the norm stats' state dims: quantile-normalized (spec
//                   §5.3). pi05_libero does not feed it to the model; with discrete_state it goes into the prompt.
//   prompt_key      the task instruction (a string): tokenized as openpi's PaligemmaTokenizer (trainer/tokenizer.h),
//                   padded to text_len.
//   noise_key       optional (a vlatune extension): the initial noise, float32 [H, 32]; absent: drawn from the
//                   server's seeded generator (one draw per request).
// Unknown keys are ignored, as openpi's transforms ignore them.
// Output: {"actions": float32 [H, D]} (un-normalized with the norm stats' action quantiles, cut to their D dims,
// as LiberoOutputs), with "policy_timing": {"infer_ms"} (the model) and "server_timing": {"infer_ms", and
// "prev_total_ms" from the connection's second request on}, as openpi's server adds them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "model/sample.h"
#include "serve/msgpack_numpy.h"
#include "serve/server.h"
#include "trainer/norm_stats.h"

namespace vlatune::model {
class Pi05Impl;
}
namespace vlatune::trainer {
class PromptTokenizer;
}

namespace vlatune::serve {

struct PolicyConfig {
  std::vector<std::string> camera_keys = {"observation/image", "observation/wrist_image"};
  std::string state_key = "observation/state";
  std::string prompt_key = "prompt";
  std::string noise_key = "noise";
  int64_t slots = 3;       // camera slots of the model (openpi: 3)
  int64_t text_len = 200;  // prompt tokens before trimming (openpi pi05: 200)
  int64_t horizon = 10;    // action chunk length when no noise is sent (pi05_libero: 10)
  bool discrete_state = false;
  uint64_t seed = 0;  // the noise generator's
  int64_t max_image_side = 4096;
};

class Policy {
 public:
  // Throws std::invalid_argument for a configuration that cannot work (no camera key, more cameras than slots,
  // norm stats wider than the model's action dim, a tokenizer vocabulary larger than the model's).
  Policy(model::Pi05Impl& model, model::SampleOptions sample, trainer::NormStats norm,
         std::shared_ptr<const trainer::PromptTokenizer> tokenizer, PolicyConfig config);
  ~Policy();

  struct Actions {
    std::vector<float> values;  // [horizon, dims], real units
    int64_t horizon = 0, dims = 0;
    double infer_ms = 0;  // the model alone (device synchronized)
  };
  // Throws WireError naming the key and the problem for an observation it cannot use.
  Actions infer(const std::map<std::string, WireValue>& observation);

  // The message sent on connect: what a client needs to build observations.
  nlohmann::json metadata() const;
  // One request, start to end: decode, infer, encode; a refused observation becomes a text reply naming it.
  Response handle(const std::string& payload, double prev_total_ms);

 private:
  model::Pi05Impl& model_;
  model::SampleOptions sample_options_;
  std::unique_ptr<model::Sampler> sampler_;
  trainer::NormStats norm_;
  std::shared_ptr<const trainer::PromptTokenizer> tokenizer_;
  PolicyConfig config_;
  torch::Generator noise_gen_;
};

}  // namespace vlatune::serve
