#include "trainer/step_graph.h"

#include <stdexcept>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "model/pi05.h"
#include "trainer/environment.h"
#include "trainer/train_step.h"

namespace vlatune::trainer {

namespace {

// The shapes (and dtypes) a graph is captured for: the batch after its shortcuts.
std::vector<std::vector<int64_t>> shapes_of(const model::Pi05Batch& b) {
  std::vector<std::vector<int64_t>> key;
  for (const torch::Tensor* t : model::batch_tensors(b)) {
    std::vector<int64_t> k = t->defined() ? t->sizes().vec() : std::vector<int64_t>{-1};
    k.push_back(t->defined() ? static_cast<int64_t>(t->scalar_type()) : -1);
    key.push_back(std::move(k));
  }
  return key;
}

// A tensor of the graph's inputs: its own contiguous storage outside the graph's pool.
torch::Tensor static_copy(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone(at::MemoryFormat::Contiguous) : t;
}

}  // namespace

std::string step_graph_unsupported(const TrainingParts& parts) {
#ifndef VLATUNE_HAVE_CUDA
  (void)parts;
  return "this build has no CUDA";
#else
  if (!parts.device.is_cuda()) return "it needs a CUDA device, this run is on " + parts.device.str();
  if (parts.dist) return "it captures a one-process step, this run is data-parallel (its all-reduces are not captured)";
  if (parts.grad_accum != 1)
    return "it captures one micro-batch per step, this run accumulates " + std::to_string(parts.grad_accum);
  if (parts.applied.fp8_delayed)
    return "delayed FP8 scaling advances its amax history position on the host every step; use tensorwise";
  return "";
#endif
}

StepGraph::StepGraph(std::ostream& log) : log_(log) {}

StepGraph::~StepGraph() = default;

void StepGraph::drop() {
  graph_.reset();  // its pool goes with it
  loss_ = torch::Tensor();
  norm_ = torch::Tensor();
  static_ = model::Pi05Batch{};
  key_.clear();
}

StepOutcome StepGraph::run_eager(TrainingParts& parts, const model::Pi05Batch& batch,
                                 const model::ForwardOptions& options, double lr, double clip_norm, StepOutcome out) {
  ++stats_.eager_steps;
  const torch::Tensor loss = forward_backward(parts, batch, options, 1);
  const torch::Tensor norm = queue_optimizer_step(parts, lr, clip_norm, /*device_schedule=*/false);
  out.optimizer = parts.optimizer->finish_update(lr, clip_norm, norm);
  out.loss = loss.item<double>();
  return out;
}

#ifdef VLATUNE_HAVE_CUDA

void StepGraph::capture(TrainingParts& parts, const model::Pi05Batch& batch, const model::ForwardOptions& options,
                        double lr, double clip_norm) {
  drop();
  static_ = batch;
  for (torch::Tensor* t : model::batch_tensors(static_)) *t = static_copy(*t);
  parts.optimizer->zero_grad();  // inside the capture, every gradient is made (not accumulated) into the pool
  parts.optimizer->write_device_schedule(lr);
  // The eager steps' cached blocks go back to the device, so that the graph's pool can have them.
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  reset_peak_allocated(parts.device);

  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  graph->capture_begin();
  try {
    loss_ = forward_backward(parts, static_, options, 1);
    norm_ = queue_optimizer_step(parts, lr, clip_norm, /*device_schedule=*/true);
  } catch (...) {
    // End the (invalidated) capture so that the stream and the allocator leave capture mode; its own error is
    // the same failure seen again.
    try {
      graph->capture_end();
    } catch (...) {
    }
    (void)cudaGetLastError();
    loss_ = torch::Tensor();
    norm_ = torch::Tensor();
    parts.optimizer->zero_grad();
    throw;
  }
  graph->capture_end();
  graph_ = std::move(graph);
  clip_norm_ = clip_norm;
  stats_.capture_peak_gib = peak_allocated_gib(parts.device);
  ++stats_.captures;
}

StepOutcome StepGraph::run(TrainingParts& parts, int64_t step, double lr, double clip_norm) {
  // Captures need a stream of their own (not the default stream); every step runs there, eager ones included,
  // after the work the caller queued on its stream (initialization, checkpoint loads, the EMA).
  const c10::DeviceIndex index = parts.device.has_index() ? parts.device.index() : c10::cuda::current_device();
  if (!stream_) stream_ = c10::cuda::getStreamFromPool(false, index).unwrap();
  const c10::cuda::CUDAStream stream(*stream_);
  {
    at::cuda::CUDAEvent caller_done;
    caller_done.record(c10::cuda::getCurrentCUDAStream(index));
    caller_done.block(stream);
  }
  const c10::cuda::CUDAStreamGuard on_stream(stream);
  StepOutcome out;
  const model::Pi05Batch raw = next_batch(parts, step, 0, &out.wait_ms);
  if (!stats_.disabled.empty()) return run_eager(parts, raw, parts.applied.forward, lr, clip_norm, out);
  // The shortcuts read the masks on the host, so they run here, before the graph; the captured forward then has
  // nothing left to cut.
  const model::Pi05Batch batch = model::apply_input_shortcuts(raw, parts.applied.forward);
  model::ForwardOptions options = parts.applied.forward;
  options.prune_slots = false;
  options.trim_text = false;
  options.skip_padded_rows = false;  // the live row count varies by batch; a captured graph keeps its shapes
  const auto key = shapes_of(batch);

  if (graph_ && (key != key_ || clip_norm != clip_norm_)) {
    log_ << "cuda graph: the batch's shapes changed after step " << step - 1 << "; the graph is dropped ("
         << stats_.captures << " capture(s) so far)\n";
    drop();
  }
  if (!graph_) {
    if (key != warm_key_) {
      // First step at these shapes: eagerly (cuDNN plans, GEMM heuristics and other lazy set-up stay out of
      // the capture); the next one at the same shapes captures.
      warm_key_ = key;
      return run_eager(parts, batch, options, lr, clip_norm, out);
    }
    try {
      capture(parts, batch, options, lr, clip_norm);
      key_ = key;  // the static inputs were made from this batch: its shapes
      log_ << "cuda graph: captured step " << step << " (capture " << stats_.captures << ", peak "
           << stats_.capture_peak_gib << " GiB)\n";
    } catch (const std::exception& e) {
      stats_.disabled = e.what();
      log_ << "cuda graph: the step could not be captured; running eagerly from now on. Reason: " << e.what() << "\n";
      drop();
      torch::cuda::synchronize();
      return run_eager(parts, batch, options, lr, clip_norm, out);
    }
  } else {
    parts.optimizer->write_device_schedule(lr);
    // Same shapes as the capture's (the key): each input is copied into its static tensor.
    const auto dst = model::batch_tensors(static_);
    const auto src = model::batch_tensors(batch);
    for (size_t i = 0; i < dst.size(); ++i)
      if (dst[i]->defined()) dst[i]->copy_(*src[i], /*non_blocking=*/true);
  }
  // At the capture step the inputs were copied before capturing and the schedule written; replay runs the step.
  graph_->replay();
  ++stats_.replays;
  out.optimizer = parts.optimizer->finish_update(lr, clip_norm, norm_);
  out.loss = loss_.item<double>();
  out.graph_peak_gib = stats_.capture_peak_gib;
  return out;
}

#else

void StepGraph::capture(TrainingParts&, const model::Pi05Batch&, const model::ForwardOptions&, double, double) {
  throw std::logic_error("StepGraph: this build has no CUDA");
}

StepOutcome StepGraph::run(TrainingParts&, int64_t, double, double) {
  throw std::logic_error("StepGraph: this build has no CUDA");
}

#endif

}  // namespace vlatune::trainer
