// cuDNN padding-mask attention (cudnn_sdpa.h): graph construction, the per-thread caches, execution. The only
// translation unit that includes the cudnn_frontend headers; a build without them compiles the stubs at the end.
#include "kernels/cudnn_sdpa.h"

#include <sstream>
#include <stdexcept>

#ifdef VLATUNE_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/cuda_check.h"
#endif

namespace vlatune::kernels {

std::string describe(const SdpaProblem& p) {
  auto dims = [](const std::array<int64_t, 4>& a) {
    std::ostringstream s;
    s << "[" << a[0] << "," << a[1] << "," << a[2] << "," << a[3] << "]";
    return s.str();
  };
  std::ostringstream s;
  s << "batch " << p.batch << ", heads " << p.heads << "/" << p.kv_heads << ", seq " << p.seq_q << "x" << p.seq_kv
    << ", head_dim " << p.head_dim << (p.padding_mask ? ", padding mask" : ", no mask") << ", strides q"
    << dims(p.q_stride) << " k" << dims(p.k_stride) << " v" << dims(p.v_stride) << " o" << dims(p.o_stride);
  return s.str();
}

#ifdef VLATUNE_HAVE_CUDNN_FRONTEND

namespace {

namespace fe = cudnn_frontend;

// Variant-pack uids.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv, kDO, kDQ, kDK, kDV };

[[noreturn]] void fail(const SdpaProblem& p, const std::string& what) {
  throw std::runtime_error("cudnn_sdpa (" + describe(p) + "): " + what);
}

void check(const SdpaProblem& p, fe::error_t status, const char* step) {
  if (status.is_bad()) fail(p, std::string(step) + ": " + status.get_message());
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cudnn_sdpa: ") + what + ": " + cudnnGetErrorString(status));
}

// One handle per (thread, device): cuDNN handles are not shared across threads.
cudnnHandle_t thread_handle(int device) {
  thread_local std::map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  check_cudnn(cudnnCreate(&h), "cudnnCreate");
  handles.emplace(device, h);  // lives as long as the thread (the process, for the engine's threads)
  return h;
}

using Key = std::tuple<bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, std::array<int64_t, 4>,
                       std::array<int64_t, 4>, std::array<int64_t, 4>, std::array<int64_t, 4>, std::array<int64_t, 4>,
                       std::array<int64_t, 4>, std::array<int64_t, 4>, float, bool>;

Key key_of(const SdpaProblem& p, bool backward, int device) {
  return {backward,    device,      p.batch,     p.heads,    p.kv_heads,    p.seq_q,
          p.seq_kv,    p.head_dim,  p.q_stride,  p.k_stride, p.v_stride,    p.o_stride,
          p.dq_stride, p.dk_stride, p.dv_stride, p.scale,    p.padding_mask};
}

// The heuristics' first plan: timing every plan they list and keeping the fastest measured no faster in the step
// (bench/RESULTS.md, "cuDNN attention plans, timed").
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) {
  return {a[0], a[1], a[2], a[3]};
}

Built build(const SdpaProblem& p, bool backward, cudnnHandle_t handle) {
  if (p.batch <= 0 || p.heads <= 0 || p.kv_heads <= 0 || p.heads % p.kv_heads != 0 || p.seq_q <= 0 || p.seq_kv <= 0 ||
      p.head_dim <= 0)
    fail(p, "sizes must be positive and heads a multiple of kv_heads");
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = p.batch, h = p.heads, hk = p.kv_heads, sq = p.seq_q, skv = p.seq_kv, d = p.head_dim;
  auto bf16 = [&](const char* name, Uid uid, std::vector<int64_t> dim, const std::array<int64_t, 4>& stride) {
    return g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(std::move(dim)).set_stride(vec(stride)));
  };
  auto lengths = [&](const char* name, Uid uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({b, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  const std::vector<int64_t> stats_dim{b, h, sq, 1}, stats_stride{h * sq, sq, 1, 1};
  auto q = bf16("Q", kQ, {b, h, sq, d}, p.q_stride);
  auto k = bf16("K", kK, {b, hk, skv, d}, p.k_stride);
  auto v = bf16("V", kV, {b, hk, skv, d}, p.v_stride);
  // The lengths' graph tensors exist only with a padding mask (a declared tensor must be used).
  auto seq_q = [&] { return lengths("seq_q", kSeqQ); };
  auto seq_kv = [&] { return lengths("seq_kv", kSeqKv); };
  if (!backward) {
    auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(p.scale);
    if (p.padding_mask) options.set_padding_mask(true).set_seq_len_q(seq_q()).set_seq_len_kv(seq_kv());
    auto [o, stats] = g->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim({b, h, sq, d}).set_stride(vec(p.o_stride));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    auto o = bf16("O", kO, {b, h, sq, d}, p.o_stride);
    auto d_o = bf16("dO", kDO, {b, h, sq, d}, p.o_stride);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(p.scale);
    if (p.padding_mask) options.set_padding_mask(true).set_seq_len_q(seq_q()).set_seq_len_kv(seq_kv());
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim({b, h, sq, d}).set_stride(vec(p.dq_stride));
    dk->set_output(true).set_uid(kDK).set_dim({b, hk, skv, d}).set_stride(vec(p.dk_stride));
    dv->set_output(true).set_uid(kDV).set_dim({b, hk, skv, d}).set_stride(vec(p.dv_stride));
  }
  check(p, g->validate(), "validate");
  check(p, g->build_operation_graph(handle), "build_operation_graph");
  check(p, g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check(p, g->check_support(handle), "check_support");
  check(p, g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  Built built;
  built.graph = std::move(g);
  check(p, built.graph->get_workspace_size(built.workspace), "get_workspace_size");
  return built;
}

Built& cached(const SdpaProblem& p, bool backward, int device) {
  thread_local std::map<Key, Built> graphs;
  const Key key = key_of(p, backward, device);
  auto it = graphs.find(key);
  if (it == graphs.end()) it = graphs.emplace(key, build(p, backward, thread_handle(device))).first;
  return it->second;
}

int current_device() {
  int device = 0;
  VLATUNE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void execute(const SdpaProblem& p, Built& built, std::unordered_map<int64_t, void*>& pack,
             const SdpaWorkspace& workspace, cudaStream_t stream, int device) {
  if (!p.padding_mask) pack.erase(kSeqQ), pack.erase(kSeqKv);  // no lengths in a graph without the mask
  cudnnHandle_t handle = thread_handle(device);
  check_cudnn(cudnnSetStream(handle, stream), "cudnnSetStream");
  void* ws = built.workspace > 0 ? workspace(static_cast<size_t>(built.workspace)) : nullptr;
  check(p, built.graph->execute(handle, pack, ws), "execute");
}

}  // namespace

bool cudnn_sdpa_compiled() {
  return true;
}

std::string cudnn_sdpa_check(const SdpaProblem& p, int device) {
  // One answer per problem and device for the process: callers may ask on every forward, and a refusal costs as
  // much to find again as a success.
  static std::mutex mutex;
  static std::map<Key, std::string> answers;
  const Key key = key_of(p, false, device);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = answers.find(key); it != answers.end()) return it->second;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return "no CUDA device";
  if (cudaSetDevice(device) != cudaSuccess) return "cannot select CUDA device " + std::to_string(device);
  std::string why;
  try {
    cached(p, false, device);
    cached(p, true, device);
  } catch (const std::exception& e) {
    why = e.what();
  }
  cudaSetDevice(previous);
  answers.emplace(key, why);
  return why;
}

void cudnn_sdpa_forward(const SdpaProblem& p, const SdpaForwardArgs& args, const SdpaWorkspace& workspace,
                        cudaStream_t stream) {
  const int device = current_device();
  Built& built = cached(p, false, device);
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(args.q)},
                                          {kK, const_cast<void*>(args.k)},
                                          {kV, const_cast<void*>(args.v)},
                                          {kSeqQ, const_cast<int32_t*>(args.seq_q)},
                                          {kSeqKv, const_cast<int32_t*>(args.seq_kv)},
                                          {kO, args.o},
                                          {kStats, args.stats}};
  execute(p, built, pack, workspace, stream, device);
}

void cudnn_sdpa_backward(const SdpaProblem& p, const SdpaBackwardArgs& args, const SdpaWorkspace& workspace,
                         cudaStream_t stream) {
  const int device = current_device();
  Built& built = cached(p, true, device);
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(args.q)},
                                          {kK, const_cast<void*>(args.k)},
                                          {kV, const_cast<void*>(args.v)},
                                          {kO, const_cast<void*>(args.o)},
                                          {kDO, const_cast<void*>(args.d_o)},
                                          {kStats, const_cast<float*>(args.stats)},
                                          {kSeqQ, const_cast<int32_t*>(args.seq_q)},
                                          {kSeqKv, const_cast<int32_t*>(args.seq_kv)},
                                          {kDQ, args.dq},
                                          {kDK, args.dk},
                                          {kDV, args.dv}};
  execute(p, built, pack, workspace, stream, device);
}

#else  // no cudnn_frontend headers in this build

bool cudnn_sdpa_compiled() {
  return false;
}

std::string cudnn_sdpa_check(const SdpaProblem&, int) {
  return "built without the cuDNN frontend";
}

void cudnn_sdpa_forward(const SdpaProblem& p, const SdpaForwardArgs&, const SdpaWorkspace&, cudaStream_t) {
  throw std::runtime_error("cudnn_sdpa (" + describe(p) + "): built without the cuDNN frontend");
}

void cudnn_sdpa_backward(const SdpaProblem& p, const SdpaBackwardArgs&, const SdpaWorkspace&, cudaStream_t) {
  throw std::runtime_error("cudnn_sdpa (" + describe(p) + "): built without the cuDNN frontend");
}

#endif

}  // namespace vlatune::kernels
