#include "tuner/recompute_units.h"

#include <algorithm>
#include <set>

#include "layout/pi05.h"

namespace vlatune::tuner {

UnitSpec unit_for_fqn(const std::string& fqn, const std::string& kind) {
  const std::string twin = layout::joint_twin(fqn);
  if (twin.empty()) return {{fqn}, kind};
  const std::string canonical = layout::canonical_unit(fqn);
  return {{canonical, canonical == fqn ? twin : fqn}, kind};
}

std::vector<UnitSpec> default_recompute_units(const std::vector<std::string>& recomputable,
                                              const std::vector<std::string>& module_fqns) {
  std::vector<UnitSpec> out;
  std::set<std::string> seen;
  for (const std::string& fqn : recomputable.empty() ? module_fqns : recomputable) {
    std::string kind = layout::unit_kind(fqn);
    if (kind.empty() && recomputable.empty()) continue;
    if (kind.empty()) kind = "recomputable";
    UnitSpec unit = unit_for_fqn(fqn, kind);
    if (!seen.insert(unit.aliases[0]).second) continue;
    out.push_back(std::move(unit));
  }
  std::sort(out.begin(), out.end(),
            [](const UnitSpec& a, const UnitSpec& b) { return layout::forward_before(a.aliases[0], b.aliases[0]); });
  return out;
}

}  // namespace vlatune::tuner
