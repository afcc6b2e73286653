#include "model/sample.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "kernels/fused_ops.h"
#include "model/pi05.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One GEMM over Linears that read the same input (the fused path's merged QKV), named for the profiler's GEMM
// inventory as the training forward names it.
torch::Tensor merged(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members) {
  std::vector<torch::Tensor> weights;
  std::vector<const std::string*> names;
  int64_t n = 0;
  for (const LinearImpl* l : members) {
    weights.push_back(l->weight);
    names.push_back(&l->fqn());
    n += l->weight.size(0);
  }
  if (profiler::scopes_enabled()) profiler::note_gemm(names, x.numel() / x.size(-1), x.size(-1), n);
  return kernels::merged_linear(x, weights);
}

// [B, T, heads * D] (any strides with a unit last stride) -> [B, heads, T, D].
torch::Tensor split_heads(const torch::Tensor& y, int64_t heads, int64_t d) {
  return y.view({y.size(0), y.size(1), heads, d}).transpose(1, 2);
}

// Writes `value` into `slot` when the slot already has its shape (a graph's static tensor), else takes it.
void put(torch::Tensor& slot, const torch::Tensor& value) {
  if (slot.defined() && slot.sizes() == value.sizes() && slot.scalar_type() == value.scalar_type())
    slot.copy_(value);
  else
    slot = value;
}

const std::string& inputs_scope_name() {
  static const std::string name = profiler::kInputsScope;
  return name;
}

}  // namespace

std::vector<float> euler_times(int64_t num_steps) {
  if (num_steps < 1) throw std::invalid_argument("sample: num_steps must be >= 1, got " + std::to_string(num_steps));
  const float dt = -1.0f / static_cast<float>(num_steps);
  std::vector<float> times;
  for (float t = 1.0f; t >= -dt / 2; t += dt) times.push_back(t);
  return times;
}

torch::Tensor sample_noise(int64_t batch, int64_t horizon, int64_t action_dim, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn({batch, horizon, action_dim}, gen, torch::TensorOptions().dtype(torch::kFloat32));
}

struct Sampler::Graph {
#ifdef VLATUNE_HAVE_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  Cache cache;
  torch::Tensor x, out;  // the captured loop's input noise and output actions
};

Sampler::Sampler(Pi05Impl& model, SampleOptions options)
    : model_(model),
      options_(std::move(options)),
      times_(euler_times(options_.num_steps)),
      compute_(options_.forward.compute_dtype.value_or(model.action_in_proj->weight.scalar_type())) {}

Sampler::~Sampler() = default;

bool Sampler::fused(const torch::Tensor& like) const {
  const Kernels k = options_.forward.kernels;
  return k == Kernels::kFused || (k == Kernels::kAuto && like.is_cuda());
}

const Sampler::Conditioning& Sampler::conditioning(int64_t batch) {
  auto it = conditioning_.find(batch);
  if (it != conditioning_.end()) return it->second;
  const auto md = math_dtype(compute_);
  const auto device = model_.action_in_proj->weight.device();
  Conditioning c;
  for (float t : times_) {
    // As Pi05Impl::forward: sinusoidal embedding in the math dtype, time MLP with SiLU after both layers.
    std::optional<profiler::Scope> scope(std::in_place, inputs_scope_name());
    auto temb = time_embedding(torch::full({batch}, t, torch::TensorOptions().dtype(md).device(device)),
                               model_.config().expert.width)
                    .to(compute_);
    scope.reset();
    torch::Tensor h = model_.time_mlp_in(temb);
    scope.emplace(inputs_scope_name());
    h = torch::silu(h);
    scope.reset();
    h = model_.time_mlp_out(h);
    scope.emplace(inputs_scope_name());
    c.cond.push_back(torch::silu(h));
    scope.reset();
  }
  return conditioning_.emplace(batch, std::move(c)).first->second;
}

void Sampler::encode_prefix(const Pi05Batch& raw, int64_t horizon, Cache& cache, SampleTiming* timing) {
  const Pi05Config& cfg = model_.config();
  const auto md = math_dtype(compute_);
  const auto device = raw.tokens.device();
  auto t0 = Clock::now();
  std::optional<profiler::Scope> inputs(std::in_place, inputs_scope_name());
  const Pi05Batch b = apply_input_shortcuts(raw, options_.forward);
  inputs.reset();
  const bool fz = fused(b.tokens);
  const kernels::OpPath path = fz ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  const int64_t batch = b.tokens.size(0);
  const Attention attention = options_.forward.attention;

  // Prefix embeddings as in Pi05Impl::forward: [image tokens of the kept slots..., text * sqrt(width)].
  std::vector<torch::Tensor> parts, valid_parts;
  const int64_t slots = b.images.size(1);
  if (slots > 0) {
    const int64_t side = b.images.size(-1), per_image = cfg.vision.tokens_per_image();
    auto features =
        model_.vision_tower().forward(b.images.reshape({batch * slots, 3, side, side}), compute_, attention, {}, fz);
    auto projected = model_.projector().forward(features);
    inputs.emplace(inputs_scope_name());
    parts.push_back(projected.reshape({batch, slots * per_image, projected.size(-1)}));
    valid_parts.push_back(
        b.image_masks.unsqueeze(-1).expand({batch, slots, per_image}).reshape({batch, slots * per_image}));
    inputs.reset();
  }
  if (timing != nullptr) {
    synchronize(device);
    timing->vision_ms = ms_since(t0);
    t0 = Clock::now();
  }
  GemmaModelImpl& lm = model_.language_model();
  {
    torch::Tensor embedded = lm.embed_tokens(b.tokens);
    inputs.emplace(inputs_scope_name());
    parts.push_back((embedded.to(md) * std::sqrt(static_cast<double>(cfg.backbone.width))).to(compute_));
    valid_parts.push_back(b.token_masks);
  }
  torch::Tensor hp = at::cat(parts, 1);
  const torch::Tensor valid = at::cat(valid_parts, 1);
  const int64_t p = hp.size(1);
  const int64_t heads = cfg.backbone.heads, kv_heads = cfg.backbone.kv_heads, d = cfg.backbone.head_dim;
  // Prefix: bidirectional over valid keys (a padded query row sees itself only: finite, never read). Suffix rows:
  // every valid prefix key and every suffix key; positions continue after the valid prefix (spec §6.3).
  const auto [cos, sin] = rope_tables(valid.to(torch::kLong).cumsum(1) - 1, d, md);
  const auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(device);
  const torch::Tensor mask = (valid.unsqueeze(1) | torch::eye(p, bool_opts)).unsqueeze(1);
  const auto suffix_pos = valid.to(torch::kLong).sum(1, /*keepdim=*/true) +
                          torch::arange(horizon, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto [suffix_cos, suffix_sin] = rope_tables(suffix_pos, d, md);
  put(cache.suffix_cos, suffix_cos);
  put(cache.suffix_sin, suffix_sin);
  put(cache.suffix_mask, at::cat({valid.view({batch, 1, 1, p}).expand({batch, 1, horizon, p}),
                                  torch::ones({batch, 1, horizon, horizon}, bool_opts)},
                                 -1));
  const auto depth = static_cast<size_t>(cfg.backbone.depth);
  if (cache.keys.size() != depth || cache.prefix_len != p || cache.keys[0].size(0) != batch ||
      cache.keys[0].size(2) != p + horizon || cache.keys[0].scalar_type() != compute_) {
    const auto opts = torch::TensorOptions().dtype(compute_).device(device);
    cache.keys.assign(depth, torch::Tensor());
    cache.values.assign(depth, torch::Tensor());
    for (size_t i = 0; i < depth; ++i) {
      cache.keys[i] = torch::empty({batch, kv_heads, p + horizon, d}, opts);
      cache.values[i] = torch::empty({batch, kv_heads, p + horizon, d}, opts);
    }
  }
  cache.prefix_len = p;
  inputs.reset();

  // The backbone over the prefix alone. The last layer's queries, attention, o_proj and MLP feed nothing the
  // suffix reads (spec §3, dead compute): only its K/V are computed.
  for (size_t i = 0; i < depth; ++i) {
    GemmaDecoderLayerImpl& layer = *lm.layers[i];
    GemmaAttentionImpl& a = *layer.self_attn;
    profiler::Scope layer_scope(layer.fqn());
    const bool last = i + 1 == depth;
    const NormOutput n = layer.pre_attention_norm(hp, torch::Tensor(), path);
    torch::Tensor attn;
    {
      profiler::Scope attn_scope(a.fqn());
      torch::Tensor q, k, v;
      if (fz) {
        const torch::Tensor qkv = last ? merged(n.y, {a.k_proj.get(), a.v_proj.get()})
                                       : merged(n.y, {a.q_proj.get(), a.k_proj.get(), a.v_proj.get()});
        const int64_t q_cols = last ? 0 : heads * d;
        if (!last) q = qkv.narrow(-1, 0, q_cols);
        k = qkv.narrow(-1, q_cols, kv_heads * d);
        v = qkv.narrow(-1, q_cols + kv_heads * d, kv_heads * d);
      } else {
        if (!last) q = a.q_proj(n.y);
        k = a.k_proj(n.y);
        v = a.v_proj(n.y);
      }
      k = kernels::apply_rope_ref(split_heads(k, kv_heads, d), cos, sin);
      v = split_heads(v, kv_heads, d);
      cache.keys[i].narrow(2, 0, p).copy_(k);
      cache.values[i].narrow(2, 0, p).copy_(v);
      if (last) break;
      q = kernels::apply_rope_ref(split_heads(q, heads, d), cos, sin);
      attn = a.o_proj(attention_core(q, k, v, mask, attention).transpose(1, 2).reshape({batch, p, heads * d}));
    }
    const NormOutput n2 = layer.residual_pre_ffn_norm(n.h, attn, torch::Tensor(), torch::Tensor(), path);
    hp = n2.h + layer.mlp->forward(n2.y, /*recompute_gate_up=*/false, fz);
  }
  if (timing != nullptr) {
    synchronize(device);
    timing->prefix_ms = ms_since(t0);
  }
}

torch::Tensor Sampler::velocity(Cache& cache, const torch::Tensor& x, int64_t step) {
  const Pi05Config& cfg = model_.config();
  const auto md = math_dtype(compute_);
  const bool fz = fused(x);
  const kernels::OpPath path = fz ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  const int64_t batch = x.size(0), s = x.size(1), p = cache.prefix_len;
  const int64_t heads = cfg.backbone.heads, kv_heads = cfg.backbone.kv_heads, d = cfg.backbone.head_dim;
  const Conditioning& c = conditioning(batch);
  const torch::Tensor& cond = c.cond[static_cast<size_t>(step)];
  GemmaModelImpl& ex = model_.expert_model();

  torch::Tensor hs = model_.action_in_proj(x.to(compute_));
  for (size_t i = 0; i < ex.layers.size(); ++i) {
    GemmaDecoderLayerImpl& layer = *ex.layers[i];
    GemmaAttentionImpl& a = *layer.self_attn;
    profiler::Scope layer_scope(layer.fqn());
    const NormOutput n = layer.pre_attention_norm(hs, cond, path);
    torch::Tensor attn;
    {
      profiler::Scope attn_scope(a.fqn());
      torch::Tensor q, k, v;
      if (fz) {
        const torch::Tensor qkv = merged(n.y, {a.q_proj.get(), a.k_proj.get(), a.v_proj.get()});
        q = qkv.narrow(-1, 0, heads * d);
        k = qkv.narrow(-1, heads * d, kv_heads * d);
        v = qkv.narrow(-1, (heads + kv_heads) * d, kv_heads * d);
      } else {
        q = a.q_proj(n.y);
        k = a.k_proj(n.y);
        v = a.v_proj(n.y);
      }
      q = kernels::apply_rope_ref(split_heads(q, heads, d), cache.suffix_cos, cache.suffix_sin);
      cache.keys[i].narrow(2, p, s).copy_(
          kernels::apply_rope_ref(split_heads(k, kv_heads, d), cache.suffix_cos, cache.suffix_sin));
      cache.values[i].narrow(2, p, s).copy_(split_heads(v, kv_heads, d));
      const torch::Tensor o =
          attention_core(q, cache.keys[i], cache.values[i], cache.suffix_mask, options_.forward.attention);
      attn = a.o_proj(o.transpose(1, 2).reshape({batch, s, heads * d}));
    }
    const NormOutput n2 = layer.residual_pre_ffn_norm(n.h, attn, n.gate, cond, path);
    hs = n2.h + n2.gate * layer.mlp->forward(n2.y, /*recompute_gate_up=*/false, fz);
  }
  // Velocity head in the math dtype; the final adaRMS gate is discarded (spec §3).
  const torch::Tensor out = ex.final_norm(hs, cond, path).y.to(md);
  return model_.action_out_proj(out);
}

torch::Tensor Sampler::denoise(Cache& cache, const torch::Tensor& noise) {
  const float dt = -1.0f / static_cast<float>(options_.num_steps);
  torch::Tensor x = noise.to(math_dtype(compute_));
  for (size_t k = 0; k < times_.size(); ++k) x = x + dt * velocity(cache, x, static_cast<int64_t>(k));
  return x;
}

torch::Tensor Sampler::sample(const Pi05Batch& batch, const torch::Tensor& noise, SampleTiming* timing) {
  torch::NoGradGuard no_grad;
  const Pi05Config& cfg = model_.config();
  const auto device = model_.action_in_proj->weight.device();
  if (noise.dim() != 3 || noise.size(0) != batch.tokens.size(0) || noise.size(2) != cfg.action_dim || noise.size(1) < 1)
    throw std::invalid_argument("sample: noise must be [" + std::to_string(batch.tokens.size(0)) + ", H, " +
                                std::to_string(cfg.action_dim) + "], got " + c10::str(noise.sizes()));
  const torch::Tensor x0 = noise.to(device, math_dtype(compute_));
  const int64_t horizon = noise.size(1);
  const bool graphed = options_.cuda_graph && device.is_cuda() && !graph_failed_;
#ifdef VLATUNE_HAVE_CUDA
  if (graphed) {
    const c10::DeviceIndex index = device.index();
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, index);
    {
      at::cuda::CUDAEvent caller_done;
      caller_done.record(c10::cuda::getCurrentCUDAStream(index));
      caller_done.block(stream);
    }
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
    torch::Tensor result;
    {
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      Cache fresh;
      encode_prefix(batch, horizon, fresh, timing);
      const auto key = std::make_tuple(x0.size(0), fresh.prefix_len, horizon);
      auto it = graphs_.find(key);
      auto t0 = Clock::now();
      if (it != graphs_.end()) {
        Graph& g = *it->second;
        for (size_t i = 0; i < fresh.keys.size(); ++i) {
          g.cache.keys[i].narrow(2, 0, fresh.prefix_len).copy_(fresh.keys[i].narrow(2, 0, fresh.prefix_len));
          g.cache.values[i].narrow(2, 0, fresh.prefix_len).copy_(fresh.values[i].narrow(2, 0, fresh.prefix_len));
        }
        g.cache.suffix_mask.copy_(fresh.suffix_mask);
        g.cache.suffix_cos.copy_(fresh.suffix_cos);
        g.cache.suffix_sin.copy_(fresh.suffix_sin);
        g.x.copy_(x0);
        g.graph->replay();
        ++replays_;
        result = g.out.clone();
      } else {
        // Eagerly first (the result of this call), then capture the loop on the same shapes for the next ones.
        result = denoise(fresh, x0);
        auto g = std::make_unique<Graph>();
        g->cache = fresh;  // the prefix rows are already in these tensors; every replay rewrites them
        g->x = x0.clone();
        stream.synchronize();
        g->graph = std::make_unique<at::cuda::CUDAGraph>();
        try {
          g->graph->capture_begin();
          g->out = denoise(g->cache, g->x);
          g->graph->capture_end();
          graphs_.emplace(key, std::move(g));
          ++captures_;
          graph_status_ = "captured";
        } catch (const std::exception& e) {
          try {
            g->graph->capture_end();
          } catch (...) {
          }
          (void)cudaGetLastError();
          graph_failed_ = true;
          graph_status_ = std::string("capture failed, sampling eagerly: ") + e.what();
        }
      }
      if (timing != nullptr) {
        stream.synchronize();
        timing->suffix_ms = ms_since(t0);
      }
      at::cuda::CUDAEvent done;
      done.record(stream);
      done.block(caller);
    }
    return result;
  }
#endif
  (void)graphed;
  Cache cache;
  encode_prefix(batch, horizon, cache, timing);
  const auto t0 = Clock::now();
  torch::Tensor x = denoise(cache, x0);
  if (timing != nullptr) {
    synchronize(device);
    timing->suffix_ms = ms_since(t0);
  }
  return x;
}

torch::Tensor sample_actions_uncached(Pi05Impl& model, const Pi05Batch& batch, const torch::Tensor& noise,
                                      int64_t num_steps, const ForwardOptions& options) {
  torch::NoGradGuard no_grad;
  const auto compute = options.compute_dtype.value_or(model.action_in_proj->weight.scalar_type());
  const auto device = batch.tokens.device();
  const float dt = -1.0f / static_cast<float>(num_steps);
  torch::Tensor x = noise.to(device, math_dtype(compute));
  for (float t : euler_times(num_steps)) {
    Pi05Batch b = batch;
    b.actions = x;  // x_t = t * x + (1 - t) * x = x
    b.noise = x;
    b.time = torch::full({x.size(0)}, t, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    x = x + dt * model.forward(b, options).velocity;
  }
  return x;
}

}  // namespace vlatune::model
