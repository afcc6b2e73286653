#include "trainer/tokenizer.h"

#include <cmath>
#include <stdexcept>

#if defined(VLATUNE_HAVE_SENTENCEPIECE)
#include <sentencepiece_processor.h>
#endif

namespace vlatune::trainer {

std::string clean_task(const std::string& task) {
  const char* ws = " \t\n\r\v\f";
  const size_t begin = task.find_first_not_of(ws);
  if (begin == std::string::npos) return "";
  const size_t end = task.find_last_not_of(ws);
  std::string out = task.substr(begin, end - begin + 1);
  for (char& c : out)
    if (c == '_' || c == '\n') c = ' ';
  return out;
}

std::vector<int> discretize_state(const float* state, int64_t dims) {
  std::vector<int> bins;
  bins.reserve(static_cast<size_t>(dims));
  for (int64_t i = 0; i < dims; ++i) {
    // np.digitize against edges e_k = -1 + k/128 (k = 0..255) returns the number of edges <= x. Counting edges
    // exactly as numpy compares them (float64 edges from linspace) keeps values on an edge in the same bin.
    const double x = state[i];
    int count = 0;
    if (x >= -1.0) {
      count = static_cast<int>(std::floor((x + 1.0) * 128.0)) + 1;
      if (count > 256) count = 256;
      // Guard the floor against rounding right at an edge: recount against the edge values themselves.
      while (count > 0 && -1.0 + (count - 1) / 128.0 > x) --count;
      while (count < 256 && -1.0 + count / 128.0 <= x) ++count;
    }
    bins.push_back(count - 1);
  }
  return bins;
}

std::string discrete_state_prompt(const std::string& task, const std::vector<int>& bins) {
  std::string state;
  for (size_t i = 0; i < bins.size(); ++i) {
    if (i > 0) state += ' ';
    state += std::to_string(bins[i]);
  }
  return "Task: " + clean_task(task) + ", State: " + state + ";\nAction: ";
}

TokenizedPrompt pad_tokens(const std::vector<int32_t>& ids, int64_t text_len) {
  TokenizedPrompt p;
  p.truncated = static_cast<int64_t>(ids.size()) > text_len;
  p.length = static_cast<int32_t>(p.truncated ? text_len : static_cast<int64_t>(ids.size()));
  p.ids.assign(static_cast<size_t>(text_len), 0);
  std::copy(ids.begin(), ids.begin() + p.length, p.ids.begin());
  return p;
}

#if defined(VLATUNE_HAVE_SENTENCEPIECE)

struct PromptTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

bool PromptTokenizer::available() {
  return true;
}

PromptTokenizer::PromptTokenizer(const std::string& model_path, int64_t text_len)
    : impl_(std::make_unique<Impl>()), model_path_(model_path), text_len_(text_len) {
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok()) throw std::runtime_error(model_path + ": cannot load SentencePiece model: " + status.ToString());
  if (impl_->sp.bos_id() < 0)
    throw std::runtime_error(model_path + ": the SentencePiece model has no BOS piece (spec §4.6 prepends BOS)");
}

std::vector<int32_t> PromptTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error(model_path_ + ": cannot encode a prompt: " + status.ToString());
  return {ids.begin(), ids.end()};
}

int64_t PromptTokenizer::vocab_size() const {
  return impl_->sp.GetPieceSize();
}
int64_t PromptTokenizer::bos_id() const {
  return impl_->sp.bos_id();
}

#else

struct PromptTokenizer::Impl {};

bool PromptTokenizer::available() {
  return false;
}

PromptTokenizer::PromptTokenizer(const std::string& model_path, int64_t text_len)
    : model_path_(model_path), text_len_(text_len) {
  throw std::runtime_error(
      "prompt tokenization is unavailable in this build: vlatune was built without SentencePiece "
      "(install libsentencepiece-dev and reconfigure)");
}

std::vector<int32_t> PromptTokenizer::encode(const std::string&) const {
  return {};
}
int64_t PromptTokenizer::vocab_size() const {
  return 0;
}
int64_t PromptTokenizer::bos_id() const {
  return -1;
}

#endif

PromptTokenizer::~PromptTokenizer() = default;

TokenizedPrompt PromptTokenizer::tokenize(const std::string& task, const float* state, int64_t state_dim) const {
  std::vector<int32_t> ids{static_cast<int32_t>(bos_id())};
  auto append = [&ids](const std::vector<int32_t>& more) { ids.insert(ids.end(), more.begin(), more.end()); };
  if (state != nullptr) {
    append(encode(discrete_state_prompt(task, discretize_state(state, state_dim))));
  } else {
    // openpi encodes "\n" separately: the "start of answer" token, not merged into the last task piece.
    append(encode(clean_task(task)));
    append(encode("\n"));
  }
  return pad_tokens(ids, text_len_);
}

}  // namespace vlatune::trainer
