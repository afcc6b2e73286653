// FQN patterns: how recipes name sets of modules.
//
// A module is named by its openpi state-dict FQN, e.g.
//   paligemma_with_expert.paligemma.model.language_model.layers.7.mlp
// A pattern is the same dotted form where a segment may be `*`, which matches exactly one segment:
//   paligemma_with_expert.paligemma.model.language_model.layers.*.mlp   -> the 18 prefix MLPs
// Rules (validate_pattern):
//   - non-empty, no empty segments (no leading/trailing/double dots), no whitespace or control characters;
//   - `*` is a whole segment or nothing: `layers.1*` or `**` are rejected (no partial-segment globbing, no
//     multi-segment wildcard), and so are the other glob characters ? [ ] { };
//   - a pattern matches an FQN only with the same number of segments (a pattern never matches a prefix: to
//     select a subtree, name its root module).
// resolve_patterns adds the selection rules: every pattern must match something, and no selected module may
// lie inside another selected module (recomputing or converting a module and its child at once is ambiguous).
#pragma once

#include <string>
#include <vector>

namespace vlatune::formats {

// The pattern of a module's repeated unit: every all-digit segment becomes `*` ("a.layers.7.mlp" ->
// "a.layers.*.mlp"), so that the layers of a stack fold into one class (reports, profile.json's kernel sites).
std::string fold_indices(const std::string& fqn);

// True when `fqn` has as many segments as `pattern` and each segment is equal or the pattern's is `*`.
// Pure and allocation-free; does not validate the pattern (an invalid one simply fails to match).
bool fqn_matches(const std::string& pattern, const std::string& fqn);

// True when `inner` is `outer` or lies inside it: `outer` is a whole-segment prefix of `inner`
// ("a.b.c" lies inside "a.b", "a.bc" does not). The one definition of module containment.
bool fqn_within(const std::string& inner, const std::string& outer);
// True when `inner` is or lies inside one of `outers`.
bool fqn_within_any(const std::string& inner, const std::vector<std::string>& outers);

// True when `pattern` matches `fqn` or one of its ancestors (the pattern selects a module that holds `fqn`).
bool pattern_covers(const std::string& pattern, const std::string& fqn);

// The shortest pattern list that selects exactly `chosen` among `universe`: where every FQN that differs from a
// chosen one only in a numeric segment is chosen too, that segment becomes `*`; otherwise the FQN is listed.
// The result is sorted; resolving it against `universe` gives `chosen` back.
std::vector<std::string> compact_patterns(const std::vector<std::string>& chosen,
                                          const std::vector<std::string>& universe);

// Throws FormatError(file, json_path, reason) when `pattern` breaks the rules above, e.g.
//   recipe.json: $.recompute.modules[2]: empty segment in pattern 'a..b' (segments are separated by single dots)
void validate_pattern(const std::string& pattern, const std::string& file, const std::string& json_path);

// Resolves `patterns` (the array at `json_path` in `file`) against the model's modules.
//   module_fqns: every module FQN in module order (named_modules() order; an empty root name is ignored).
//   returns:     the FQNs matched by at least one pattern, in module order, each once.
// Throws FormatError(file, json_path + "[i]", ...) naming pattern i when
//   - it is invalid (validate_pattern);
//   - it matches nothing; the message names the pattern and what exists where it stops matching:
//       no module matches '...language_model.layers.18.mlp' (layers 0..17)
//       no module matches '...layers.*.mlp.gate' (after '...layers.*.mlp': down_proj, gate_proj, up_proj)
//   - a module it matches is nested inside (or contains) a module matched by another pattern; the message
//     names both FQNs and both patterns' paths. i is the later of the two patterns.
std::vector<std::string> resolve_patterns(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& module_fqns, const std::string& file,
                                          const std::string& json_path);

}  // namespace vlatune::formats
