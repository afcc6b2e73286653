// safetensors reader and writer (https://github.com/huggingface/safetensors, "Format"), our own, on nlohmann_json.
//
//   [u64 little-endian N][N bytes of JSON header][byte buffer]
//   header: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<value>"}}        offsets relative to the buffer start
//
// Supported dtypes: F32, BF16, F16, I64, I32, U8, BOOL. Every defect of a file (truncation, bad header, bad entry,
// offsets out of range, overlapping or of the wrong size, unsupported dtype) throws SafetensorsError naming the
// file, the reason and, where one is involved, the tensor. Reading never crashes and never reads out of bounds.
// The state-dict side (load into / save from a torch::nn::Module) is model/state_dict.h.
#pragma once

#include <ATen/core/Tensor.h>  // at::Tensor == torch::Tensor; narrower than torch/torch.h

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vlatune::model {

// what() reads "<file>: <reason>"; the reason names the tensor when one is involved.
class SafetensorsError : public std::runtime_error {
 public:
  SafetensorsError(std::string file, std::string reason);
  const std::string& file() const { return file_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string file_, reason_;
};

// One tensor of the header, validated. begin/end are byte offsets into the buffer (after the header).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ... as in the file
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// A parsed and validated file. The file is memory-mapped read-only; tensor() copies out of the mapping, so the
// returned tensors own their memory. Copies of a SafetensorsFile share the mapping. Do not truncate or rewrite
// the file in place while it is open (write_safetensors never does: it renames a new file over the old one).
class SafetensorsFile {
 public:
  // Parses and validates the whole header; throws SafetensorsError (file name + reason) on any defect.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in header (name) order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // unknown name: SafetensorsError

  // A CPU tensor holding a copy of the data, dtype mapped (BF16 -> kBFloat16, BOOL -> kBool, ...).
  // Unknown name: SafetensorsError naming it and the file. BOOL bytes other than 0/1 are rejected.
  at::Tensor tensor(const std::string& name) const;

 private:
  struct Mapping;  // the mmap of the whole file
  SafetensorsFile() = default;

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const Mapping> mapping_;
  uint64_t buffer_start_ = 0;  // 8 + header length
};

// Writes `tensors` (any device, any strides; each is copied to a contiguous CPU tensor one at a time) and
// `metadata` to `path` atomically (formats::AtomicFile: a temporary file in the same directory, fsync, rename over
// `path`; a failed write removes it and throws formats::WriteError naming the file and the OS error).
// The header is padded with spaces so that the buffer starts 8-byte aligned. The data is laid out without gaps
// (the reference implementation rejects gaps), ordered by element size, largest first, and otherwise in the order
// given: every tensor is then aligned to its element size. Names must be unique, non-empty and not
// "__metadata__"; dtypes must be supported; tensors must be dense. Violations throw SafetensorsError, before
// anything is written.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace vlatune::model
