// The recompute candidates the tuner weighs, as named units (layout/pi05.h says what a unit is): each unit with
// every name that selects it. A unit's cost is the sum of the profile rows of its names; the recipe names it by
// its first (the canonical name).
#pragma once

#include <string>
#include <vector>

namespace vlatune::tuner {

// A candidate recompute unit before it meets the numbers.
struct UnitSpec {
  std::vector<std::string> aliases;  // FQNs that select it; aliases[0] is the name the recipe uses
  std::string kind;                  // layout::unit_kind, or a label ("profiled", "custom", an A/B class name)
};

// The default candidates: the profile's `recomputable` list (what the trainer can recompute) when it has one,
// else those present among `module_fqns` (the profile's rows): SigLIP encoder layers, and per joint layer i the
// layer, its attention and each branch's MLP. Sorted in forward order.
std::vector<UnitSpec> default_recompute_units(const std::vector<std::string>& recomputable,
                                              const std::vector<std::string>& module_fqns);

// The unit an FQN selects: a joint layer or attention block gets both branch names, the backbone's first.
UnitSpec unit_for_fqn(const std::string& fqn, const std::string& kind);

}  // namespace vlatune::tuner
