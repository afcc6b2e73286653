// Activation checkpointing for one module call: the forward runs without recording autograd history and keeps
// only the call's inputs; the backward re-runs the call with grad enabled (its scopes record the
// kRecompute phase) and differentiates it. See recompute.cpp for the mechanics.
#pragma once

#include <functional>
#include <vector>

#include <torch/torch.h>

namespace vlatune::model {

using RecomputeFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>& inputs)>;

// Returns fn(inputs). With grad mode on, the result is attached to the graph through one checkpoint node
// whose backward recomputes fn and returns gradients for the floating-point inputs that require grad and for
// `params` (the parameters fn reads: they must be listed so that they receive gradients). fn must be
// deterministic (no RNG: pi05 has no dropout), must not modify its inputs, and its outputs must be new tensors
// (not inputs or views of them). Parameters fn does not use get no gradient (left undefined).
std::vector<torch::Tensor> recompute(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs,
                                     const std::vector<torch::Tensor>& params);

}  // namespace vlatune::model
