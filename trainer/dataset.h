// The packed dataset: DATASET/manifest.json ("vlatune.dataset/1") plus shard files of fixed-size records, read
// through mmap so a loader worker turns a sample index into a pointer with one multiply and no parsing.
//
// Shard file (little-endian):
//   [0, 4096)  header: magic "VLATSHRD", version, header bytes, sample count, record bytes, shard index, the six
//              layout dims and the five section offsets (kShardHeaderBytes keeps records page-aligned)
//   then       `samples` records of RecordLayout::record_bytes() each:
//              int32 tokens[text_len] | int32 token_len | float32 actions[horizon][action_dim] (normalized) |
//              float32 state[state_dim] (normalized) | uint8 images[cameras][side][side][3] | zero pad to 64 B
// The manifest lists each shard's file, samples, bytes and XXH64 of the whole file (header included).
//
// Dataset::open verifies everything before a step runs: schema, the manifest's own consistency, every shard's
// presence, size, header (magic, version, layout, count) and checksum, and every record (token_len in
// 0..text_len, token ids in 0..vocab_size-1, finite actions and state). Every failure is a formats::FormatError
// naming the file (manifest or shard), the sample where one is involved, and the reason.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/checksum.h"
#include "trainer/norm_stats.h"

namespace vlatune::trainer {

inline constexpr const char* kDatasetSchema = "vlatune.dataset/1";
inline constexpr uint32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 4096;
inline constexpr int64_t kPaddedActionDim = 32;  // the model's action width (spec §4.5); real dims are padded

// The fixed size of every record, from six dims. Sections are 4-byte aligned (ints and floats first, bytes last)
// and records are padded to 64 bytes so that every record starts on a cache line.
struct RecordLayout {
  int64_t cameras = 2;
  int64_t image_side = 224;  // as stored; the loader resizes to the model's image size
  int64_t text_len = 200;
  int64_t horizon = 50;
  int64_t action_dim = 7;  // real dims, before padding to kPaddedActionDim
  int64_t state_dim = 8;

  int64_t tokens_offset() const { return 0; }
  int64_t token_len_offset() const { return 4 * text_len; }
  int64_t actions_offset() const { return token_len_offset() + 4; }
  int64_t state_offset() const { return actions_offset() + 4 * horizon * action_dim; }
  int64_t images_offset() const { return state_offset() + 4 * state_dim; }
  int64_t image_bytes() const { return image_side * image_side * 3; }  // one camera, HWC
  int64_t record_bytes() const { return (images_offset() + cameras * image_bytes() + 63) / 64 * 64; }
  // Throws std::invalid_argument naming the dim when one is out of range.
  void validate() const;
  bool operator==(const RecordLayout& o) const;
};

// How the prompt tokens were made, so a loader can refuse a dataset whose ids exceed the model's vocabulary.
struct TokenizerInfo {
  std::string kind = "synthetic";  // "synthetic" | "sentencepiece"
  std::string model;               // SentencePiece model path as given at import ("" for synthetic)
  int64_t vocab_size = 0;          // ids are in [0, vocab_size)
  int64_t bos_id = -1;             // -1: none (synthetic)
  bool discrete_state = false;     // prompts carry the 256-bin state (spec §4.6)
};

struct ShardInfo {
  std::string file;  // relative to the dataset directory
  int64_t samples = 0;
  int64_t bytes = 0;
  std::string checksum;  // "xxh64:<16 hex>"
};

struct DatasetManifest {
  int64_t samples = 0;
  RecordLayout layout;
  std::vector<std::string> cameras;  // openpi slot names; a name containing "wrist" skips geometric augmentation
  TokenizerInfo tokenizer;
  NormStats norm;  // statistics of the raw values; stored records are already normalized
  nlohmann::json source = nlohmann::json::object();  // free-form provenance (kind, seed, directory, ...)
  std::vector<ShardInfo> shards;
};

nlohmann::json manifest_to_json(const DatasetManifest& manifest);
// Validating reader (unknown keys, types, ranges, consistency of the counts): FormatError with the JSON path.
DatasetManifest read_manifest(const std::string& path);

// One sample handed to the writer: pointers into the caller's memory, sizes from the layout.
struct SampleView {
  std::vector<const uint8_t*> images;  // one per camera: [side][side][3] uint8, upright
  const int32_t* tokens = nullptr;     // text_len ids, padding 0 after token_len
  int32_t token_len = 0;
  const float* actions = nullptr;  // [horizon][action_dim], normalized
  const float* state = nullptr;    // [state_dim], normalized
};

// Streams samples into shards. The sample count is fixed up front so each shard's header (covered by its
// checksum) is final before its first record: the checksum is computed while writing, nothing is read back.
class DatasetWriter {
 public:
  // `dir` must not exist or be an empty directory (an old manifest beside new shards would be worse than an
  // error). `manifest` supplies everything but samples and shards. Shards hold up to `shard_bytes` of records.
  // Throws std::invalid_argument (bad layout, counts) or std::runtime_error (I/O, naming the path).
  DatasetWriter(std::string dir, DatasetManifest manifest, int64_t total_samples, int64_t shard_bytes = 1LL << 30);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  void append(const SampleView& sample);
  // Closes the last shard (fsync) and writes manifest.json atomically; throws if fewer samples than promised.
  const DatasetManifest& finish();

 private:
  void open_shard();
  void close_shard();

  std::string dir_;
  DatasetManifest manifest_;
  int64_t total_;
  int64_t per_shard_;
  int64_t written_ = 0;
  int64_t in_shard_ = 0;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Xxh64> hash_;
  std::vector<uint8_t> record_;
  bool finished_ = false;
};

// A verified, read-only, memory-mapped dataset. Thread-safe: workers read records concurrently.
class Dataset {
 public:
  // Reads and verifies DATASET (see the file comment); throws formats::FormatError naming the file.
  static std::shared_ptr<const Dataset> open(const std::string& dir);
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const DatasetManifest& manifest() const { return manifest_; }
  const RecordLayout& layout() const { return manifest_.layout; }
  const std::string& dir() const { return dir_; }
  int64_t size() const { return manifest_.samples; }

  // The raw record of sample `index` in [0, size()) (std::out_of_range otherwise).
  const uint8_t* record(int64_t index) const;
  const int32_t* tokens(int64_t index) const;
  int32_t token_len(int64_t index) const;
  const float* actions(int64_t index) const;
  const float* state(int64_t index) const;
  const uint8_t* image(int64_t index, int64_t camera) const;

 private:
  Dataset() = default;
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
    int64_t first = 0;  // index of the shard's first sample
    int64_t samples = 0;
  };
  std::string dir_;
  DatasetManifest manifest_;
  std::vector<Mapping> maps_;
};

}  // namespace vlatune::trainer
