// A torch::autograd::Function whose arguments are (inputs..., params...) as one TensorList plus the callable
// in a capsule. Passing the parameters as arguments gives the checkpoint node autograd edges to their
// AccumulateGrad nodes, so the gradients the backward computes for them (torch::autograd::grad with
// allow_unused) are accumulated into .grad like any other. Only the arguments are saved: inputs are the
// activations checkpointing keeps, parameters are leaves (saving them copies nothing).
#include "model/recompute.h"

#include <ATen/core/ivalue.h>

#include "profiler/scope.h"

namespace vlatune::model {

namespace {

struct Runner : torch::CustomClassHolder {
  RecomputeFn fn;
  size_t num_inputs = 0;
  std::vector<bool> input_requires_grad;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList args,
                                                const c10::intrusive_ptr<Runner>& runner) {
    // Function::apply runs this with grad mode off: fn records no history.
    std::vector<torch::Tensor> inputs(args.begin(), args.begin() + static_cast<int64_t>(runner->num_inputs));
    ctx->save_for_backward(args.vec());
    ctx->saved_data["runner"] = c10::IValue::make_capsule(runner);
    ctx->set_materialize_grads(false);  // an output nobody used needs no zero tensor
    return runner->fn(inputs);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto runner = c10::static_intrusive_pointer_cast<Runner>(ctx->saved_data["runner"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const size_t n = runner->num_inputs;

    // Fresh leaves for the inputs, so the recomputed graph ends at them.
    std::vector<torch::Tensor> inputs(n);
    std::vector<torch::Tensor> wrt;
    std::vector<size_t> wrt_index;  // position in the argument list
    for (size_t i = 0; i < n; ++i) {
      if (!saved[i].defined()) continue;
      inputs[i] = saved[i].detach();
      if (runner->input_requires_grad[i]) {
        inputs[i].requires_grad_(true);
        wrt.push_back(inputs[i]);
        wrt_index.push_back(i);
      }
    }
    for (size_t i = n; i < saved.size(); ++i) {
      if (saved[i].requires_grad()) {
        wrt.push_back(saved[i]);
        wrt_index.push_back(i);
      }
    }

    std::vector<torch::Tensor> outputs;
    {
      torch::AutoGradMode grad_on(true);
      profiler::RecomputePhaseGuard phase;
      outputs = runner->fn(inputs);
    }
    std::vector<torch::Tensor> ys, gys;
    for (size_t j = 0; j < outputs.size() && j < grad_outputs.size(); ++j) {
      if (grad_outputs[j].defined() && outputs[j].requires_grad()) {
        ys.push_back(outputs[j]);
        gys.push_back(grad_outputs[j]);
      }
    }
    // One slot per argument of forward: the tensors, then the runner (never a gradient).
    torch::autograd::variable_list result(saved.size() + 1);
    if (ys.empty() || wrt.empty()) return result;
    auto grads = torch::autograd::grad(ys, wrt, gys, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[wrt_index[k]] = grads[k];
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> recompute(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs,
                                     const std::vector<torch::Tensor>& params) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto runner = c10::make_intrusive<Runner>();
  runner->fn = fn;
  runner->num_inputs = inputs.size();
  for (const auto& t : inputs) runner->input_requires_grad.push_back(t.defined() && t.requires_grad());
  std::vector<torch::Tensor> args = inputs;
  args.insert(args.end(), params.begin(), params.end());
  return CheckpointFunction::apply(at::TensorList(args), runner);
}

}  // namespace vlatune::model
