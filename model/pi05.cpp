#include "model/pi05.h"

#include <optional>

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "formats/fqn_pattern.h"
#include "kernels/fused_ops.h"
#include "layout/pi05.h"
#include "model/recompute.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {

std::vector<torch::Tensor> concat(std::vector<torch::Tensor> a, const std::vector<torch::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

MultiModalProjectorImpl::MultiModalProjectorImpl(int64_t in, int64_t out, torch::TensorOptions options) {
  linear = register_module("linear", Linear(in, out, /*bias=*/true, options));
}

torch::Tensor MultiModalProjectorImpl::forward(const torch::Tensor& x) {
  profiler::Scope scope(fqn());
  return linear(x);
}

PaliGemmaModelImpl::PaliGemmaModelImpl(const Pi05Config& cfg, torch::TensorOptions options) {
  vision_tower = register_module("vision_tower", SiglipVisionTower(cfg.vision, options));
  multi_modal_projector =
      register_module("multi_modal_projector", MultiModalProjector(cfg.vision.width, cfg.backbone.width, options));
  language_model = register_module("language_model", GemmaModel(cfg.backbone, /*adaptive=*/false, 0, options));
}

PaliGemmaImpl::PaliGemmaImpl(const Pi05Config& cfg, torch::TensorOptions options) {
  model = register_module("model", PaliGemmaModel(cfg, options));
}

GemmaExpertImpl::GemmaExpertImpl(const Pi05Config& cfg, torch::TensorOptions options) {
  GemmaConfig expert = cfg.expert;
  expert.vocab = 0;  // the expert has no token embedding (openpi sets embed_tokens = None)
  model = register_module("model", GemmaModel(expert, /*adaptive=*/true, cfg.expert.width, options));
}

PaliGemmaWithExpertImpl::PaliGemmaWithExpertImpl(const Pi05Config& cfg, torch::TensorOptions options) {
  paligemma = register_module("paligemma", PaliGemma(cfg, options));
  gemma_expert = register_module("gemma_expert", GemmaExpert(cfg, options));
}

Pi05Impl::Pi05Impl(const Pi05Config& cfg, torch::Device device, torch::Dtype dtype) : cfg_(cfg) {
  cfg_.validate();
  auto options = torch::TensorOptions().device(device).dtype(dtype);
  const int64_t we = cfg.expert.width;
  paligemma_with_expert = register_module("paligemma_with_expert", PaliGemmaWithExpert(cfg, options));
  action_in_proj = register_module("action_in_proj", Linear(cfg.action_dim, we, true, options));
  action_out_proj = register_module("action_out_proj", Linear(we, cfg.action_dim, true, options));
  time_mlp_in = register_module("time_mlp_in", Linear(we, we, true, options));
  time_mlp_out = register_module("time_mlp_out", Linear(we, we, true, options));
  assign_fqns(*this);
  set_fqn("");  // the root has no FQN; its forward opens no scope
  set_recompute({});
}

// ModuleHolder's const operator-> yields const modules; ptr() hands out the shared (mutable) module.
SiglipVisionTowerImpl& Pi05Impl::vision_tower() const {
  return *paligemma_with_expert.ptr()->paligemma.ptr()->model.ptr()->vision_tower.ptr();
}
MultiModalProjectorImpl& Pi05Impl::projector() const {
  return *paligemma_with_expert.ptr()->paligemma.ptr()->model.ptr()->multi_modal_projector.ptr();
}
GemmaModelImpl& Pi05Impl::language_model() const {
  return *paligemma_with_expert.ptr()->paligemma.ptr()->model.ptr()->language_model.ptr();
}
GemmaModelImpl& Pi05Impl::expert_model() const {
  return *paligemma_with_expert.ptr()->gemma_expert.ptr()->model.ptr();
}

std::vector<std::string> Pi05Impl::recomputable_fqns() const {
  std::vector<std::string> out;
  for (const auto& unit : layout::recomputable_units(cfg_.vision.depth, cfg_.backbone.depth)) out.push_back(unit.fqn);
  return out;
}

void Pi05Impl::set_recompute(const std::vector<std::string>& fqns) {
  std::map<std::string, layout::RecomputableUnit> known;
  for (auto& unit : layout::recomputable_units(cfg_.vision.depth, cfg_.backbone.depth)) known.emplace(unit.fqn, unit);
  std::vector<const layout::RecomputableUnit*> chosen;
  for (const std::string& fqn : fqns) {
    auto it = known.find(fqn);
    if (it == known.end())
      throw std::invalid_argument("set_recompute: no recomputable module '" + fqn +
                                  "' (recomputable: the vision tower, its encoder layers 0.." +
                                  std::to_string(cfg_.vision.depth - 1) + ", decoder layers 0.." +
                                  std::to_string(cfg_.backbone.depth - 1) +
                                  " and their self_attn and mlp, the backbone's mlp." + layout::kGateUpLeaf +
                                  "; see Pi05Impl::recomputable_fqns())");
    for (const layout::RecomputableUnit* other : chosen) {
      const bool other_outer = layout::unit_contains(other->fqn, fqn);
      if (other_outer || layout::unit_contains(fqn, other->fqn))
        throw std::invalid_argument("set_recompute: nested selection: '" + (other_outer ? other->fqn : fqn) +
                                    "' contains '" + (other_outer ? fqn : other->fqn) + "'; select only one of them");
    }
    chosen.push_back(&it->second);
  }
  RecomputeSet set;
  const auto depth = static_cast<size_t>(cfg_.backbone.depth);
  set.vision_layer.assign(static_cast<size_t>(cfg_.vision.depth), false);
  set.joint_layer.assign(depth, false);
  set.joint_attention.assign(depth, false);
  set.prefix_mlp.assign(depth, false);
  set.expert_mlp.assign(depth, false);
  set.prefix_gate_up.assign(depth, false);
  const std::map<std::string, std::vector<bool>*> flags = {
      {"vit_layer", &set.vision_layer},    {"decoder_layer", &set.joint_layer},
      {"attention", &set.joint_attention}, {"backbone_mlp", &set.prefix_mlp},
      {"expert_mlp", &set.expert_mlp},     {"backbone_mlp_gate_up", &set.prefix_gate_up}};
  for (const layout::RecomputableUnit* unit : chosen) {
    if (unit->kind == "vision_tower")
      set.vision_tower = true;
    else
      (*flags.at(unit->kind))[static_cast<size_t>(unit->index)] = true;
  }
  recompute_ = std::move(set);
  recompute_fqns_ = fqns;
}

std::vector<std::vector<torch::Tensor>> Pi05Impl::merged_groups() const {
  std::vector<std::vector<torch::Tensor>> groups;
  for (auto& layer : vision_tower().vision_model->encoder->layers) {
    const SiglipAttentionImpl& a = *layer->self_attn;
    groups.push_back({a.q_proj->weight, a.k_proj->weight, a.v_proj->weight});
    groups.push_back({a.q_proj->bias, a.k_proj->bias, a.v_proj->bias});
  }
  for (GemmaModelImpl* model : {&language_model(), &expert_model()}) {
    for (auto& layer : model->layers) {
      const GemmaAttentionImpl& a = *layer->self_attn;
      groups.push_back({a.q_proj->weight, a.k_proj->weight, a.v_proj->weight});
      groups.push_back({layer->mlp->gate_proj->weight, layer->mlp->up_proj->weight});
    }
  }
  return groups;
}

int64_t Pi05Impl::pack_merged_weights() {
  int64_t packed = 0;
  for (const auto& group : merged_groups()) packed += pack_rows(group) ? 1 : 0;
  return packed;
}

bool Pi05Impl::merged_weights_packed() const {
  for (const auto& group : merged_groups())
    if (!kernels::packed_rows(group).defined()) return false;
  return true;
}

void Pi05Impl::fill_missing_grads() {
  torch::NoGradGuard no_grad;
  for (auto& p : parameters()) {
    if (p.requires_grad() && !p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}

torch::Tensor time_embedding(const torch::Tensor& t, int64_t dim, double min_period, double max_period) {
  const int64_t half = dim / 2;
  auto options = torch::TensorOptions().dtype(t.scalar_type()).device(t.device());
  auto fraction = torch::linspace(0.0, 1.0, half, options);
  auto period = torch::pow(max_period / min_period, fraction) * min_period;
  auto angles = t.unsqueeze(1) * (2.0 * M_PI / period).unsqueeze(0);
  return at::cat({angles.sin(), angles.cos()}, 1);
}

Pi05Batch apply_input_shortcuts(const Pi05Batch& batch, const ForwardOptions& options) {
  Pi05Batch out = batch;
  if (options.prune_slots && batch.image_masks.defined() && batch.image_masks.size(1) > 0) {
    const int64_t slots = batch.image_masks.size(1);
    std::vector<bool> used;
    if (batch.used_slots) {
      used = *batch.used_slots;
      if (static_cast<int64_t>(used.size()) != slots)
        throw std::invalid_argument("Pi05: the batch's used_slots names " + std::to_string(used.size()) +
                                    " slots, its image_masks have " + std::to_string(slots));
    } else {
      const torch::Tensor any = batch.image_masks.any(0).to(torch::kCPU);
      for (int64_t s = 0; s < slots; ++s) used.push_back(any[s].item<bool>());
    }
    std::vector<int64_t> kept;
    for (int64_t s = 0; s < slots; ++s)
      if (used[static_cast<size_t>(s)]) kept.push_back(s);
    if (static_cast<int64_t>(kept.size()) < slots) {
      const int64_t n = static_cast<int64_t>(kept.size());
      if (n > 0 && kept.back() == n - 1) {  // the first n slots: a view, nothing copied to the device
        out.images = batch.images.narrow(1, 0, n);
        out.image_masks = batch.image_masks.narrow(1, 0, n);
      } else {
        // From pinned memory, so the copy is queued without waiting for the device.
        torch::Tensor index = torch::tensor(kept, torch::TensorOptions().dtype(torch::kLong));
        if (batch.images.is_cuda()) index = index.pin_memory();
        index = index.to(batch.images.device(), /*non_blocking=*/true);
        out.images = batch.images.index_select(1, index);
        out.image_masks = batch.image_masks.index_select(1, index);
      }
    }
    out.used_slots = std::vector<bool>(kept.size(), true);
  }
  if (options.trim_text && batch.tokens.defined() && batch.tokens.size(1) > 0) {
    int64_t last = 0;  // last true index + 1
    if (batch.text_used) {
      last = *batch.text_used;
      if (last < 0 || last > batch.tokens.size(1))
        throw std::invalid_argument("Pi05: the batch's text_used " + std::to_string(last) + " is outside [0, " +
                                    std::to_string(batch.tokens.size(1)) + "]");
    } else {
      const torch::Tensor any = batch.token_masks.any(0).to(torch::kCPU);
      const auto* flags = any.data_ptr<bool>();
      for (int64_t j = any.size(0); j > 0; --j)
        if (flags[j - 1]) {
          last = j;
          break;
        }
    }
    const int64_t multiple = std::max<int64_t>(1, options.trim_multiple);
    int64_t keep = std::min<int64_t>(batch.tokens.size(1), (last + multiple - 1) / multiple * multiple);
    keep = std::max<int64_t>(keep, 1);
    if (keep < batch.tokens.size(1)) {
      out.tokens = batch.tokens.narrow(1, 0, keep);
      out.token_masks = batch.token_masks.narrow(1, 0, keep);
    }
    out.text_used = last;
  }
  return out;
}

Pi05Impl::Output Pi05Impl::forward(const Pi05Batch& batch, const ForwardOptions& options) {
  const auto device = batch.tokens.device();
  const auto compute = options.compute_dtype.value_or(action_in_proj->weight.scalar_type());
  const auto md = math_dtype(compute);
  const int64_t b = batch.tokens.size(0);
  if (options.loss_action_dim < 1 || options.loss_action_dim > cfg_.action_dim)
    throw std::invalid_argument("Pi05: loss_action_dim must be in [1, " + std::to_string(cfg_.action_dim) + "], got " +
                                std::to_string(options.loss_action_dim));

  // Work on the batch itself (shortcuts, prefix assembly, flow-matching mix, time embedding, mask, positions, RoPE
  // tables) is attributed to the pseudo-module "<inputs>"; modules called in between keep their own scopes.
  static const std::string inputs_scope_name = profiler::kInputsScope;
  std::optional<profiler::Scope> inputs_scope(std::in_place, inputs_scope_name);

  // 1. Exact shortcuts, decided on the host (the forward's only host syncs where the batch carries no summary).
  const Pi05Batch shortcut = apply_input_shortcuts(batch, options);
  const torch::Tensor &images = shortcut.images, &image_masks = shortcut.image_masks;
  const torch::Tensor &tokens = shortcut.tokens, &token_masks = shortcut.token_masks;

  inputs_scope.reset();

  // The fused kernels and merged GEMMs (kernels/fused_ops.h): by default on CUDA only; the CPU stays exact.
  const bool fused = options.kernels == Kernels::kFused || (options.kernels == Kernels::kAuto && device.is_cuda());

  // 2. Prefix: [images of kept slots..., text].
  GemmaModelImpl& lm = language_model();
  GemmaModelImpl& ex = expert_model();
  std::vector<torch::Tensor> prefix_parts, prefix_valid;
  const int64_t slots = images.size(1);
  if (slots > 0) {
    const int64_t side = images.size(-1), per_image = cfg_.vision.tokens_per_image();
    auto pixels = images.reshape({b * slots, 3, side, side});
    SiglipVisionTowerImpl& tower = vision_tower();
    torch::Tensor features;
    if (recompute_.vision_tower) {
      SiglipVisionTowerImpl* t = &tower;
      const Attention mode = options.attention;
      const kernels::AttentionBackend backend = options.attention_backend;
      features = recompute(
          [t, compute, mode, fused, backend](const std::vector<torch::Tensor>& in) {
            return std::vector<torch::Tensor>{t->forward(in[0], compute, mode, {}, fused, backend)};
          },
          {pixels}, tower.parameters())[0];
    } else {
      features =
          tower.forward(pixels, compute, options.attention, recompute_.vision_layer, fused, options.attention_backend);
    }
    auto projected = projector().forward(features);  // image tokens are not rescaled
    inputs_scope.emplace(inputs_scope_name);
    prefix_parts.push_back(projected.reshape({b, slots * per_image, projected.size(-1)}));
    prefix_valid.push_back(image_masks.unsqueeze(-1).expand({b, slots, per_image}).reshape({b, slots * per_image}));
    inputs_scope.reset();
  }
  {
    const double scale = std::sqrt(static_cast<double>(cfg_.backbone.width));
    torch::Tensor embedded = lm.embed_tokens(tokens);
    inputs_scope.emplace(inputs_scope_name);
    prefix_parts.push_back((embedded.to(md) * scale).to(compute));
    prefix_valid.push_back(token_masks);
  }
  torch::Tensor hp = at::cat(prefix_parts, 1);
  torch::Tensor pmask = at::cat(prefix_valid, 1);

  // 3. Suffix and time condition (flow matching, spec §7.1: x_t = t*noise + (1-t)*actions, u = noise - actions).
  auto t = batch.time.to(md).view({b, 1, 1});
  auto noise = batch.noise.to(md), actions = batch.actions.to(md);
  auto x_t = t * noise + (1.0 - t) * actions;
  auto target = noise - actions;
  auto x_t_compute = x_t.to(compute);
  inputs_scope.reset();
  torch::Tensor hs = action_in_proj(x_t_compute);
  inputs_scope.emplace(inputs_scope_name);
  auto temb = time_embedding(batch.time.to(md), cfg_.expert.width).to(compute);
  inputs_scope.reset();
  JointInputs joint;
  joint.fused = fused;
  {
    torch::Tensor h = time_mlp_in(temb);
    inputs_scope.emplace(inputs_scope_name);
    h = torch::silu(h);
    inputs_scope.reset();
    h = time_mlp_out(h);
    inputs_scope.emplace(inputs_scope_name);
    joint.cond = torch::silu(h);
    inputs_scope.reset();
  }
  joint.attention = options.attention;

  // 4. Mask and positions over N = P + S: i attends j iff block(j) <= block(i) and valid(j) (prefix block 0,
  // suffix block 1), or i == j (keeps fully padded query rows finite; exact for valid rows).
  const int64_t p = hp.size(1), s = hs.size(1), n = p + s;
  inputs_scope.emplace(inputs_scope_name);
  auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto valid = at::cat({pmask, torch::ones({b, s}, torch::TensorOptions().dtype(torch::kBool).device(device))}, 1);
  auto block = at::cat({torch::zeros({p}, long_opts), torch::ones({s}, long_opts)});
  auto allowed = block.unsqueeze(0) <= block.unsqueeze(1);  // [query, key]
  auto eye = torch::eye(n, torch::TensorOptions().dtype(torch::kBool).device(device));
  joint.mask = ((allowed.unsqueeze(0) & valid.unsqueeze(1)) | eye).unsqueeze(1);
  if (options.skip_padded_rows) {
    // From the batch's summary where its maker knows the counts (no host sync); pruned slots and trimmed text
    // columns hold no valid entry, so the counts are the shortcut batch's too.
    std::optional<int64_t> valid_count;
    if (shortcut.valid_images && shortcut.valid_tokens) {
      auto check = [](const char* name, int64_t value, int64_t most) {
        if (value < 0 || value > most)
          throw std::invalid_argument(std::string("Pi05: the batch's ") + name + " " + std::to_string(value) +
                                      " is outside [0, " + std::to_string(most) + "]");
      };
      check("valid_images", *shortcut.valid_images, b * slots);
      check("valid_tokens", *shortcut.valid_tokens, tokens.numel());
      valid_count = (slots > 0 ? *shortcut.valid_images * cfg_.vision.tokens_per_image() : 0) + *shortcut.valid_tokens;
    }
    LivePrefixRows live = live_prefix_rows(pmask, options.live_row_multiple, valid_count);
    joint.live_rows = live.rows;
    joint.live_slots = live.slots;
    joint.prefix_len = p;
  }
  auto positions = valid.to(torch::kLong).cumsum(1) - 1;
  std::tie(joint.cos, joint.sin) = rope_tables(positions, cfg_.backbone.head_dim, md);
  if (joint.fused && joint.attention == Attention::kLean &&
      kernels::varlen_attention_supported(hs, cfg_.backbone.head_dim, options.attention_backend)) {
    const auto& bb = cfg_.backbone;
    const kernels::JointAttentionShape shape{
        b, p, s, bb.heads, bb.kv_heads, bb.head_dim, 1.0 / std::sqrt(static_cast<double>(bb.head_dim))};
    const kernels::VarlenBackend backend = kernels::choose_varlen_backend(hs, shape, options.attention_backend);
    joint.varlen_joint =
        std::make_shared<const kernels::VarlenLayout>(kernels::joint_varlen_layout(valid, p, true, backend));
    if (options.skip_dead)
      joint.varlen_suffix =
          std::make_shared<const kernels::VarlenLayout>(kernels::suffix_queries_layout(*joint.varlen_joint, valid));
  }
  // With live rows the prefix stream is [R, Wp] from here on (JointInputs::live_rows).
  const bool live = joint.live_rows.defined();
  if (live) hp = kernels::gather_rows(hp, joint.live_rows, joint.live_slots);
  inputs_scope.reset();

  // 5. Joint layers. prefix_states are shown at every position, zero on the rows the stream leaves out.
  Output out;
  auto prefix_state = [&](const torch::Tensor& h) {
    return live ? kernels::spread_rows(h, joint.live_rows, joint.live_slots, {b, p, h.size(-1)}) : h;
  };
  const auto depth = static_cast<size_t>(cfg_.backbone.depth);
  for (size_t i = 0; i < depth; ++i) {
    if (options.keep_prefix_states) out.prefix_states.push_back(prefix_state(hp));
    JointLayerOptions layer_options;
    layer_options.skip_prefix = options.skip_dead && i + 1 == depth;
    GemmaDecoderLayerImpl* lp = lm.layers[i].get();
    GemmaDecoderLayerImpl* le = ex.layers[i].get();
    std::vector<torch::Tensor> result;
    if (recompute_.joint_layer[i]) {
      std::vector<torch::Tensor> inputs{hp, hs, joint.cond, joint.cos, joint.sin, joint.mask};
      result = recompute(
          [lp, le, layer_options, shared = joint](const std::vector<torch::Tensor>& in) {
            JointInputs j = shared;  // the tensors the recompute re-reads come from its inputs
            j.cond = in[2];
            j.cos = in[3];
            j.sin = in[4];
            j.mask = in[5];
            return joint_layer(*lp, *le, in[0], in[1], j, layer_options);
          },
          inputs, concat(lp->parameters(), le->parameters()));
    } else {
      layer_options.recompute_attention = recompute_.joint_attention[i];
      layer_options.recompute_prefix_mlp = recompute_.prefix_mlp[i];
      layer_options.recompute_expert_mlp = recompute_.expert_mlp[i];
      layer_options.recompute_prefix_gate_up = recompute_.prefix_gate_up[i];
      result = joint_layer(*lp, *le, hp, hs, joint, layer_options);
    }
    hs = result.back();
    if (!layer_options.skip_prefix) hp = result[0];
  }
  if (!options.skip_dead) {
    if (options.keep_prefix_states) out.prefix_states.push_back(prefix_state(hp));
    lm.final_norm(hp, torch::Tensor());  // computed but unused, as in openpi (skip_dead drops it)
  }

  // 6. Velocity head in fp32 (the final adaRMS gate is discarded) and the loss.
  auto suffix_out =
      ex.final_norm(hs, joint.cond, joint.fused ? kernels::OpPath::kFused : kernels::OpPath::kReference).y.to(md);
  out.velocity = action_out_proj(suffix_out);
  {
    static const std::string loss_scope_name = profiler::kLossScope;
    profiler::Scope loss_scope(loss_scope_name);
    auto diff = (out.velocity - target).narrow(-1, 0, options.loss_action_dim);
    out.loss = diff.pow(2).mean();
  }
  return out;
}

void init_weights(Pi05Impl& model, uint64_t seed) {
  auto params = model.named_parameters(/*recurse=*/true);
  if (params.is_empty()) return;
  const auto device = params.begin()->value().device();
  if (device.is_meta()) return;
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  auto has = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  torch::NoGradGuard no_grad;
  for (auto& item : params) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    auto lecun = [&](int64_t fan_in) { p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(fan_in)), gen); };
    if (has(name, "vision_tower")) {
      if (ends_with(name, "patch_embedding.weight")) {
        lecun(p.size(1) * p.size(2) * p.size(3));
      } else if (ends_with(name, "position_embedding.weight")) {
        p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))), gen);
      } else if (has(name, "layer_norm") || has(name, "post_layernorm")) {
        ends_with(name, ".weight") ? p.fill_(1.0) : p.zero_();
      } else if (ends_with(name, ".weight")) {
        const double bound = std::sqrt(6.0 / static_cast<double>(p.size(0) + p.size(1)));
        p.uniform_(-bound, bound, gen);
      } else if (has(name, "mlp.fc")) {
        p.normal_(0.0, 1e-6, gen);
      } else {
        p.zero_();
      }
    } else if (ends_with(name, "embed_tokens.weight")) {
      p.normal_(0.0, 0.01, gen);
    } else if (ends_with(name, "layernorm.weight") || ends_with(name, "norm.weight")) {
      p.zero_();  // RMS scale (1 + w): 0 = identity
    } else if (ends_with(name, ".weight")) {
      lecun(p.size(1));
    } else {
      p.zero_();
    }
  }
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) total += p.numel();
  return total;
}

void Pi05Impl::set_fp8(const std::vector<std::string>& fqns, const Fp8Config& config) {
  std::map<std::string, LinearImpl*> linears;
  std::vector<std::string> order;
  for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto* l = dynamic_cast<LinearImpl*>(item.value().get())) {
      linears.emplace(item.key(), l);
      order.push_back(item.key());
    }
  }
  std::set<std::string> chosen;
  for (const std::string& fqn : fqns) {
    auto it = linears.find(fqn);
    if (it == linears.end())
      throw std::invalid_argument("set_fp8: '" + fqn +
                                  "' is not a Linear module of the model (FP8 applies to Linears)");
    // Merged GEMMs: a choice for one member covers its siblings.
    const std::vector<std::string> members = layout::merged_gemm_members(fqn);
    for (const std::string& member : members) {
      const LinearImpl& l = *linears.at(member);
      const std::string problem = float8_shape_problem(l.weight.size(1), l.weight.size(0));
      if (!problem.empty()) throw std::invalid_argument("set_fp8: '" + member + "': " + problem);
      if (l.has_lora())
        throw std::invalid_argument("set_fp8: '" + member +
                                    "' has a LoRA adapter: FP8 Linears with adapters are not supported (keep it bf16)");
      chosen.insert(member);
    }
  }
  for (const auto& [fqn, l] : linears) {
    l->fp8 = chosen.count(fqn) != 0 ? std::make_shared<Float8State>() : nullptr;
    if (l->fp8) l->fp8->config = config;
  }
  fp8_fqns_.clear();
  for (const std::string& fqn : order)
    if (chosen.count(fqn) != 0) fp8_fqns_.push_back(fqn);
}

std::vector<std::string> Pi05Impl::fp8_selection() const {
  return fp8_fqns_;
}

}  // namespace vlatune::model
