#include "model/config.h"

#include <stdexcept>

namespace vlatune::model {

Pi05Config Pi05Config::full() {
  Pi05Config cfg;
  cfg.vision = {/*width=*/1152, /*depth=*/27, /*mlp=*/4304, /*heads=*/16, /*patch=*/14, /*image=*/224};
  cfg.backbone = {/*width=*/2048,  /*depth=*/18, /*mlp=*/16384, /*heads=*/8, /*kv_heads=*/1, /*head_dim=*/256,
                  /*vocab=*/257152};
  cfg.expert = {/*width=*/1024, /*depth=*/18, /*mlp=*/4096, /*heads=*/8, /*kv_heads=*/1, /*head_dim=*/256,
                /*vocab=*/0};
  cfg.action_dim = 32;
  return cfg;
}

Pi05Config Pi05Config::tiny() {
  Pi05Config cfg;
  cfg.vision = {/*width=*/48, /*depth=*/2, /*mlp=*/96, /*heads=*/4, /*patch=*/14, /*image=*/28};
  cfg.backbone = {/*width=*/64, /*depth=*/2, /*mlp=*/128, /*heads=*/4, /*kv_heads=*/1, /*head_dim=*/16,
                  /*vocab=*/512};
  cfg.expert = {/*width=*/32,   /*depth=*/2,     /*mlp=*/64, /*heads=*/4,
                /*kv_heads=*/1, /*head_dim=*/16, /*vocab=*/0};
  cfg.action_dim = 32;
  return cfg;
}

Pi05Config Pi05Config::named(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "full") return full();
  throw std::invalid_argument("Pi05Config: unknown model size '" + name + "' (expected 'tiny' or 'full')");
}

void Pi05Config::validate() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("Pi05Config: " + what); };
  const GemmaConfig& b = backbone;
  const GemmaConfig& e = expert;
  if (e.depth != b.depth) fail("expert depth must equal the backbone depth (joint layers)");
  if (e.heads != b.heads || e.kv_heads != b.kv_heads || e.head_dim != b.head_dim)
    fail("expert heads/kv_heads/head_dim must equal the backbone's (one joint attention)");
  if (b.kv_heads < 1 || b.heads % b.kv_heads != 0) fail("heads must be a multiple of kv_heads");
  if (b.head_dim % 2 != 0) fail("head_dim must be even (RoPE rotates half-splits)");
  if (vision.patch < 1 || vision.image % vision.patch != 0) fail("vision image must be a multiple of the patch");
  if (vision.heads < 1 || vision.width % vision.heads != 0) fail("vision width must be a multiple of its heads");
  if (b.vocab < 2) fail("backbone vocab must be at least 2");
  if (action_dim < 1) fail("action_dim must be positive");
}

}  // namespace vlatune::model
