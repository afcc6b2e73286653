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
#include "model/merged_gemm.h"
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

// The training forward's merged GEMM (FP8 and LoRA adapters included), named for the profiler's GEMM inventory as
// the training forward names it.
torch::Tensor merged(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members) {
  if (profiler::scopes_enabled()) {
    std::vector<const std::string*> names;
    int64_t n = 0;
    for (const LinearImpl* l : members) {
      names.push_back(&l->fqn());
      n += l->weight.size(0);
    }
    profiler::note_gemm(names, x.numel() / x.size(-1), x.size(-1), n);
  }
  return merged_gemm(x, members);
}

// [B, T, heads * D] (any strides with a unit last stride) -> [B, heads, T, D].
torch::Tensor split_heads(const torch::Tensor& y, int64_t heads, int64_t d) {
  return y.view({y.size(0), y.size(1), heads, d}).transpose(1, 2);
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
  // Replayed in this order; captured in it from one memory pool (each reads what the previous one left).
  std::unique_ptr<at::cuda::CUDAGraph> vision;  // null without camera slots
  std::unique_ptr<at::cuda::CUDAGraph> prefix, denoise;
#endif
  Pi05Batch in;                // the static inputs: images, image_masks, tokens, token_masks
  torch::Tensor image_tokens;  // vision's output, the prefix's input
  Cache cache;
  torch::Tensor x, out;   // the loop's input noise and output actions
  int64_t last_used = 0;  // the sampler's call count at its last replay or capture
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
  GemmaModelImpl& ex = model_.expert_model();
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
    const torch::Tensor cond = torch::silu(h);
    scope.reset();
    // Every adaRMS modulation of the step, in the order velocity() reads them.
    std::vector<torch::Tensor> step;
    for (auto& layer : ex.layers) {
      step.push_back(layer->input_ada->modulation(cond, temb));
      step.push_back(layer->post_attention_ada->modulation(cond, temb));
    }
    step.push_back(ex.norm_ada->modulation(cond, temb));
    c.modulations.push_back(std::move(step));
  }
  return conditioning_.emplace(batch, std::move(c)).first->second;
}

Sampler::Prepared Sampler::prepare(const Pi05Batch& raw) const {
  std::optional<profiler::Scope> inputs(std::in_place, inputs_scope_name());
  ForwardOptions shortcuts = options_.forward;
  // A single prompt is trimmed to its length exactly (no padding key, so no mask; one graph per prompt length).
  if (raw.tokens.size(0) == 1) shortcuts.trim_multiple = 1;
  Prepared p{apply_input_shortcuts(raw, shortcuts), true};
  const Pi05Batch& b = p.batch;
  torch::Tensor all_valid = b.token_masks.all();
  if (b.images.size(1) > 0) all_valid = all_valid.logical_and(b.image_masks.all());
  p.masked = !all_valid.item<bool>();
  return p;
}

torch::Tensor Sampler::vision(const Pi05Batch& b) {
  const Pi05Config& cfg = model_.config();
  const int64_t batch = b.tokens.size(0), slots = b.images.size(1);
  if (slots == 0) return torch::Tensor();
  const int64_t side = b.images.size(-1), per_image = cfg.vision.tokens_per_image();
  auto features = model_.vision_tower().forward(b.images.reshape({batch * slots, 3, side, side}), compute_,
                                                options_.forward.attention, {}, fused(b.tokens),
                                                options_.forward.attention_backend);
  auto projected = model_.projector().forward(features);
  profiler::Scope inputs(inputs_scope_name());
  return projected.reshape({batch, slots * per_image, projected.size(-1)});
}

kernels::QkvHeads Sampler::project_qkv(GemmaAttentionImpl& a, const torch::Tensor& y, bool with_q,
                                       const torch::Tensor& cos, const torch::Tensor& sin, bool suffix) const {
  const Pi05Config& cfg = model_.config();
  const int64_t heads = cfg.backbone.heads, kv_heads = cfg.backbone.kv_heads, d = cfg.backbone.head_dim;
  if (fused(y)) {
    // One merged GEMM and one pass that splits the heads and rotates q and k (the training forward's kernels):
    // the rows are passed as rope_qkv's prefix or suffix side, the other side empty.
    const torch::Tensor qkv = with_q ? merged(y, {a.q_proj.get(), a.k_proj.get(), a.v_proj.get()})
                                     : merged(y, {a.k_proj.get(), a.v_proj.get()});
    const int64_t cols = (heads + 2 * kv_heads) * d;
    if (suffix)
      return kernels::rope_qkv(qkv.new_empty({qkv.size(0), 0, 2 * kv_heads * d}), qkv, cos, sin, heads, kv_heads,
                               /*prefix_q=*/false);
    return kernels::rope_qkv(qkv, qkv.new_empty({qkv.size(0), 0, cols}), cos, sin, heads, kv_heads, with_q);
  }
  kernels::QkvHeads out;
  if (with_q) out.q = kernels::apply_rope_ref(split_heads(a.q_proj(y), heads, d), cos, sin);
  out.k = kernels::apply_rope_ref(split_heads(a.k_proj(y), kv_heads, d), cos, sin);
  out.v = split_heads(a.v_proj(y), kv_heads, d);
  return out;
}

void Sampler::encode_prefix(const Pi05Batch& b, const torch::Tensor& image_tokens, bool masked, int64_t horizon,
                            Cache& cache) {
  const Pi05Config& cfg = model_.config();
  const auto md = math_dtype(compute_);
  const auto device = b.tokens.device();
  const bool fz = fused(b.tokens);
  const kernels::OpPath path = fz ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  const int64_t batch = b.tokens.size(0);
  const Attention attention = options_.forward.attention;
  const int64_t slots = b.images.size(1), per_image = cfg.vision.tokens_per_image();

  // Prefix embeddings as in Pi05Impl::forward: [image tokens of the kept slots..., text * sqrt(width)].
  std::vector<torch::Tensor> parts, valid_parts;
  if (slots > 0) parts.push_back(image_tokens);
  GemmaModelImpl& lm = model_.language_model();
  torch::Tensor embedded = lm.embed_tokens(b.tokens);
  std::optional<profiler::Scope> inputs(std::in_place, inputs_scope_name());
  parts.push_back((embedded.to(md) * std::sqrt(static_cast<double>(cfg.backbone.width))).to(compute_));
  if (slots > 0)
    valid_parts.push_back(
        b.image_masks.unsqueeze(-1).expand({batch, slots, per_image}).reshape({batch, slots * per_image}));
  valid_parts.push_back(b.token_masks);
  torch::Tensor hp = at::cat(parts, 1);
  const torch::Tensor valid = at::cat(valid_parts, 1);
  const int64_t p = hp.size(1);
  const int64_t heads = cfg.backbone.heads, kv_heads = cfg.backbone.kv_heads, d = cfg.backbone.head_dim;
  // Prefix: bidirectional over valid keys (a padded query row sees itself only: finite, never read). Suffix rows:
  // every valid prefix key and every suffix key; positions continue after the valid prefix (spec §6.3). With every
  // prefix position valid there is nothing to mask, and the attention runs without a mask.
  const auto [cos, sin] = rope_tables(valid.to(torch::kLong).cumsum(1) - 1, d, md);
  const auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(device);
  torch::Tensor mask;
  if (masked) mask = (valid.unsqueeze(1) | torch::eye(p, bool_opts)).unsqueeze(1);
  const auto suffix_pos = valid.to(torch::kLong).sum(1, /*keepdim=*/true) +
                          torch::arange(horizon, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto [suffix_cos, suffix_sin] = rope_tables(suffix_pos, d, md);
  cache.suffix_cos = suffix_cos;
  cache.suffix_sin = suffix_sin;
  cache.suffix_mask = masked ? at::cat({valid.view({batch, 1, 1, p}).expand({batch, 1, horizon, p}),
                                        torch::ones({batch, 1, horizon, horizon}, bool_opts)},
                                       -1)
                             : torch::Tensor();
  const auto depth = static_cast<size_t>(cfg.backbone.depth);
  const auto opts = torch::TensorOptions().dtype(compute_).device(device);
  cache.keys.assign(depth, torch::Tensor());
  cache.values.assign(depth, torch::Tensor());
  for (size_t i = 0; i < depth; ++i) {
    cache.keys[i] = torch::empty({batch, kv_heads, p + horizon, d}, opts);
    cache.values[i] = torch::empty({batch, kv_heads, p + horizon, d}, opts);
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
      const kernels::QkvHeads qkv = project_qkv(a, n.y, /*with_q=*/!last, cos, sin, /*suffix=*/false);
      cache.keys[i].narrow(2, 0, p).copy_(qkv.k);
      cache.values[i].narrow(2, 0, p).copy_(qkv.v);
      if (last) break;
      attn =
          a.o_proj(attention_core(qkv.q, qkv.k, qkv.v, mask, attention).transpose(1, 2).reshape({batch, p, heads * d}));
    }
    const NormOutput n2 = layer.residual_pre_ffn_norm(n.h, attn, torch::Tensor(), torch::Tensor(), path);
    hp = n2.h + layer.mlp->forward(n2.y, /*recompute_gate_up=*/false, fz);
  }
}

torch::Tensor Sampler::velocity(Cache& cache, const torch::Tensor& x, int64_t step) {
  const Pi05Config& cfg = model_.config();
  const auto md = math_dtype(compute_);
  const bool fz = fused(x);
  const kernels::OpPath path = fz ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  const int64_t batch = x.size(0), s = x.size(1), p = cache.prefix_len;
  const int64_t heads = cfg.backbone.heads, d = cfg.backbone.head_dim;
  const std::vector<torch::Tensor>& mod = conditioning(batch).modulations[static_cast<size_t>(step)];
  GemmaModelImpl& ex = model_.expert_model();

  // The residual stream is carried as (h, delta, gate): each adaRMS adds the previous block's gated output
  // (h + gate * delta) in its own pass, as the training forward's fused path does.
  torch::Tensor hs = model_.action_in_proj(x.to(compute_)), delta, gate;
  for (size_t i = 0; i < ex.layers.size(); ++i) {
    GemmaDecoderLayerImpl& layer = *ex.layers[i];
    GemmaAttentionImpl& a = *layer.self_attn;
    profiler::Scope layer_scope(layer.fqn());
    const auto n = layer.input_ada->forward_modulated(hs, mod[2 * i], delta, gate, path);
    torch::Tensor attn;
    {
      profiler::Scope attn_scope(a.fqn());
      const kernels::QkvHeads qkv =
          project_qkv(a, n.y, /*with_q=*/true, cache.suffix_cos, cache.suffix_sin, /*suffix=*/true);
      cache.keys[i].narrow(2, p, s).copy_(qkv.k);
      cache.values[i].narrow(2, p, s).copy_(qkv.v);
      const torch::Tensor o =
          attention_core(qkv.q, cache.keys[i], cache.values[i], cache.suffix_mask, options_.forward.attention);
      attn = a.o_proj(o.transpose(1, 2).reshape({batch, s, heads * d}));
    }
    const auto n2 = layer.post_attention_ada->forward_modulated(n.h, mod[2 * i + 1], attn, n.gate, path);
    hs = n2.h;
    delta = layer.mlp->forward(n2.y, /*recompute_gate_up=*/false, fz);
    gate = n2.gate;
  }
  // Velocity head in the math dtype; the final adaRMS gate is discarded (spec §3).
  const torch::Tensor out = ex.norm_ada->forward_modulated(hs, mod.back(), delta, gate, path).y.to(md);
  return model_.action_out_proj(out);
}

torch::Tensor Sampler::denoise(Cache& cache, const torch::Tensor& noise) {
  const float dt = -1.0f / static_cast<float>(options_.num_steps);
  torch::Tensor x = noise.to(math_dtype(compute_));
  for (size_t k = 0; k < times_.size(); ++k) x = x + dt * velocity(cache, x, static_cast<int64_t>(k));
  return x;
}

torch::Tensor Sampler::sample(const Pi05Batch& raw, const torch::Tensor& noise, SampleTiming* timing) {
  torch::NoGradGuard no_grad;
  const Pi05Config& cfg = model_.config();
  const auto device = model_.action_in_proj->weight.device();
  if (noise.dim() != 3 || noise.size(0) != raw.tokens.size(0) || noise.size(2) != cfg.action_dim || noise.size(1) < 1)
    throw std::invalid_argument("sample: noise must be [" + std::to_string(raw.tokens.size(0)) + ", H, " +
                                std::to_string(cfg.action_dim) + "], got " + c10::str(noise.sizes()));
  const torch::Tensor x0 = noise.to(device, math_dtype(compute_));
  const int64_t horizon = noise.size(1);
  const bool graphed = options_.cuda_graph && device.is_cuda() && !graph_failed_;
  auto t0 = Clock::now();
  const Prepared prepared = prepare(raw);
  const Pi05Batch& b = prepared.batch;
#ifdef VLATUNE_HAVE_CUDA
  if (graphed) {
    const c10::DeviceIndex index = device.index();
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, index);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
    {
      at::cuda::CUDAEvent caller_done;
      caller_done.record(caller);
      caller_done.block(stream);
    }
    torch::Tensor result;
    {
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      const GraphKey key{b.tokens.size(0), b.images.size(1), b.images.size(-1),
                         b.tokens.size(1), horizon,          prepared.masked};
      auto it = graphs_.find(key);
      if (it != graphs_.end()) {
        Graph& g = *it->second;
        for (auto [slot, value] : {std::pair{&g.in.images, &b.images}, std::pair{&g.in.image_masks, &b.image_masks},
                                   std::pair{&g.in.tokens, &b.tokens}, std::pair{&g.in.token_masks, &b.token_masks}})
          if (slot->defined() && slot->numel() > 0) slot->copy_(*value);
        g.x.copy_(x0);
        // Timing events between the replays: the phase split without host syncs inside the chunk.
        at::cuda::CUDAEvent marks[4] = {at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault),
                                        at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault)};
        if (timing != nullptr) marks[0].record(stream);
        if (g.vision) g.vision->replay();
        if (timing != nullptr) marks[1].record(stream);
        g.prefix->replay();
        if (timing != nullptr) marks[2].record(stream);
        g.denoise->replay();
        if (timing != nullptr) marks[3].record(stream);
        ++replays_;
        g.last_used = ++calls_;
        result = g.out.clone();
        if (timing != nullptr) {
          stream.synchronize();
          timing->vision_ms = marks[0].elapsed_time(marks[1]);
          timing->prefix_ms = marks[1].elapsed_time(marks[2]);
          timing->suffix_ms = marks[2].elapsed_time(marks[3]);
        }
      } else {
        // Eagerly first (the result of this call; lazy set-up such as cuBLAS handles and cuDNN plans happens
        // here), then capture the three phases on the same shapes for the next calls.
        result = run_eager(prepared, x0, timing, t0);
        capture(key, prepared, x0);
      }
      at::cuda::CUDAEvent done;
      done.record(stream);
      done.block(caller);
    }
    return result;
  }
#endif
  (void)graphed;
  return run_eager(prepared, x0, timing, t0);
}

torch::Tensor Sampler::run_eager(const Prepared& prepared, const torch::Tensor& x0, SampleTiming* timing,
                                 std::chrono::steady_clock::time_point t0) {
  const auto device = x0.device();
  const torch::Tensor image_tokens = vision(prepared.batch);
  if (timing != nullptr) {
    synchronize(device);
    timing->vision_ms = ms_since(t0);
    t0 = Clock::now();
  }
  Cache cache;
  encode_prefix(prepared.batch, image_tokens, prepared.masked, x0.size(1), cache);
  if (timing != nullptr) {
    synchronize(device);
    timing->prefix_ms = ms_since(t0);
    t0 = Clock::now();
  }
  torch::Tensor x = denoise(cache, x0);
  if (timing != nullptr) {
    synchronize(device);
    timing->suffix_ms = ms_since(t0);
  }
  return x;
}

#ifdef VLATUNE_HAVE_CUDA
void Sampler::capture(const GraphKey& key, const Prepared& prepared, const torch::Tensor& x0) {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(x0.device().index());
  auto g = std::make_unique<Graph>();
  const Pi05Batch& b = prepared.batch;
  g->in.images = b.images.clone();
  g->in.image_masks = b.image_masks.clone();
  g->in.tokens = b.tokens.clone();
  g->in.token_masks = b.token_masks.clone();
  g->x = x0.clone();
  stream.synchronize();
  const auto pool = at::cuda::graph_pool_handle();
  std::unique_ptr<at::cuda::CUDAGraph>* open = nullptr;
  try {
    if (b.images.size(1) > 0) {
      g->vision = std::make_unique<at::cuda::CUDAGraph>();
      open = &g->vision;
      g->vision->capture_begin(pool);
      g->image_tokens = vision(g->in);
      g->vision->capture_end();
    }
    g->prefix = std::make_unique<at::cuda::CUDAGraph>();
    open = &g->prefix;
    g->prefix->capture_begin(pool);
    encode_prefix(g->in, g->image_tokens, prepared.masked, g->x.size(1), g->cache);
    g->prefix->capture_end();
    g->denoise = std::make_unique<at::cuda::CUDAGraph>();
    open = &g->denoise;
    g->denoise->capture_begin(pool);
    g->out = denoise(g->cache, g->x);
    g->denoise->capture_end();
    // Each shape's graphs hold their own activations: keep the most recently used kGraphsKept.
    if (graphs_.size() >= kGraphsKept) {
      auto oldest = graphs_.begin();
      for (auto i = graphs_.begin(); i != graphs_.end(); ++i)
        if (i->second->last_used < oldest->second->last_used) oldest = i;
      graphs_.erase(oldest);
    }
    g->last_used = ++calls_;
    graphs_.emplace(key, std::move(g));
    ++captures_;
    graph_status_ = "captured";
  } catch (const std::exception& e) {
    try {
      if (open != nullptr && *open) (*open)->capture_end();
    } catch (...) {
    }
    (void)cudaGetLastError();
    graph_failed_ = true;
    graph_status_ = std::string("capture failed, sampling eagerly: ") + e.what();
  }
}
#endif

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
