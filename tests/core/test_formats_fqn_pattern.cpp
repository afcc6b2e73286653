// FQN pattern matcher: `*` is exactly one segment, whole-FQN matches only, and resolve_patterns rejects empty
// matches and nested selections with messages that name the file, the JSON path and the pattern.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"

using vlatune::formats::FormatError;
using vlatune::formats::fqn_matches;
using vlatune::formats::resolve_patterns;
using vlatune::formats::validate_pattern;

namespace {

const std::string kLm = "paligemma_with_expert.paligemma.model.language_model";

// A Pi0.5-shaped module list in named_modules() order (root "" first), 18 prefix layers.
std::vector<std::string> pi05_like_modules() {
  std::vector<std::string> m = {
      "",  "paligemma_with_expert", "paligemma_with_expert.paligemma", "paligemma_with_expert.paligemma.model",
      kLm, kLm + ".layers"};
  for (int i = 0; i < 18; ++i) {
    const std::string layer = kLm + ".layers." + std::to_string(i);
    for (const char* sub :
         {"", ".self_attn", ".self_attn.q_proj", ".mlp", ".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"}) {
      m.push_back(layer + sub);
    }
  }
  m.push_back("action_in_proj");
  m.push_back("time_mlp_in");
  m.push_back("time_mlp_out");
  return m;
}

std::string message_of(const std::vector<std::string>& patterns, const std::vector<std::string>& modules) {
  try {
    resolve_patterns(patterns, modules, "recipe.json", "$.recompute.modules");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("A star matches exactly one segment", "[formats][fqn_pattern]") {
  CHECK(fqn_matches("a.*.c", "a.b.c"));
  CHECK(fqn_matches("a.*.c", "a.17.c"));
  CHECK(fqn_matches("*", "action_in_proj"));
  CHECK_FALSE(fqn_matches("a.*.c", "a.c"));
  CHECK_FALSE(fqn_matches("a.*.c", "a.b.x.c"));
  CHECK_FALSE(fqn_matches("*", "a.b"));
  CHECK(fqn_matches("*.*", "a.b"));
}

TEST_CASE("A pattern matches whole FQNs, never a prefix or a partial segment", "[formats][fqn_pattern]") {
  CHECK(fqn_matches("a.b", "a.b"));
  CHECK_FALSE(fqn_matches("a.b", "a.b.c"));
  CHECK_FALSE(fqn_matches("a.b.c", "a.b"));
  CHECK_FALSE(fqn_matches("a.b", "a.bc"));
  CHECK_FALSE(fqn_matches("layers.1*", "layers.17"));
  CHECK_FALSE(fqn_matches("*_proj", "q_proj"));
  CHECK_FALSE(fqn_matches("a.*", "a."));
}

TEST_CASE("Pattern validation rejects empty patterns, empty segments, whitespace and partial globs",
          "[formats][fqn_pattern]") {
  CHECK_NOTHROW(validate_pattern("a.*.c_d.7", "recipe.json", "$.p[0]"));
  CHECK_THROWS_WITH(validate_pattern("", "recipe.json", "$.p[0]"),
                    Catch::Contains("recipe.json: $.p[0]") && Catch::Contains("empty pattern"));
  for (const char* bad : {"a..b", ".a", "a.", "."}) {
    CHECK_THROWS_WITH(validate_pattern(bad, "recipe.json", "$.p[1]"),
                      Catch::Contains("recipe.json: $.p[1]") && Catch::Contains("empty segment"));
  }
  for (const char* bad : {"a .b", "a.b ", "\ta.b", "a.\nb"}) {
    CHECK_THROWS_WITH(validate_pattern(bad, "recipe.json", "$.p[2]"), Catch::Contains("whitespace"));
  }
  for (const char* bad : {"layers.1*", "*_proj", "a.**", "a.b?", "a.[0-9]"}) {
    CHECK_THROWS_WITH(validate_pattern(bad, "recipe.json", "$.p[3]"),
                      Catch::Contains("$.p[3]") && Catch::Contains("whole segment"));
  }
}

TEST_CASE("Resolved modules come in module order, each once", "[formats][fqn_pattern]") {
  const auto modules = pi05_like_modules();
  const auto got =
      resolve_patterns({kLm + ".layers.3.mlp", kLm + ".layers.*.self_attn", kLm + ".layers.3.mlp", "action_in_proj"},
                       modules, "recipe.json", "$.recompute.modules");
  REQUIRE(got.size() == 1 + 18 + 1);
  CHECK(got[0] == kLm + ".layers.0.self_attn");
  CHECK(got[3] == kLm + ".layers.3.self_attn");
  CHECK(got[4] == kLm + ".layers.3.mlp");  // model order, not pattern order
  CHECK(got[5] == kLm + ".layers.4.self_attn");
  CHECK(got.back() == "action_in_proj");
}

TEST_CASE("An empty pattern list resolves to nothing", "[formats][fqn_pattern]") {
  CHECK(resolve_patterns({}, pi05_like_modules(), "recipe.json", "$.fp8.modules").empty());
}

TEST_CASE("A pattern that matches nothing names the pattern, its path and the valid range", "[formats][fqn_pattern]") {
  const auto modules = pi05_like_modules();
  const std::string msg = message_of({kLm + ".layers.0.mlp", kLm + ".layers.18.mlp"}, modules);
  CHECK_THAT(msg, Catch::StartsWith("recipe.json: $.recompute.modules[1]: no module matches '" + kLm +
                                    ".layers.18.mlp' (layers 0..17)"));
}

TEST_CASE("A pattern that matches nothing lists the names that exist where it stops matching",
          "[formats][fqn_pattern]") {
  const auto modules = pi05_like_modules();
  CHECK_THAT(message_of({kLm + ".layers.*.mlp.gate"}, modules),
             Catch::Contains("$.recompute.modules[0]") &&
                 Catch::Contains("(after '" + kLm + ".layers.*.mlp': down_proj, gate_proj, up_proj)"));
  CHECK_THAT(message_of({"action_out_proj"}, modules),
             Catch::Contains("top-level modules: action_in_proj, paligemma_with_expert, time_mlp_in, time_mlp_out"));
  CHECK_THAT(message_of({"x"}, {}), Catch::Contains("the module list is empty"));
}

TEST_CASE("A pattern that names only a path prefix explains that patterns match whole FQNs", "[formats][fqn_pattern]") {
  // A list of leaf modules only: "a.b" is a path but not a module of the list.
  CHECK_THAT(message_of({"a.b"}, {"a.b.c", "a.b.d"}), Catch::Contains("no module matches 'a.b'") &&
                                                          Catch::Contains("only a prefix") &&
                                                          Catch::Contains("'a.b.c'"));
}

TEST_CASE("A selection that nests one module inside another is rejected, naming both", "[formats][fqn_pattern]") {
  const auto modules = pi05_like_modules();
  const std::string msg =
      message_of({"action_in_proj", kLm + ".layers.*.mlp.gate_proj", kLm + ".layers.5.mlp"}, modules);
  CHECK_THAT(msg, Catch::StartsWith("recipe.json: $.recompute.modules[2]: "));
  CHECK_THAT(msg, Catch::Contains("'" + kLm + ".layers.5.mlp.gate_proj' (matched by $.recompute.modules[1])") &&
                      Catch::Contains("inside '" + kLm + ".layers.5.mlp' (matched by $.recompute.modules[2])"));
}

TEST_CASE("Nesting is detected whichever pattern comes first", "[formats][fqn_pattern]") {
  const auto modules = pi05_like_modules();
  try {
    resolve_patterns({kLm + ".layers.2", kLm + ".layers.2.mlp.up_proj"}, modules, "r.json", "$.groups[0].modules");
    FAIL("nesting was accepted");
  } catch (const FormatError& e) {
    CHECK(e.file() == "r.json");
    CHECK(e.json_path() == "$.groups[0].modules[1]");
    CHECK_THAT(e.reason(), Catch::Contains(kLm + ".layers.2.mlp.up_proj") && Catch::Contains(kLm + ".layers.2'"));
  }
}

TEST_CASE("Siblings that share a name prefix are not nested", "[formats][fqn_pattern]") {
  const auto got =
      resolve_patterns({"time_mlp", "time_mlp_in"}, {"time_mlp", "time_mlp_in", "time_mlp.x"}, "r.json", "$.m");
  CHECK(got == std::vector<std::string>{"time_mlp", "time_mlp_in"});
}

TEST_CASE("An invalid pattern is reported with its index before any matching", "[formats][fqn_pattern]") {
  CHECK_THROWS_WITH(
      resolve_patterns({"action_in_proj", "time_mlp_*"}, pi05_like_modules(), "recipe.json", "$.fp8.modules"),
      Catch::StartsWith("recipe.json: $.fp8.modules[1]: "));
}

TEST_CASE("fold_indices turns layer indices into wildcards and leaves other segments", "[formats][fqn]") {
  using vlatune::formats::fold_indices;
  CHECK(fold_indices("a.layers.7.mlp") == "a.layers.*.mlp");
  CHECK(fold_indices("a.layers.12.self_attn.q_proj") == "a.layers.*.self_attn.q_proj");
  CHECK(fold_indices("7") == "*");
  CHECK(fold_indices("layer7.x1") == "layer7.x1");  // digits inside a name stay
  CHECK(fold_indices("<optimizer>") == "<optimizer>");
  CHECK(fold_indices("") == "");
  CHECK(vlatune::formats::fqn_matches(fold_indices("a.layers.3.mlp"), "a.layers.0.mlp"));
}

TEST_CASE("fqn_within is whole-segment containment", "[formats][fqn]") {
  using vlatune::formats::fqn_within;
  CHECK(fqn_within("a.b.c", "a.b"));
  CHECK(fqn_within("a.b", "a.b"));
  CHECK_FALSE(fqn_within("a.bc", "a.b"));
  CHECK_FALSE(fqn_within("a.b", "a.b.c"));
  CHECK_FALSE(fqn_within("time_mlp_in", "time_mlp"));
  CHECK(fqn_within("x.mlp.gate_proj+up_proj", "x.mlp"));
}
