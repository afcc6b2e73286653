#include "trainer/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "trainer/file_util.h"

namespace vlatune::trainer {

using formats::FormatError;

namespace {

constexpr char kMagic[8] = {'V', 'L', 'A', 'T', 'S', 'H', 'R', 'D'};

// Header field offsets (see dataset.h). Written and read with memcpy at fixed offsets, never as a struct, so
// compiler padding can never change the file format.
enum HeaderOffset : size_t {
  kOffMagic = 0,
  kOffVersion = 8,
  kOffHeaderBytes = 12,
  kOffSamples = 16,
  kOffRecordBytes = 24,
  kOffShardIndex = 32,
  kOffDims = 40,      // 6 x u32: cameras, image_side, text_len, horizon, action_dim, state_dim
  kOffSections = 64,  // 5 x u64: tokens, token_len, actions, state, images offsets
};

template <typename T>
void put(std::vector<uint8_t>& buf, size_t off, T v) {
  std::memcpy(buf.data() + off, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* buf, size_t off) {
  T v;
  std::memcpy(&v, buf + off, sizeof(T));
  return v;
}

std::vector<int64_t> layout_dims(const RecordLayout& l) {
  return {l.cameras, l.image_side, l.text_len, l.horizon, l.action_dim, l.state_dim};
}
std::vector<int64_t> layout_sections(const RecordLayout& l) {
  return {l.tokens_offset(), l.token_len_offset(), l.actions_offset(), l.state_offset(), l.images_offset()};
}
const char* const kDimNames[6] = {"cameras", "image_side", "text_len", "horizon", "action_dim", "state_dim"};

std::vector<uint8_t> make_header(const RecordLayout& l, int64_t samples, int64_t shard_index) {
  std::vector<uint8_t> h(kShardHeaderBytes, 0);
  std::memcpy(h.data() + kOffMagic, kMagic, sizeof(kMagic));
  put<uint32_t>(h, kOffVersion, kShardVersion);
  put<uint32_t>(h, kOffHeaderBytes, static_cast<uint32_t>(kShardHeaderBytes));
  put<uint64_t>(h, kOffSamples, static_cast<uint64_t>(samples));
  put<uint64_t>(h, kOffRecordBytes, static_cast<uint64_t>(l.record_bytes()));
  put<uint64_t>(h, kOffShardIndex, static_cast<uint64_t>(shard_index));
  const auto dims = layout_dims(l);
  for (size_t i = 0; i < dims.size(); ++i) put<uint32_t>(h, kOffDims + 4 * i, static_cast<uint32_t>(dims[i]));
  const auto sections = layout_sections(l);
  for (size_t i = 0; i < sections.size(); ++i)
    put<uint64_t>(h, kOffSections + 8 * i, static_cast<uint64_t>(sections[i]));
  return h;
}

// Every header field against what the manifest implies; the first difference is the error.
void check_header(const std::string& file, const uint8_t* h, const RecordLayout& l, const ShardInfo& shard,
                  int64_t shard_index) {
  auto fail = [&](const std::string& why) { throw FormatError(file, "", "header: " + why); };
  if (std::memcmp(h + kOffMagic, kMagic, sizeof(kMagic)) != 0) fail("bad magic (not a vlatune dataset shard)");
  const auto version = get<uint32_t>(h, kOffVersion);
  if (version != kShardVersion)
    fail("version " + std::to_string(version) + ", this build reads version " + std::to_string(kShardVersion) +
         " (re-create the dataset with this vlatune)");
  const auto expect = [&](const char* what, uint64_t got, uint64_t want) {
    if (got != want)
      fail(std::string(what) + " is " + std::to_string(got) + ", manifest.json implies " + std::to_string(want));
  };
  expect("header size", get<uint32_t>(h, kOffHeaderBytes), kShardHeaderBytes);
  expect("sample count", get<uint64_t>(h, kOffSamples), static_cast<uint64_t>(shard.samples));
  expect("record size", get<uint64_t>(h, kOffRecordBytes), static_cast<uint64_t>(l.record_bytes()));
  expect("shard index", get<uint64_t>(h, kOffShardIndex), static_cast<uint64_t>(shard_index));
  const auto dims = layout_dims(l);
  for (size_t i = 0; i < dims.size(); ++i)
    expect(kDimNames[i], get<uint32_t>(h, kOffDims + 4 * i), static_cast<uint64_t>(dims[i]));
  const auto sections = layout_sections(l);
  for (size_t i = 0; i < sections.size(); ++i)
    expect("section offset", get<uint64_t>(h, kOffSections + 8 * i), static_cast<uint64_t>(sections[i]));
}

// Every record of a verified shard, field by field: a checksum proves the bytes are the ones written, not that the
// writer wrote sense. An out-of-vocabulary token id would otherwise surface as an index error deep inside the
// embedding, and a NaN action as a NaN loss many steps later.
void check_records(const std::string& file, const uint8_t* records, int64_t first_sample, const ShardInfo& shard,
                   const DatasetManifest& m) {
  const RecordLayout& l = m.layout;
  const int64_t vocab = m.tokenizer.vocab_size;
  for (int64_t i = 0; i < shard.samples; ++i) {
    const uint8_t* rec = records + i * l.record_bytes();
    auto fail = [&](const std::string& why) {
      throw FormatError(
          file, "",
          "sample " + std::to_string(i) + " (dataset index " + std::to_string(first_sample + i) + "): " + why);
    };
    const auto token_len = get<int32_t>(rec, static_cast<size_t>(l.token_len_offset()));
    if (token_len < 0 || token_len > l.text_len)
      fail("token_len " + std::to_string(token_len) + " outside 0.." + std::to_string(l.text_len) + " (text_len)");
    for (int64_t t = 0; t < l.text_len; ++t) {
      const auto id = get<int32_t>(rec, static_cast<size_t>(l.tokens_offset() + 4 * t));
      if (id < 0 || id >= vocab)
        fail("token " + std::to_string(t) + " is " + std::to_string(id) + ", outside the vocabulary 0.." +
             std::to_string(vocab - 1) + " (manifest.json $.tokenizer.vocab_size)");
    }
    for (int64_t k = 0; k < l.horizon * l.action_dim; ++k)
      if (!std::isfinite(get<float>(rec, static_cast<size_t>(l.actions_offset() + 4 * k))))
        fail("action value " + std::to_string(k) + " is not finite");
    for (int64_t k = 0; k < l.state_dim; ++k)
      if (!std::isfinite(get<float>(rec, static_cast<size_t>(l.state_offset() + 4 * k))))
        fail("state value " + std::to_string(k) + " is not finite");
  }
}

bool is_checksum_text(const std::string& s) {
  if (s.size() != 22 || s.rfind("xxh64:", 0) != 0) return false;
  return std::all_of(s.begin() + 6, s.end(), [](char c) { return std::isxdigit(c) && !std::isupper(c); });
}

}  // namespace

void RecordLayout::validate() const {
  auto check = [](const char* name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw std::invalid_argument(std::string("dataset layout: ") + name + " must be in " + std::to_string(lo) + ".." +
                                  std::to_string(hi) + ", got " + std::to_string(v));
  };
  check("cameras", cameras, 1, 16);
  check("image_side", image_side, 1, 4096);
  check("text_len", text_len, 1, 65536);
  check("horizon", horizon, 1, 4096);
  check("action_dim", action_dim, 1, kPaddedActionDim);
  check("state_dim", state_dim, 0, 4096);
}

bool RecordLayout::operator==(const RecordLayout& o) const {
  return layout_dims(*this) == layout_dims(o);
}

nlohmann::json manifest_to_json(const DatasetManifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : m.shards)
    shards.push_back({{"file", s.file}, {"samples", s.samples}, {"bytes", s.bytes}, {"checksum", s.checksum}});
  const auto& l = m.layout;
  return {{"schema", kDatasetSchema},
          {"samples", m.samples},
          {"cameras", m.cameras},
          {"image_side", l.image_side},
          {"text_len", l.text_len},
          {"horizon", l.horizon},
          {"action_dim", l.action_dim},
          {"action_dim_padded", kPaddedActionDim},
          {"state_dim", l.state_dim},
          {"record_bytes", l.record_bytes()},
          {"tokenizer",
           {{"kind", m.tokenizer.kind},
            {"model", m.tokenizer.model},
            {"vocab_size", m.tokenizer.vocab_size},
            {"bos_id", m.tokenizer.bos_id},
            {"discrete_state", m.tokenizer.discrete_state}}},
          {"norm_stats",
           {{"actions", quantile_stats_to_json(m.norm.actions)}, {"state", quantile_stats_to_json(m.norm.state)}}},
          {"source", m.source},
          {"shards", shards}};
}

DatasetManifest read_manifest(const std::string& path) {
  const nlohmann::json j = formats::read_json_file(path);
  const formats::JsonCursor root(j, path);
  root.expect_object({"schema", "samples", "cameras", "image_side", "text_len", "horizon", "action_dim",
                      "action_dim_padded", "state_dim", "record_bytes", "tokenizer", "norm_stats", "source", "shards"});
  const auto schema = root.at("schema");
  if (schema.get_string() != kDatasetSchema)
    schema.fail(std::string("expected \"") + kDatasetSchema + "\", got " + formats::describe_json(schema.value()));

  DatasetManifest m;
  m.samples = root.at("samples").get_int(1);
  const auto cams = root.at("cameras");
  const size_t n_cams = cams.expect_array();
  if (n_cams < 1 || n_cams > 16) cams.fail("expected 1..16 camera names, got " + std::to_string(n_cams));
  for (size_t i = 0; i < n_cams; ++i) m.cameras.push_back(cams.element(i).get_nonempty_string());
  auto& l = m.layout;
  l.cameras = static_cast<int64_t>(n_cams);
  l.image_side = root.at("image_side").get_int(1, 4096);
  l.text_len = root.at("text_len").get_int(1, 65536);
  l.horizon = root.at("horizon").get_int(1, 4096);
  l.action_dim = root.at("action_dim").get_int(1, kPaddedActionDim);
  root.at("action_dim_padded").get_int(kPaddedActionDim, kPaddedActionDim);
  l.state_dim = root.at("state_dim").get_int(0, 4096);
  const auto record_bytes = root.at("record_bytes");
  if (record_bytes.get_int(1) != l.record_bytes())
    record_bytes.fail("is " + std::to_string(record_bytes.get_int()) + ", the dims above give " +
                      std::to_string(l.record_bytes()));

  const auto tok = root.at("tokenizer");
  tok.expect_object({"kind", "model", "vocab_size", "bos_id", "discrete_state"});
  m.tokenizer.kind = tok.at("kind").get_enum({"synthetic", "sentencepiece"});
  m.tokenizer.model = tok.at("model").get_string();
  m.tokenizer.vocab_size = tok.at("vocab_size").get_int(1);
  m.tokenizer.bos_id = tok.at("bos_id").get_int(-1, m.tokenizer.vocab_size - 1);
  m.tokenizer.discrete_state = tok.at("discrete_state").get_bool();

  const auto norm = root.at("norm_stats");
  norm.expect_object({"actions", "state"});
  m.norm.actions = read_quantile_stats(norm.at("actions"), l.action_dim);
  m.norm.state = read_quantile_stats(norm.at("state"), l.state_dim);

  const auto source = root.at("source");
  if (!source.value().is_object()) source.fail("expected an object, got " + formats::describe_json(source.value()));
  m.source = source.value();

  const auto shards = root.at("shards");
  const size_t n_shards = shards.expect_array();
  if (n_shards == 0) shards.fail("expected at least one shard");
  int64_t total = 0;
  for (size_t i = 0; i < n_shards; ++i) {
    const auto s = shards.element(i);
    s.expect_object({"file", "samples", "bytes", "checksum"});
    ShardInfo info;
    const auto file = s.at("file");
    info.file = file.get_nonempty_string();
    // Shards live inside the dataset directory: a path would let a manifest point anywhere.
    if (info.file.find('/') != std::string::npos || info.file == "." || info.file == "..")
      file.fail("expected a file name inside the dataset directory, got \"" + info.file + "\"");
    info.samples = s.at("samples").get_int(1);
    const auto bytes = s.at("bytes");
    info.bytes = bytes.get_int(0);
    const int64_t want = kShardHeaderBytes + info.samples * l.record_bytes();
    if (info.bytes != want)
      bytes.fail("is " + std::to_string(info.bytes) + ", but " + std::to_string(info.samples) + " records of " +
                 std::to_string(l.record_bytes()) + " bytes + header make " + std::to_string(want));
    const auto checksum = s.at("checksum");
    info.checksum = checksum.get_string();
    if (!is_checksum_text(info.checksum))
      checksum.fail("expected \"xxh64:\" + 16 lower-case hex digits, got \"" + info.checksum + "\"");
    total += info.samples;
    m.shards.push_back(std::move(info));
  }
  if (total != m.samples)
    root.at("samples").fail("is " + std::to_string(m.samples) + ", but the shards hold " + std::to_string(total));
  return m;
}

// ---------------------------------------------------------------------------------------------------- writer

DatasetWriter::DatasetWriter(std::string dir, DatasetManifest manifest, int64_t total_samples, int64_t shard_bytes)
    : dir_(std::move(dir)), manifest_(std::move(manifest)), total_(total_samples) {
  const auto& l = manifest_.layout;
  l.validate();
  if (static_cast<int64_t>(manifest_.cameras.size()) != l.cameras)
    throw std::invalid_argument("dataset writer: " + std::to_string(manifest_.cameras.size()) + " camera names for " +
                                std::to_string(l.cameras) + " cameras");
  if (static_cast<int64_t>(manifest_.norm.actions.q01.size()) != l.action_dim ||
      static_cast<int64_t>(manifest_.norm.state.q01.size()) != l.state_dim)
    throw std::invalid_argument("dataset writer: normalization statistics do not match action_dim/state_dim");
  if (total_ < 1) throw std::invalid_argument("dataset writer: need at least one sample");
  per_shard_ = std::max<int64_t>(1, shard_bytes / l.record_bytes());
  if (!is_fresh_output(dir_))
    throw std::runtime_error(dir_ + ": exists and is not an empty directory (choose a new output directory)");
  make_directories(dir_);
  manifest_.samples = total_;
  manifest_.shards.clear();
  record_.assign(static_cast<size_t>(l.record_bytes()), 0);
}

DatasetWriter::~DatasetWriter() {
  if (file_ != nullptr) std::fclose(file_);  // abandoned: no manifest is written, so the directory is not a dataset
}

void DatasetWriter::open_shard() {
  const auto index = static_cast<int64_t>(manifest_.shards.size());
  char name[32];
  std::snprintf(name, sizeof(name), "shard-%05lld.bin", static_cast<long long>(index));
  ShardInfo info;
  info.file = name;
  info.samples = std::min(per_shard_, total_ - written_);
  info.bytes = kShardHeaderBytes + info.samples * manifest_.layout.record_bytes();
  const std::string path = join_path(dir_, name);
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  hash_ = std::make_unique<Xxh64>();
  const auto header = make_header(manifest_.layout, info.samples, index);
  hash_->update(header.data(), header.size());
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size())
    throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
  manifest_.shards.push_back(std::move(info));
  in_shard_ = 0;
}

void DatasetWriter::close_shard() {
  auto& info = manifest_.shards.back();
  const std::string path = join_path(dir_, info.file);
  const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int err = errno;
  std::fclose(file_);
  file_ = nullptr;
  if (!ok) throw std::runtime_error(path + ": write failed: " + std::strerror(err));
  info.checksum = format_checksum(hash_->digest());
}

void DatasetWriter::append(const SampleView& s) {
  if (finished_ || written_ >= total_)
    throw std::logic_error("dataset writer: more samples than the " + std::to_string(total_) + " announced");
  const auto& l = manifest_.layout;
  if (static_cast<int64_t>(s.images.size()) != l.cameras || s.tokens == nullptr || s.actions == nullptr ||
      (l.state_dim > 0 && s.state == nullptr))
    throw std::invalid_argument("dataset writer: sample is missing a camera, tokens, actions or state");
  if (s.token_len < 0 || s.token_len > l.text_len)
    throw std::invalid_argument("dataset writer: token_len " + std::to_string(s.token_len) + " outside 0.." +
                                std::to_string(l.text_len));
  if (file_ == nullptr) open_shard();
  uint8_t* r = record_.data();
  std::memcpy(r + l.tokens_offset(), s.tokens, 4 * l.text_len);
  std::memcpy(r + l.token_len_offset(), &s.token_len, 4);
  std::memcpy(r + l.actions_offset(), s.actions, 4 * l.horizon * l.action_dim);
  if (l.state_dim > 0) std::memcpy(r + l.state_offset(), s.state, 4 * l.state_dim);
  for (int64_t c = 0; c < l.cameras; ++c)
    std::memcpy(r + l.images_offset() + c * l.image_bytes(), s.images[c], l.image_bytes());
  hash_->update(r, record_.size());
  if (std::fwrite(r, 1, record_.size(), file_) != record_.size())
    throw std::runtime_error(dir_ + "/" + manifest_.shards.back().file + ": write failed: " + std::strerror(errno));
  ++written_;
  if (++in_shard_ == manifest_.shards.back().samples) close_shard();
}

const DatasetManifest& DatasetWriter::finish() {
  if (written_ != total_)
    throw std::logic_error("dataset writer: " + std::to_string(written_) + " samples written, " +
                           std::to_string(total_) + " announced");
  if (!finished_) {
    formats::write_file_atomic(join_path(dir_, "manifest.json"), formats::dump_json_file(manifest_to_json(manifest_)));
    finished_ = true;
  }
  return manifest_;
}

// ---------------------------------------------------------------------------------------------------- reader

std::shared_ptr<const Dataset> Dataset::open(const std::string& dir) {
  std::shared_ptr<Dataset> ds(new Dataset());
  ds->dir_ = dir;
  ds->manifest_ = read_manifest(join_path(dir, "manifest.json"));
  const auto& m = ds->manifest_;
  ds->maps_.resize(m.shards.size());

  // Each shard: open, size, map, header, checksum. Shards are verified in parallel (the checksum reads every
  // byte; on a multi-GB dataset this is disk-bound and benefits from several readers); the first failure in
  // shard order is reported.
  std::vector<std::exception_ptr> errors(m.shards.size());
  auto verify = [&](size_t i) {
    const auto& shard = m.shards[i];
    const std::string path = join_path(dir, shard.file);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block: refused below
    if (fd < 0) {
      const std::string why = errno == ENOENT
                                  ? "missing shard file (listed in manifest.json $.shards[" + std::to_string(i) + "])"
                                  : std::string("cannot open: ") + std::strerror(errno);
      throw FormatError(path, "", why);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw FormatError(path, "", "not a regular file");
    }
    if (st.st_size != shard.bytes) {
      ::close(fd);
      throw FormatError(path, "",
                        "size is " + std::to_string(st.st_size) + " bytes, manifest.json says " +
                            std::to_string(shard.bytes) + (st.st_size < shard.bytes ? " (truncated)" : ""));
    }
    void* base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);  // the mapping keeps the file open
    if (base == MAP_FAILED) throw FormatError(path, "", std::string("cannot mmap: ") + std::strerror(errno));
    auto& map = ds->maps_[i];
    map.base = base;
    map.bytes = static_cast<size_t>(st.st_size);
    map.samples = shard.samples;
    check_header(path, static_cast<const uint8_t*>(base), m.layout, shard, static_cast<int64_t>(i));
    const std::string actual = format_checksum(xxh64(base, map.bytes));
    if (actual != shard.checksum)
      throw FormatError(path, "",
                        "checksum " + actual + " does not match manifest.json's " + shard.checksum +
                            " (the file is corrupt or was modified)");
    int64_t first = 0;
    for (size_t k = 0; k < i; ++k) first += m.shards[k].samples;
    check_records(path, static_cast<const uint8_t*>(base) + kShardHeaderBytes, first, shard, m);
  };
  const size_t threads = std::min<size_t>(m.shards.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (size_t i = t; i < m.shards.size(); i += threads) {
        try {
          verify(i);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);

  int64_t first = 0;
  for (auto& map : ds->maps_) {
    map.first = first;
    first += map.samples;
  }
  return ds;
}

Dataset::~Dataset() {
  for (auto& map : maps_)
    if (map.base != nullptr) ::munmap(map.base, map.bytes);
}

const uint8_t* Dataset::record(int64_t index) const {
  if (index < 0 || index >= manifest_.samples)
    throw std::out_of_range("dataset " + dir_ + ": sample " + std::to_string(index) + " outside 0.." +
                            std::to_string(manifest_.samples - 1));
  // The shard whose first sample is the last one <= index.
  auto it =
      std::upper_bound(maps_.begin(), maps_.end(), index, [](int64_t i, const Mapping& m) { return i < m.first; });
  const Mapping& map = *(it - 1);
  return static_cast<const uint8_t*>(map.base) + kShardHeaderBytes + (index - map.first) * layout().record_bytes();
}

const int32_t* Dataset::tokens(int64_t index) const {
  return reinterpret_cast<const int32_t*>(record(index) + layout().tokens_offset());
}

int32_t Dataset::token_len(int64_t index) const {
  int32_t n;
  std::memcpy(&n, record(index) + layout().token_len_offset(), 4);
  return n;
}

const float* Dataset::actions(int64_t index) const {
  return reinterpret_cast<const float*>(record(index) + layout().actions_offset());
}

const float* Dataset::state(int64_t index) const {
  return reinterpret_cast<const float*>(record(index) + layout().state_offset());
}

const uint8_t* Dataset::image(int64_t index, int64_t camera) const {
  return record(index) + layout().images_offset() + camera * layout().image_bytes();
}

}  // namespace vlatune::trainer
