#include "formats/tensorboard_events.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "formats/file_io.h"
#include "formats/json_error.h"
#include "formats/tensorboard_event.pb.h"

namespace vlatune::formats {

namespace {

// An event file of a very long run is a few MB; anything near this is not one.
constexpr uint64_t kMaxEventFileBytes = 1ull << 30;
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data

void put_le(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return value;
}

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  // ISA-L's crc32_iscsi takes and returns the register without the standard's pre- and post-inversion. Its length
  // is an int: feed it in pieces.
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  while (bytes > 0) {
    const size_t piece = bytes < (size_t{1} << 30) ? bytes : (size_t{1} << 30);
    crc = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(piece), crc);
    p += piece;
    bytes -= piece;
  }
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  out.reserve(kHeaderBytes + data.size() + kFooterBytes);
  put_le(&out, data.size(), 8);
  put_le(&out, masked_crc32c(out.data(), 8), 4);
  out += data;
  put_le(&out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir, double wall_time) {
  // The counter keeps two writers of one process in one second apart.
  static std::atomic<int> opened{0};
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." + host_name() + "." +
          std::to_string(::getpid()) + "." + std::to_string(opened.fetch_add(1));
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw WriteError(path_, std::string("cannot create: ") + std::strerror(errno));
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(kEventFileVersion);
  append(event.SerializeAsString());
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (const WriteError&) {
    // Destruction during unwinding must not throw; flush() is where callers learn of write failures.
  }
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::add_scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("scalars");
  v->set_simple_value(static_cast<float>(value));
  append(event.SerializeAsString());
}

void EventFileWriter::add_session_start(int64_t step, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  append(event.SerializeAsString());
}

void EventFileWriter::append(const std::string& event_bytes) {
  pending_ += frame_record(event_bytes);
}

void EventFileWriter::flush() {
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      pending_.erase(0, done);
      throw WriteError(path_, std::string("cannot write: ") + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  pending_.clear();
}

void add_metrics_row(EventFileWriter* writer, const MetricsRow& row, double wall_time) {
  const std::pair<const char*, double> scalars[] = {
      {"train/loss", row.loss},
      {"train/grad_norm", row.grad_norm},
      {"train/lr", row.lr},
      {"train/samples_per_s", row.samples_per_s},
      {"train/step_ms", row.step_ms},
      {"train/data_wait_ms", row.data_wait_ms},
      {"train/peak_gib", row.peak_gib},
  };
  for (const auto& [tag, value] : scalars)
    if (std::isfinite(value)) writer->add_scalar(tag, row.step, value, wall_time);
}

EventFileContents read_event_file(const std::string& path) {
  const std::string bytes = read_text_file(path, kMaxEventFileBytes);
  EventFileContents out;
  size_t at = 0;
  for (int64_t record = 0; at < bytes.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + " at byte " + std::to_string(at);
    if (bytes.size() - at < kHeaderBytes) throw FormatError(path, where, "truncated record header");
    const uint64_t length = get_le(bytes.data() + at, 8);
    if (get_le(bytes.data() + at + 8, 4) != masked_crc32c(bytes.data() + at, 8))
      throw FormatError(path, where, "length CRC mismatch");
    if (length > bytes.size() - at - kHeaderBytes || bytes.size() - at - kHeaderBytes - length < kFooterBytes)
      throw FormatError(path, where, "truncated record (" + std::to_string(length) + " bytes of data announced)");
    const char* data = bytes.data() + at + kHeaderBytes;
    if (get_le(data + length, 4) != masked_crc32c(data, length)) throw FormatError(path, where, "data CRC mismatch");
    tensorboard::Event event;
    if (!event.ParseFromArray(data, static_cast<int>(length))) throw FormatError(path, where, "not an Event message");
    if (record == 0) {
      if (event.what_case() != tensorboard::Event::kFileVersion || event.file_version() != kEventFileVersion)
        throw FormatError(path, where, "first event must hold file_version \"" + std::string(kEventFileVersion) + "\"");
      out.file_version = event.file_version();
    } else if (event.what_case() == tensorboard::Event::kSummary) {
      for (const auto& v : event.summary().value())
        if (v.value_case() == tensorboard::Summary::Value::kSimpleValue)
          out.scalars.push_back({v.tag(), event.step(), event.wall_time(), v.simple_value()});
    } else if (event.what_case() == tensorboard::Event::kSessionLog &&
               event.session_log().status() == tensorboard::SessionLog::START) {
      out.session_starts.push_back(event.step());
    }
    at += kHeaderBytes + length + kFooterBytes;
  }
  if (out.file_version.empty()) throw FormatError(path, "record 0 at byte 0", "empty event file");
  return out;
}

}  // namespace vlatune::formats
