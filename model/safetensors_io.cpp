// safetensors reader and writer. Layout and validation rules: model/safetensors_io.h.
#include "model/safetensors_io.h"

#include "formats/file_io.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors_io assumes a little-endian host (the format's byte order): data is copied without swapping"
#endif

namespace vlatune::model {

namespace {

// The reference implementation's limit (safetensors/src/tensor.rs MAX_HEADER_SIZE): a header this large means a
// corrupt length field, not a real checkpoint (the 3.3B-parameter pi05 header is well under 1 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeInfo {
  const char* name;
  c10::ScalarType scalar_type;
  uint64_t itemsize;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", c10::ScalarType::Float, 4}, {"BF16", c10::ScalarType::BFloat16, 2}, {"F16", c10::ScalarType::Half, 2},
    {"I64", c10::ScalarType::Long, 8},  {"I32", c10::ScalarType::Int, 4},       {"U8", c10::ScalarType::Byte, 1},
    {"BOOL", c10::ScalarType::Bool, 1},
};

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}
const DtypeInfo* find_dtype(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (t == d.scalar_type) return &d;
  }
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const auto& d : kDtypes) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::string errno_str(int err) {
  return std::strerror(err);
}

// pread until n bytes arrived; false on a short file or an error (errno set, 0 for end of file).
bool pread_all(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got, n -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
  return true;
}

class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Parses the header text, recording the first key that appears twice in one object: nlohmann keeps the last value
// of a duplicate silently, and a tensor listed twice is a defect of the file, not something to guess about.
nlohmann::json parse_header_json(const std::string& text, std::string* duplicate) {
  struct Open {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Open> open_objects;
  nlohmann::json::parser_callback_t cb = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                                             nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      Open& top = open_objects.back();
      if (!top.keys.insert(key).second && duplicate->empty()) {
        *duplicate = open_objects.size() == 1
                         ? "header lists the key '" + key + "' twice"
                         : "header entry '" + open_objects.front().last_key + "' lists the key '" + key + "' twice";
      }
      top.last_key = key;
    }
    return true;
  };
  return nlohmann::json::parse(text, cb);  // throws nlohmann::json::parse_error
}

// Reads a JSON integer >= 0 (nlohmann stores non-negative literals as unsigned, negative ones as signed, and
// anything beyond 64 bits or with a fraction/exponent as float, which is rejected here).
bool as_u64(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// A JSON value for an error message: scalars as written (cut at 40 characters), containers by type only, since
// dumping an arbitrarily nested value from a hostile header could recurse deep enough to overflow the stack.
std::string brief(const nlohmann::json& j) {
  if (j.is_structured()) return std::string("an ") + (j.is_array() ? "array" : "object");
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

}  // namespace

SafetensorsError::SafetensorsError(std::string file, std::string reason)
    : std::runtime_error(file + ": " + reason), file_(std::move(file)), reason_(std::move(reason)) {}

struct SafetensorsFile::Mapping {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  Mapping(const uint8_t* d, uint64_t s) : data(d), size(s) {}
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto fail = [&](const std::string& reason) { return SafetensorsError(path, reason); };

  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; it is refused below.
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw fail("cannot open: " + errno_str(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw fail("cannot stat: " + errno_str(errno));
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file (a FIFO, device, socket or directory)");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  if (file_size < 8) {
    throw fail("truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length field");
  }
  uint8_t len_bytes[8];
  if (!pread_all(fd.get(), len_bytes, 8, 0)) throw fail("cannot read the header length: " + errno_str(errno));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian u64
  if (header_len > kMaxHeaderBytes) {
    throw fail("header length " + std::to_string(header_len) + " bytes is absurd (limit " +
               std::to_string(kMaxHeaderBytes) + "): corrupt length field or not a safetensors file");
  }
  if (header_len > file_size - 8) {
    throw fail("truncated: header length " + std::to_string(header_len) + " bytes exceeds the " +
               std::to_string(file_size - 8) + " bytes after the length field");
  }
  std::string text(header_len, '\0');
  if (!pread_all(fd.get(), text.data(), header_len, 8)) throw fail("cannot read the header: " + errno_str(errno));

  nlohmann::json header;
  std::string duplicate;
  try {
    header = parse_header_json(text, &duplicate);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail(std::string("header is not a JSON object (it is a ") + header.type_name() + ")");
  if (!duplicate.empty()) throw fail(duplicate);

  SafetensorsFile file;
  file.path_ = path;
  file.buffer_start_ = 8 + header_len;
  const uint64_t buffer_size = file_size - file.buffer_start_;

  for (const auto& item : header.items()) {
    // Plain references, not a structured binding: a lambda below captures the name (C++20 for bindings).
    const std::string& name = item.key();
    const nlohmann::json& value = item.value();
    if (name == kMetadataKey) {
      if (!value.is_object()) throw fail("__metadata__ is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) throw fail("__metadata__ value of '" + key + "' is not a string (" + v.type_name() + ")");
        file.metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& reason) {
      return fail(std::string("tensor '").append(name).append("': ") + reason);
    };
    if (!value.is_object()) throw bad(std::string("entry is not a JSON object (it is a ") + value.type_name() + ")");
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) throw bad(std::string("entry has no '") + key + "'");
    }

    SafetensorsEntry e;
    e.name = name;
    const auto& dtype = value.at("dtype");
    if (!dtype.is_string()) throw bad(std::string("'dtype' is not a string (") + dtype.type_name() + ")");
    e.dtype = dtype.get<std::string>();
    const DtypeInfo* info = find_dtype(e.dtype);
    if (info == nullptr) throw bad("unsupported dtype '" + e.dtype + "' (supported: " + supported_list() + ")");

    const auto& shape = value.at("shape");
    if (!shape.is_array()) throw bad(std::string("'shape' is not an array (") + shape.type_name() + ")");
    // nbytes = numel * itemsize. `bound` is the same product with zero dims counted as 1: it must fit in int64
    // too, or a [0, 2^40, 2^40] entry (0 bytes, harmless-looking) would overflow torch's own size arithmetic.
    uint64_t nbytes = info->itemsize, bound = info->itemsize;
    for (size_t i = 0; i < shape.size(); ++i) {
      const auto& d = shape[i];
      if (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0) {
        throw bad("negative dimension " + std::to_string(d.get<int64_t>()) + " at shape[" + std::to_string(i) + "]");
      }
      uint64_t dim = 0;
      if (!as_u64(d, &dim)) throw bad("shape[" + std::to_string(i) + "] is not an integer (" + brief(d) + ")");
      if (__builtin_mul_overflow(bound, std::max<uint64_t>(dim, 1), &bound) ||
          bound > static_cast<uint64_t>(INT64_MAX)) {
        throw bad("shape[" + std::to_string(i) + "] = " + std::to_string(dim) + " overflows 64-bit sizes");
      }
      nbytes *= dim;  // <= bound: cannot overflow
      e.shape.push_back(static_cast<int64_t>(dim));
    }

    const auto& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2 || !as_u64(offsets[0], &e.begin) || !as_u64(offsets[1], &e.end)) {
      throw bad("'data_offsets' is not two non-negative integers (" +
                (offsets.is_array() ? "an array of " + std::to_string(offsets.size()) : brief(offsets)) + ")");
    }
    if (e.begin > e.end) {
      throw bad("data_offsets reversed: begin " + std::to_string(e.begin) + " > end " + std::to_string(e.end));
    }
    if (e.end > buffer_size) {
      throw bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                "] out of range: the data buffer has " + std::to_string(buffer_size) +
                " bytes (file truncated or offsets corrupt)");
    }
    if (e.end - e.begin != nbytes) {
      throw bad("data_offsets span " + std::to_string(e.end - e.begin) + " bytes, but " + e.dtype + " " +
                shape_str(e.shape) + " needs " + std::to_string(nbytes));
    }
    file.index_[name] = file.entries_.size();
    file.entries_.push_back(std::move(e));
  }

  // No two tensors may share bytes. Gaps and trailing bytes are tolerated (the reference reader rejects them, but
  // they are harmless to read); empty tensors occupy nothing.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : file.entries_) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = *by_offset[i - 1];
    const auto& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      throw fail("tensors '" + prev.name + "' [" + std::to_string(prev.begin) + ", " + std::to_string(prev.end) +
                 ") and '" + cur.name + "' [" + std::to_string(cur.begin) + ", " + std::to_string(cur.end) +
                 ") overlap");
    }
  }

  // Map the whole file once; tensor() copies out of it. MAP_PRIVATE + PROT_READ: nothing can write through it.
  void* p = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) throw fail("cannot mmap " + std::to_string(file_size) + " bytes: " + errno_str(errno));
  file.mapping_ = std::make_shared<const Mapping>(static_cast<const uint8_t*>(p), file_size);
  return file;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    throw SafetensorsError(path_,
                           "no tensor '" + name + "' (the file holds " + std::to_string(entries_.size()) + " tensors)");
  }
  return entries_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const DtypeInfo* info = find_dtype(e.dtype);  // validated on open
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(info->scalar_type));
  const uint64_t nbytes = e.end - e.begin;
  if (nbytes == 0) return t;
  const uint8_t* src = mapping_->data + buffer_start_ + e.begin;
  if (info->scalar_type == c10::ScalarType::Bool) {
    // A bool byte other than 0 or 1 is undefined behaviour for every kernel that reads it.
    for (uint64_t i = 0; i < nbytes; ++i) {
      if (src[i] > 1) {
        throw SafetensorsError(path_, "tensor '" + name + "': BOOL element " + std::to_string(i) + " is " +
                                          std::to_string(src[i]) + ", not 0 or 1");
      }
    }
  }
  std::memcpy(t.data_ptr(), src, nbytes);
  return t;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto fail = [&](const std::string& reason) { return SafetensorsError(path, reason); };

  // Validate everything and lay out the buffer before touching the disk.
  struct Item {
    const std::string* name;
    const at::Tensor* tensor;
    const DtypeInfo* info;
    uint64_t nbytes, begin = 0;
  };
  std::vector<Item> items;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) throw fail("a tensor has an empty name");
    if (name == kMetadataKey) throw fail("'__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(name).second) throw fail("tensor '" + name + "' is given twice");
    if (!t.defined()) throw fail("tensor '" + name + "' is undefined");
    if (t.layout() != c10::kStrided) throw fail("tensor '" + name + "' is not dense (sparse or other layout)");
    const DtypeInfo* info = find_dtype(t.scalar_type());
    if (info == nullptr) {
      throw fail("tensor '" + name + "': unsupported dtype " + std::string(c10::toString(t.scalar_type())) +
                 " (supported: " + supported_list() + ")");
    }
    items.push_back({&name, &t, info, static_cast<uint64_t>(t.numel()) * info->itemsize});
  }
  // No gaps between tensors (the reference reader requires the offsets to tile the buffer exactly), so 8-byte
  // padding per tensor is not allowed; ordering by element size, largest first, aligns every tensor to its own
  // element size instead, given that the buffer starts 8-byte aligned. Stable: otherwise the order given.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.info->itemsize > b.info->itemsize; });
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (auto& it : items) {
    it.begin = offset;
    offset += it.nbytes;
    header[*it.name] = {{"dtype", it.info->name},
                        {"shape", it.tensor->sizes().vec()},
                        {"data_offsets", {it.begin, it.begin + it.nbytes}}};
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N is a multiple of 8: the buffer starts aligned
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // Atomic replace (formats::AtomicFile): a crash or a failed write leaves either the old file or the new one, never
  // a torn checkpoint; write failures (disk full, ...) are formats::WriteError naming the file and the OS error.
  formats::AtomicFile out(path);
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  for (const auto& it : items) {
    if (it.nbytes == 0) continue;
    // One tensor at a time on the host: saving a GPU model never needs a second full copy in host memory.
    at::Tensor cpu;
    try {
      cpu = it.tensor->detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
    } catch (const std::exception& e) {
      throw fail("tensor '" + *it.name + "': cannot copy to the CPU: " + e.what());  // `out` removes its file
    }
    out.write(cpu.data_ptr(), it.nbytes);
  }
  out.commit();
}

}  // namespace vlatune::model
