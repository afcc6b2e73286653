// Helpers shared by the dataset cases (test_trainer_dataset.cpp, _loader, _libero_import, _lerobot_import and the
// cases that train on a written dataset): a temporary directory tree removed afterwards, byte-level file edits for
// the corruption cases, and a tiny SentencePiece model. POSIX calls only (see trainer/file_util.h for why not
// std::filesystem).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

#include "temp_dir.h"

#if defined(VLATUNE_HAVE_SENTENCEPIECE)
#include <fcntl.h>
#include <sentencepiece_trainer.h>
#endif

namespace vlatune::test {

// A temporary directory tree of the data cases, removed afterwards.
struct TempTree : TempDir {
  TempTree() : TempDir("data") {}
};

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Overwrites `bytes.size()` bytes at `offset` in place.
inline void patch_file(const std::string& path, int64_t offset, const std::string& bytes) {
  std::string all = read_file_bytes(path);
  REQUIRE(offset + static_cast<int64_t>(bytes.size()) <= static_cast<int64_t>(all.size()));
  all.replace(static_cast<size_t>(offset), bytes.size(), bytes);
  write_file_bytes(path, all);
}

#if defined(VLATUNE_HAVE_SENTENCEPIECE)
// Trains a tiny SentencePiece model with PaliGemma's special ids (pad 0, eos 1, bos 2, unk 3) and a "\n" piece,
// on a corpus with every character the prompts use. SentencePiece logs training to stderr: silenced.
inline std::string train_tiny_tokenizer(const TempTree& tmp) {
  std::string corpus;
  const char* lines[] = {"put the bowl on the plate",
                         "open the drawer and put the bowl inside",
                         "Task: pick up the black bowl, State: 0 1 2 3 4 5 6 7 8 9 128 255;",
                         "Action: turn on the stove",
                         "close the top drawer of the cabinet",
                         "-1 10 64 200 99",
                         "pick up the red block",
                         "open the drawer",
                         "stack the green cube on the yellow one"};
  for (int rep = 0; rep < 20; ++rep)
    for (const char* l : lines) corpus += std::string(l) + "\n";
  write_file_bytes(tmp / "corpus.txt", corpus);
  const int saved = ::dup(2), devnull = ::open("/dev/null", O_WRONLY);
  ::dup2(devnull, 2);
  const auto status = sentencepiece::SentencePieceTrainer::Train({{"input", tmp / "corpus.txt"},
                                                                  {"model_prefix", tmp / "tok"},
                                                                  {"vocab_size", "90"},
                                                                  {"hard_vocab_limit", "false"},
                                                                  {"character_coverage", "1.0"},
                                                                  {"pad_id", "0"},
                                                                  {"eos_id", "1"},
                                                                  {"bos_id", "2"},
                                                                  {"unk_id", "3"},
                                                                  {"user_defined_symbols", "\n"},
                                                                  {"normalization_rule_name", "identity"},
                                                                  {"add_dummy_prefix", "false"},
                                                                  {"remove_extra_whitespaces", "false"}});
  ::dup2(saved, 2);
  ::close(saved), ::close(devnull);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return tmp / "tok.model";
}

#endif

}  // namespace vlatune::test
