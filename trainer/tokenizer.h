// Prompt tokenization exactly as openpi's PaligemmaTokenizer (spec §4.6):
//   no state:   BOS + encode(cleaned task) + encode("\n")          (pi05_libero: discrete_state_input = False)
//   with state: BOS + encode("Task: " + cleaned + ", State: " + bins + ";\nAction: ")
// right-padded with id 0 / mask false to text_len (200), truncated to text_len with a warning.
// cleaned = strip(), then '_' -> ' ' and '\n' -> ' ' (no lower-casing).
//
// The string and padding helpers are pure and always built; PromptTokenizer needs SentencePiece
// (VLATUNE_HAVE_SENTENCEPIECE) and otherwise throws "unavailable in this build" from its constructor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vlatune::trainer {

// strip (Python's str.strip(): ASCII whitespace), then '_' -> ' ' and '\n' -> ' '.
std::string clean_task(const std::string& task);

// openpi: np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1 per dim, i.e. floor((x + 1) * 128) clamped to 255
// above, and -1 for x < -1 (openpi keeps the -1; so do we). `state` is the quantile-normalized, unpadded state.
std::vector<int> discretize_state(const float* state, int64_t dims);

// "Task: <cleaned>, State: b1 b2 ...;\nAction: " (the discrete-state prompt; `task` is cleaned here).
std::string discrete_state_prompt(const std::string& task, const std::vector<int>& bins);

struct TokenizedPrompt {
  std::vector<int32_t> ids;  // exactly text_len entries, padding 0
  int32_t length = 0;        // real tokens (mask true on [0, length))
  bool truncated = false;    // the prompt had more than text_len tokens
};

// Right-pads (or truncates) `ids` to text_len.
TokenizedPrompt pad_tokens(const std::vector<int32_t>& ids, int64_t text_len);

class PromptTokenizer {
 public:
  // True when this build has SentencePiece.
  static bool available();
  // Loads a SentencePiece model (the PaliGemma tokenizer.model for real data). Throws std::runtime_error naming
  // the file when it cannot be loaded, when the model has no BOS piece, or when SentencePiece is not built in.
  explicit PromptTokenizer(const std::string& model_path, int64_t text_len = 200);
  ~PromptTokenizer();
  PromptTokenizer(const PromptTokenizer&) = delete;
  PromptTokenizer& operator=(const PromptTokenizer&) = delete;

  // The spec §4.6 prompt: without state when `state` is null, with the discrete state otherwise.
  TokenizedPrompt tokenize(const std::string& task, const float* state = nullptr, int64_t state_dim = 0) const;
  // Plain SentencePiece ids of `text` (no BOS).
  std::vector<int32_t> encode(const std::string& text) const;

  int64_t vocab_size() const;
  int64_t bos_id() const;
  const std::string& model_path() const { return model_path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string model_path_;
  int64_t text_len_;
};

}  // namespace vlatune::trainer
