#include "formats/fqn_pattern.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>

#include "formats/json_error.h"

namespace vlatune::formats {

namespace {

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

// A layer index: digits only, short enough for std::stol.
bool is_index(std::string_view s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool segment_matches(std::string_view pattern_segment, std::string_view segment) {
  return pattern_segment == "*" ? !segment.empty() : pattern_segment == segment;
}

// Joins the first n segments.
template <typename Segment>
std::string join_prefix(const std::vector<Segment>& segments, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out += '.';
    out += segments[i];
  }
  return out;
}

// Explains why `pattern` matches none of `fqns`: finds the longest pattern prefix that still matches the start of
// some FQN, then lists what exists at the next segment (a numeric range when the children are indices).
std::string no_match_hint(const std::vector<std::string_view>& pattern,
                          const std::vector<std::vector<std::string_view>>& fqns) {
  if (fqns.empty()) return " (the module list is empty)";
  std::vector<const std::vector<std::string_view>*> live;
  for (const auto& f : fqns) live.push_back(&f);
  size_t k = 0;
  for (; k < pattern.size(); ++k) {
    std::vector<const std::vector<std::string_view>*> next;
    for (const auto* f : live) {
      if (f->size() > k && segment_matches(pattern[k], (*f)[k])) next.push_back(f);
    }
    if (next.empty()) break;
    live.swap(next);
  }
  if (k == pattern.size()) {
    // Every segment matched, so only longer FQNs continue it: the pattern names a path, not a module.
    for (const auto* f : live) {
      if (f->size() > k) {
        return " (it is only a prefix of module names such as '" + join_prefix(*f, f->size()) +
               "'; a pattern must match whole FQNs)";
      }
    }
    return "";
  }
  std::set<std::string_view> children;
  for (const auto* f : live) {
    if (f->size() > k) children.insert((*f)[k]);
  }
  if (children.empty()) {
    return " (the modules matching '" + join_prefix(pattern, k) + "' have no children)";
  }
  if (std::all_of(children.begin(), children.end(), is_index)) {
    long lo = -1, hi = -1;
    for (auto c : children) {
      const long v = std::stol(std::string(c));
      if (lo < 0 || v < lo) lo = v;
      if (v > hi) hi = v;
    }
    const std::string parent = k > 0 && pattern[k - 1] != "*" ? std::string(pattern[k - 1]) + " " : "";
    return " (" + parent + std::to_string(lo) + ".." + std::to_string(hi) + ")";
  }
  // Indices sort numerically (2 before 10), names alphabetically, indices first.
  std::vector<std::string_view> names(children.begin(), children.end());
  std::sort(names.begin(), names.end(), [](std::string_view a, std::string_view b) {
    const bool na = is_index(a), nb = is_index(b);
    if (na != nb) return na;
    if (na) return a.size() != b.size() ? a.size() < b.size() : a < b;
    return a < b;
  });
  std::string list;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + std::string(names[i]);
  if (names.size() > shown) list += ", ... (" + std::to_string(names.size() - shown) + " more)";
  if (k == 0) return " (top-level modules: " + list + ")";
  return " (after '" + join_prefix(pattern, k) + "': " + list + ")";
}

}  // namespace

std::string fold_indices(const std::string& fqn) {
  std::vector<std::string_view> segments = split_dots(fqn);
  for (std::string_view& seg : segments)
    if (is_index(seg)) seg = "*";
  return join_prefix(segments, segments.size());
}

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  std::string_view p(pattern), f(fqn);
  while (true) {
    const size_t pd = p.find('.'), fd = f.find('.');
    if (!segment_matches(p.substr(0, pd), f.substr(0, fd))) return false;
    if (pd == std::string_view::npos || fd == std::string_view::npos) {
      return pd == std::string_view::npos && fd == std::string_view::npos;
    }
    p.remove_prefix(pd + 1);
    f.remove_prefix(fd + 1);
  }
}

bool fqn_within(const std::string& inner, const std::string& outer) {
  return inner.size() >= outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
         (inner.size() == outer.size() || inner[outer.size()] == '.');
}

bool fqn_within_any(const std::string& inner, const std::vector<std::string>& outers) {
  return std::any_of(outers.begin(), outers.end(), [&](const std::string& o) { return fqn_within(inner, o); });
}

bool pattern_covers(const std::string& pattern, const std::string& fqn) {
  for (size_t end = fqn.size(); end != std::string::npos && end > 0; end = fqn.rfind('.', end - 1))
    if (fqn_matches(pattern, fqn.substr(0, end))) return true;
  return false;
}

std::vector<std::string> compact_patterns(const std::vector<std::string>& chosen,
                                          const std::vector<std::string>& universe) {
  const std::set<std::string> chosen_set(chosen.begin(), chosen.end());
  std::set<std::string> covered, out;
  for (const std::string& fqn : chosen_set) {
    if (covered.count(fqn)) continue;
    const std::vector<std::string_view> segments = split_dots(fqn);
    bool done = false;
    for (size_t p = 0; p < segments.size() && !done; ++p) {
      if (!is_index(segments[p])) continue;
      std::vector<std::string_view> pattern_segments = segments;
      pattern_segments[p] = "*";
      const std::string pattern = join_prefix(pattern_segments, pattern_segments.size());
      std::vector<std::string> matched;
      bool complete = true;
      for (const std::string& other : universe) {
        if (!fqn_matches(pattern, other)) continue;
        if (!chosen_set.count(other)) complete = false;
        matched.push_back(other);
      }
      if (complete && matched.size() > 1) {
        out.insert(pattern);
        covered.insert(matched.begin(), matched.end());
        done = true;
      }
    }
    if (!done) {
      out.insert(fqn);
      covered.insert(fqn);
    }
  }
  return {out.begin(), out.end()};
}

void validate_pattern(const std::string& pattern, const std::string& file, const std::string& json_path) {
  const std::string quoted = "'" + pattern + "'";
  if (pattern.empty()) throw FormatError(file, json_path, "empty pattern (expected a dotted module FQN)");
  for (size_t i = 0; i < pattern.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(pattern[i]);
    if (std::isspace(c) || std::iscntrl(c)) {
      throw FormatError(
          file, json_path,
          "pattern " + quoted + " contains whitespace or a control character at position " + std::to_string(i));
    }
  }
  for (std::string_view seg : split_dots(pattern)) {
    if (seg.empty()) {
      throw FormatError(file, json_path,
                        "empty segment in pattern " + quoted + " (segments are separated by single dots)");
    }
    if (seg == "*") continue;
    const size_t bad = seg.find_first_of("*?[]{}");
    if (bad != std::string_view::npos) {
      throw FormatError(file, json_path,
                        "'" + std::string(1, seg[bad]) + "' inside segment '" + std::string(seg) + "' of pattern " +
                            quoted + ": only a whole segment '*' is a wildcard (it matches exactly one segment)");
    }
  }
}

std::vector<std::string> resolve_patterns(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& module_fqns, const std::string& file,
                                          const std::string& json_path) {
  auto path_of = [&](size_t i) { return json_path + "[" + std::to_string(i) + "]"; };
  for (size_t i = 0; i < patterns.size(); ++i) validate_pattern(patterns[i], file, path_of(i));

  // matched_by[m]: index of the first pattern that matched module m, or npos.
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> matched_by(module_fqns.size(), kNone);
  for (size_t i = 0; i < patterns.size(); ++i) {
    bool any = false;
    for (size_t m = 0; m < module_fqns.size(); ++m) {
      if (module_fqns[m].empty() || !fqn_matches(patterns[i], module_fqns[m])) continue;
      any = true;
      if (matched_by[m] == kNone) matched_by[m] = i;
    }
    if (!any) {
      std::vector<std::vector<std::string_view>> split;
      for (const auto& f : module_fqns) {
        if (!f.empty()) split.push_back(split_dots(f));
      }
      throw FormatError(file, path_of(i),
                        "no module matches '" + patterns[i] + "'" + no_match_hint(split_dots(patterns[i]), split));
    }
  }

  std::vector<std::string> selected;
  std::vector<size_t> selected_module;  // module index of each selected FQN
  std::set<std::string_view> seen;
  for (size_t m = 0; m < module_fqns.size(); ++m) {
    if (matched_by[m] == kNone || !seen.insert(module_fqns[m]).second) continue;
    selected.push_back(module_fqns[m]);
    selected_module.push_back(m);
  }

  // Nesting: a selected module inside another selected one. Checked in module order (parents come before their
  // children), so the first conflict a user sees is the first one in the model, named with its outermost parent.
  for (size_t i = 0; i < selected.size(); ++i) {
    for (size_t j = 0; j < selected.size(); ++j) {
      if (i == j || !fqn_within(selected[i], selected[j])) continue;
      const size_t inner_pattern = matched_by[selected_module[i]], outer_pattern = matched_by[selected_module[j]];
      throw FormatError(file, path_of(std::max(inner_pattern, outer_pattern)),
                        "selection nests '" + selected[i] + "' (matched by " + path_of(inner_pattern) + ") inside '" +
                            selected[j] + "' (matched by " + path_of(outer_pattern) +
                            "); select either the module or its parts, not both");
    }
  }
  return selected;
}

}  // namespace vlatune::formats
