// Checks the inputs of the fused AdamW / global norm and dispatches by device (contract: adamw_ops.h).
// CUDA tensors go to adamw.cu's raw-pointer launchers on the current stream; CPU tensors to adamw_ref.cpp.
#include <ATen/ATen.h>
#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/adamw_ops.h"

namespace vlatune::kernels {

const char* adamw_storage_name(AdamwStorage storage) {
  switch (storage) {
    case AdamwStorage::kFp32:
      return "fp32";
    case AdamwStorage::kBf16:
      return "bf16";
    case AdamwStorage::kFp32Master:
      return "fp32-master";
  }
  return "?";
}

AdamwStepScalars adamw_step_scalars(const AdamwParams& params) {
  // In double on the host, rounded once (torch computes them in double too and passes them as Scalars).
  const double bc1 = 1.0 - std::pow(params.beta1, static_cast<double>(params.step));
  const double bc2 = 1.0 - std::pow(params.beta2, static_cast<double>(params.step));
  AdamwStepScalars s;
  s.decay = static_cast<float>(1.0 - params.lr * params.weight_decay);
  s.step_size = static_cast<float>(params.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return s;
}

namespace {

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "f32";
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "f16";
    case at::kDouble:
      return "f64";
    case at::kByte:
      return "u8";
    default:
      return c10::toString(t);
  }
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << dtype_name(t.scalar_type()) << " " << t.sizes() << " on " << t.device();
  if (!t.is_contiguous()) os << " (not contiguous)";
  return os.str();
}

// "adamw_step[bf16]: exp_avg[3] must be bf16 [1024, 64] on cuda:0, got f32 [1024, 64] on cuda:0".
void check_tensor(const std::string& op, const char* list, size_t i, const at::Tensor& t, at::ScalarType dtype,
                  at::IntArrayRef sizes, const at::Device& device) {
  const bool ok =
      t.defined() && t.scalar_type() == dtype && t.sizes() == sizes && t.device() == device && t.is_contiguous();
  if (ok) return;
  std::ostringstream os;
  os << op << ": " << list << "[" << i << "] must be a contiguous " << dtype_name(dtype) << " " << sizes << " on "
     << device << ", got " << (t.defined() ? describe(t) : std::string("an undefined tensor"));
  throw std::invalid_argument(os.str());
}

void check_count(const std::string& op, const char* list, size_t got, size_t expected) {
  if (got == expected) return;
  throw std::invalid_argument(op + ": " + list + " has " + std::to_string(got) + " tensors, params has " +
                              std::to_string(expected));
}

AdamwStorage infer_storage(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>* master) {
  if (master != nullptr) return AdamwStorage::kFp32Master;
  const at::ScalarType t = params.front().defined() ? params.front().scalar_type() : at::kFloat;
  if (t == at::kBFloat16) return AdamwStorage::kBf16;
  if (t == at::kFloat) return AdamwStorage::kFp32;
  throw std::invalid_argument("adamw_step: params[0] must be f32 or bf16 (or bf16 with fp32 master weights), got " +
                              describe(params.front()));
}

// The tensors of one update. exp_avg_absmax / exp_avg_sq_absmax: 8-bit state only (then exp_avg and exp_avg_sq
// hold uint8 codes); null for full-precision state.
struct UpdateTensors {
  std::vector<at::Tensor>& params;
  const std::vector<at::Tensor>& grads;
  std::vector<at::Tensor>& exp_avg;
  std::vector<at::Tensor>& exp_avg_sq;
  std::vector<at::Tensor>* exp_avg_absmax;
  std::vector<at::Tensor>* exp_avg_sq_absmax;
  std::vector<at::Tensor>* master;
  bool int8_state() const { return exp_avg_absmax != nullptr; }
};

// The lists' lengths, then per tensor params, grads, the state and the master weights, then grad_scale.
void check_update(const std::string& op, AdamwStorage storage, const UpdateTensors& t, const at::Tensor& grad_scale) {
  const size_t n = t.params.size();
  check_count(op, "grads", t.grads.size(), n);
  check_count(op, "exp_avg", t.exp_avg.size(), n);
  check_count(op, "exp_avg_sq", t.exp_avg_sq.size(), n);
  if (t.int8_state()) {
    check_count(op, "exp_avg_absmax", t.exp_avg_absmax->size(), n);
    check_count(op, "exp_avg_sq_absmax", t.exp_avg_sq_absmax->size(), n);
  }
  if (t.master != nullptr) check_count(op, "master", t.master->size(), n);

  const at::ScalarType param_dtype = storage == AdamwStorage::kFp32 ? at::kFloat : at::kBFloat16;
  const at::ScalarType state_dtype = t.int8_state()                   ? at::kByte
                                     : storage == AdamwStorage::kBf16 ? at::kBFloat16
                                                                      : at::kFloat;
  const at::Device device = t.params.front().device();
  for (size_t i = 0; i < n; ++i) {
    const at::IntArrayRef sizes = t.params[i].defined() ? t.params[i].sizes() : at::IntArrayRef{};
    check_tensor(op, "params", i, t.params[i], param_dtype, sizes, device);
    if (t.grads[i].defined()) check_tensor(op, "grads", i, t.grads[i], param_dtype, sizes, device);
    check_tensor(op, "exp_avg", i, t.exp_avg[i], state_dtype, sizes, device);
    check_tensor(op, "exp_avg_sq", i, t.exp_avg_sq[i], state_dtype, sizes, device);
    if (t.int8_state()) {
      const int64_t blocks = adamw_quant_blocks(t.params[i].numel());
      check_tensor(op, "exp_avg_absmax", i, (*t.exp_avg_absmax)[i], at::kFloat, {blocks}, device);
      check_tensor(op, "exp_avg_sq_absmax", i, (*t.exp_avg_sq_absmax)[i], at::kFloat, {blocks}, device);
    }
    if (t.master != nullptr) check_tensor(op, "master", i, (*t.master)[i], at::kFloat, sizes, device);
  }
  if (grad_scale.defined()) check_tensor(op, "grad_scale", 0, grad_scale, at::kFloat, {}, device);
}

#ifdef VLATUNE_HAVE_CUDA
// Hands the tensors' pointers to the launcher of their state (adamw.h) on the device's current stream.
void launch_on_cuda(AdamwStorage storage, const UpdateTensors& t, const AdamwParams& p, const at::Tensor& grad_scale) {
  const size_t n = t.params.size();
  std::vector<void*> p_ptr(n), m_ptr(n), v_ptr(n), model_ptr(n, nullptr);
  std::vector<float*> m_absmax(t.int8_state() ? n : 0), v_absmax(t.int8_state() ? n : 0);
  std::vector<const void*> g_ptr(n);
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    numels[i] = t.params[i].numel();
    p_ptr[i] = t.master != nullptr ? (*t.master)[i].data_ptr() : t.params[i].data_ptr();
    if (t.master != nullptr) model_ptr[i] = t.params[i].data_ptr();
    g_ptr[i] = t.grads[i].defined() ? t.grads[i].const_data_ptr() : nullptr;
    m_ptr[i] = t.exp_avg[i].data_ptr();
    v_ptr[i] = t.exp_avg_sq[i].data_ptr();
    if (t.int8_state()) {
      m_absmax[i] = (*t.exp_avg_absmax)[i].data_ptr<float>();
      v_absmax[i] = (*t.exp_avg_sq_absmax)[i].data_ptr<float>();
    }
  }
  AdamwTensorList list;
  list.params = p_ptr.data();
  list.grads = g_ptr.data();
  list.exp_avg = m_ptr.data();
  list.exp_avg_sq = v_ptr.data();
  list.exp_avg_absmax = t.int8_state() ? m_absmax.data() : nullptr;
  list.exp_avg_sq_absmax = t.int8_state() ? v_absmax.data() : nullptr;
  list.model_bf16 = t.master != nullptr ? model_ptr.data() : nullptr;
  list.numels = numels.data();
  list.count = static_cast<int64_t>(n);
  AdamwParams launch_params = p;
  launch_params.grad_scale_device = grad_scale.defined() ? grad_scale.const_data_ptr<float>() : nullptr;
  const at::Device device = t.params.front().device();
  const c10::cuda::CUDAGuard guard(device);
  const auto launcher = t.int8_state() ? &launch_adamw_int8_multi_tensor : &launch_adamw_multi_tensor;
  launcher(storage, list, launch_params, c10::cuda::getCurrentCUDAStream(device.index()).stream());
}
#endif

// Checks the update and runs it where the tensors are: `reference` on the CPU, the fused kernel on CUDA.
template <typename Reference>
void run_update(const std::string& op, AdamwStorage storage, const UpdateTensors& t, const AdamwParams& p,
                const at::Tensor& grad_scale, Reference reference) {
  check_update(op, storage, t, grad_scale);
  const at::Device device = t.params.front().device();
  if (device.is_cpu()) {
    if (p.step_scalars_device != nullptr)
      throw std::invalid_argument(op + ": step_scalars_device is a CUDA feature; these tensors are on the CPU");
    reference();
    return;
  }
#ifdef VLATUNE_HAVE_CUDA
  if (device.is_cuda()) {
    launch_on_cuda(storage, t, p, grad_scale);
    return;
  }
#endif
  throw std::invalid_argument(op + ": no implementation for tensors on " + device.str() +
                              (device.is_cuda() ? " (this build has no CUDA kernels)" : ""));
}

}  // namespace

void adamw_step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, std::vector<at::Tensor>& exp_avg,
                std::vector<at::Tensor>& exp_avg_sq, std::vector<at::Tensor>* master, const AdamwParams& p,
                const at::Tensor& grad_scale) {
  if (params.empty()) return;
  const AdamwStorage storage = infer_storage(params, master);
  const UpdateTensors t{params, grads, exp_avg, exp_avg_sq, nullptr, nullptr, master};
  run_update(std::string("adamw_step[") + adamw_storage_name(storage) + "]", storage, t, p, grad_scale,
             [&] { adamw_step_ref(params, grads, exp_avg, exp_avg_sq, master, p, grad_scale); });
}

void adamw_step_int8(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, AdamwInt8State& state,
                     std::vector<at::Tensor>* master, const AdamwParams& p, const at::Tensor& grad_scale) {
  if (params.empty()) return;
  const AdamwStorage storage = infer_storage(params, master);
  const UpdateTensors t{params, grads, state.exp_avg, state.exp_avg_sq, &state.exp_avg_absmax, &state.exp_avg_sq_absmax,
                        master};
  run_update(std::string("adamw_step_int8[") + adamw_storage_name(storage) + "]", storage, t, p, grad_scale,
             [&] { adamw_step_int8_ref(params, grads, state, master, p, grad_scale); });
}

at::Tensor global_grad_norm(const std::vector<at::Tensor>& grads) {
  const at::Tensor* first = nullptr;
  for (const at::Tensor& g : grads) {
    if (g.defined()) {
      first = &g;
      break;
    }
  }
  if (first == nullptr) return at::zeros({}, at::kFloat);
  const at::Device device = first->device();
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (!g.defined()) continue;
    if (g.device() != device || !g.is_contiguous() ||
        (g.scalar_type() != at::kFloat && g.scalar_type() != at::kBFloat16)) {
      throw std::invalid_argument("global_grad_norm: grads[" + std::to_string(i) +
                                  "] must be a contiguous f32 or bf16 tensor on " + device.str() + ", got " +
                                  describe(g));
    }
  }
  if (device.is_cpu()) return global_grad_norm_ref(grads);
#ifdef VLATUNE_HAVE_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    // One fused launch sequence per gradient dtype, each writing its sum of squares into one slot.
    const at::ScalarType dtypes[2] = {at::kFloat, at::kBFloat16};
    at::Tensor sums = at::zeros({2}, first->options().dtype(at::kFloat));
    for (int k = 0; k < 2; ++k) {
      std::vector<const void*> ptrs;
      std::vector<int64_t> numels;
      for (const at::Tensor& g : grads) {
        if (!g.defined() || g.scalar_type() != dtypes[k] || g.numel() == 0) continue;
        ptrs.push_back(g.const_data_ptr());
        numels.push_back(g.numel());
      }
      if (ptrs.empty()) continue;
      const int64_t count = static_cast<int64_t>(ptrs.size());
      at::Tensor workspace = at::empty({sum_squares_workspace_numel(numels.data(), count)}, sums.options());
      launch_sum_squares_multi_tensor(k == 0 ? NormDtype::kFp32 : NormDtype::kBf16, ptrs.data(), numels.data(), count,
                                      workspace.data_ptr<float>(), sums.data_ptr<float>() + k, stream);
    }
    return sums.sum().sqrt();
  }
#endif
  throw std::invalid_argument("global_grad_norm: no implementation for tensors on " + device.str());
}

}  // namespace vlatune::kernels
