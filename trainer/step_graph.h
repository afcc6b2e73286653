// A training step replayed as one captured CUDA graph (recipe `model_options.cuda_graph: "step"`, `vlatune train
// --cuda-graph step`).
//
// Why: an eager Pi0.5 step launches ~4,000 kernels, half of them shorter than 10 us; the GPU idles ~2 us between
// them (7-8 ms per step at batch 32) and at the step boundary. A replay launches them all at once.
//
// What is captured: forward, backward, the zero-fill of missing gradients, the gradient norm, the clip
// coefficient and AdamW, whose per-step scalars (learning rate, bias corrections) the kernels read from a device
// buffer written before each replay (AdamW::write_device_schedule). Outside the graph, eagerly: the batch (made or
// loaded as usual), its exact shortcuts (empty camera slots, text trimming: they read the masks on the host) and a
// copy into the graph's static input tensors; afterwards the reads of the norm and the loss.
//
// Shapes: a graph replays the shapes it was captured with. A batch whose shortcuts give other shapes (another text
// length when trimming, another set of camera slots) drops the graph and runs eagerly; the first step at a new set
// of shapes always runs eagerly (it builds cuDNN plans and fills caches, which must not happen under capture), and
// the next step at the same shapes captures. With trimming on and varying prompts this can recapture often: the
// log counts captures. A capture that fails (an operation that cannot be captured) is logged once with its reason
// and the run continues eagerly.
//
// Memory: the graph keeps its own pool, as large as the eager step's peak; the eager steps' cached blocks are
// released before the capture. The peak reported for replayed steps is the peak of the capture.
//
// Limits (refused at start-up with the reason): CUDA only, one process (the gradient all-reduces are not
// captured), grad_accum 1, no delayed FP8 scaling (its history position advances on the host).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "model/batch.h"
#include "model/config.h"

namespace at::cuda {
struct CUDAGraph;
}

namespace vlatune::trainer {

struct TrainingParts;
struct StepOutcome;

class StepGraph {
 public:
  // `log`: capture, recapture and fallback notices (kept by reference: it must outlive the object).
  explicit StepGraph(std::ostream& log);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One step (same contract as run_train_step).
  StepOutcome run(TrainingParts& parts, int64_t step, double lr, double clip_norm);

  struct Stats {
    int64_t captures = 0, replays = 0, eager_steps = 0;
    double capture_peak_gib = 0.0;  // allocated during the last capture (the replays' peak)
    std::string disabled;           // why capture was given up ("" while it is in use)
  };
  const Stats& stats() const { return stats_; }

 private:
  // One eager step of `batch`; `out` carries what the caller already knows (the data wait).
  StepOutcome run_eager(TrainingParts& parts, const model::Pi05Batch& batch, const model::ForwardOptions& options,
                        double lr, double clip_norm, StepOutcome out);
  void capture(TrainingParts& parts, const model::Pi05Batch& batch, const model::ForwardOptions& options, double lr,
               double clip_norm);
  void drop();

  std::ostream& log_;
  Stats stats_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  std::optional<c10::Stream> stream_;                 // where the steps run (captures need a non-default stream)
  std::vector<std::vector<int64_t>> key_, warm_key_;  // shapes captured / last run eagerly
  model::Pi05Batch static_;                           // the graph's inputs
  torch::Tensor loss_, norm_;                         // the graph's outputs
  double clip_norm_ = 0.0;                            // captured with this clip norm
};

// Why `parts` cannot run captured steps ("" when it can): not CUDA, distributed, grad_accum > 1, delayed FP8.
std::string step_graph_unsupported(const TrainingParts& parts);

}  // namespace vlatune::trainer
