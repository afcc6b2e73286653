// Seeded mutations of valid documents for the standing fuzz tests of every reader: byte flips, truncations,
// splices, repeats, hostile numbers (1e400, 2^64, -0, NaN), hostile strings, deep nesting, duplicate and unknown
// keys, values of the wrong type. Deterministic: the same seed gives the same inputs on every machine (raw
// mt19937_64 draws, no std:: distributions, whose results differ between standard libraries).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::test {

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool chance(uint64_t one_in) { return below(one_in) == 0; }

  // A mutated copy of seeds[k] for a random k: one to four byte-level or value-level edits. `seeds` are texts of
  // valid documents (for value-level edits they must parse as JSON; texts that do not are edited as bytes only).
  std::string mutate(const std::vector<std::string>& seeds) {
    std::string text = seeds[below(seeds.size())];
    const uint64_t edits = 1 + below(4);
    for (uint64_t e = 0; e < edits; ++e) {
      if (chance(2)) {
        text = mutate_value(text);
      } else {
        mutate_bytes(text, seeds);
      }
    }
    return text;
  }

  // Byte-level: flip, overwrite with a JSON metacharacter, truncate, delete, repeat, splice from another seed, or
  // insert a hostile token.
  void mutate_bytes(std::string& text, const std::vector<std::string>& seeds) {
    static const char kMeta[] = {'{', '}', '[', ']', '"', ',', ':', '\\', '0', '-', 'e', '.', ' ', '\n', '\0'};
    const size_t n = text.size();
    const size_t at = below(n + 1);
    switch (below(8)) {
      case 0:
        if (n) text[at % n] = static_cast<char>(text[at % n] ^ (1 << below(8)));
        break;
      case 1:
        if (n) text[at % n] = kMeta[below(sizeof(kMeta))];
        break;
      case 2:
        text.resize(at);
        break;
      case 3:
        text.erase(at, 1 + below(64));
        break;
      case 4: {
        const std::string piece = text.substr(at, 1 + below(64));
        text.insert(below(text.size() + 1), piece);
        break;
      }
      case 5: {
        const std::string& other = seeds[below(seeds.size())];
        const size_t from = below(other.size() + 1);
        text.replace(at, below(64), other.substr(from, below(128)));
        break;
      }
      case 6:
        text.insert(at, hostile_token());
        break;
      default:
        text.replace(at, below(16), hostile_token());
        break;
    }
  }

  // Value-level: parse, replace (or drop, or duplicate) one value somewhere in the tree, dump. Hostile numbers that
  // a double cannot hold are spliced into the text after dumping.
  std::string mutate_value(const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return text;
    std::vector<nlohmann::json*> nodes;
    collect(j, nodes);
    nlohmann::json* target = nodes[below(nodes.size())];
    static const char* kMarker = "\"@@RAW@@\"";
    std::string raw;
    switch (below(6)) {
      case 0:
        raw = hostile_number();
        *target = "@@RAW@@";
        break;
      case 1:
        *target = hostile_value();
        break;
      case 2:
        if (target->is_object() && !target->empty()) {
          auto it = target->begin();
          std::advance(it, static_cast<long>(below(target->size())));
          const std::string key = it.key();
          target->erase(key);
        } else if (target->is_array() && !target->empty()) {
          target->erase(below(target->size()));
        } else {
          *target = nullptr;
        }
        break;
      case 3:
        if (target->is_object()) {
          (*target)[chance(2) ? "unknown_key" : ""] = hostile_value();
        } else if (target->is_array()) {
          target->push_back(target->empty() ? hostile_value() : (*target)[below(target->size())]);
        } else {
          *target = nlohmann::json::array({*target, *target});
        }
        break;
      case 4:
        if (target->is_array() && target->size() < 4096) {
          const nlohmann::json copy = *target;  // many elements: sizes, counts and lengths that disagree
          for (int r = 0; r < 8; ++r)
            for (const auto& v : copy) target->push_back(v);
        } else {
          *target = hostile_value();
        }
        break;
      default: {
        raw = std::string(1 + below(2000), '[') + "1" + std::string(1 + below(2000), ']');
        *target = "@@RAW@@";
        break;
      }
    }
    std::string out = j.dump(chance(2) ? -1 : 2);
    if (!raw.empty()) {
      const size_t pos = out.find(kMarker);
      if (pos != std::string::npos) out.replace(pos, std::string(kMarker).size(), raw);
    }
    return out;
  }

 private:
  static void collect(nlohmann::json& j, std::vector<nlohmann::json*>& out) {
    out.push_back(&j);
    if (j.is_structured())
      for (auto& v : j) collect(v, out);
  }

  std::string hostile_number() {
    static const char* kNumbers[] = {"1e400",
                                     "-1e400",
                                     "1e-400",
                                     "1e308",
                                     "-1e308",
                                     "5e-324",
                                     "0",
                                     "-0",
                                     "-0.0",
                                     "-1",
                                     "0.5",
                                     "1.0",
                                     "2147483648",
                                     "4294967296",
                                     "9223372036854775807",
                                     "-9223372036854775808",
                                     "9223372036854775808",
                                     "18446744073709551615",
                                     "18446744073709551616",
                                     "-9223372036854775809",
                                     "1e19",
                                     "123456789012345678901234567890",
                                     "NaN",
                                     "Infinity",
                                     "-Infinity",
                                     "0x10",
                                     "01",
                                     "1e",
                                     "--1",
                                     "1.7976931348623157e308"};
    return kNumbers[below(sizeof(kNumbers) / sizeof(kNumbers[0]))];
  }

  nlohmann::json hostile_value() {
    switch (below(12)) {
      case 0:
        return nullptr;
      case 1:
        return chance(2);
      case 2:
        return nlohmann::json::object();
      case 3:
        return nlohmann::json::array();
      case 4:
        return "";
      case 5:
        return std::string(1 + below(20000), 'x');
      case 6:
        return "*";
      case 7:
        return "a..b.*";
      case 8:
        return -static_cast<int64_t>(below(1000000)) - 1;
      case 9:
        return static_cast<int64_t>(rng_() >> 1);
      case 10:
        return std::ldexp(1.0, static_cast<int>(below(2100)) - 1074);
      default:
        return std::string("\u00e9\u2026\xf0\x9f\x98\x80/../\\\"\n");
    }
  }

  std::string hostile_token() {
    switch (below(5)) {
      case 0:
        return hostile_number();
      case 1:
        return std::string(1 + below(3000), '[');
      case 2:
        return "\"\xff\xfe\"";
      case 3:
        return "\"a\": 1, \"a\": 2";
      default:
        return "{\"\": null}";
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace vlatune::test
