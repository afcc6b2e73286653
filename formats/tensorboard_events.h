// TensorBoard event files: the scalars `train` writes beside metrics.jsonl, in the format TensorBoard reads
// (`tensorboard --logdir RUN_DIR`). A file is a sequence of TFRecord records, each
//   uint64 length (little-endian) | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of the data
// whose data is one serialized tensorflow.Event (formats/tensorboard_event.proto, protobuf-lite). The first event
// holds the file version "brain.Event:2"; each scalar is an Event with a one-value Summary (simple_value). The
// format's own version is that file version; the reader refuses any other.
// Torch-free; built where protobuf and ISA-L (CRC32C) are found (VLATUNE_HAVE_TENSORBOARD).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/metrics_jsonl.h"

namespace vlatune::formats {

inline constexpr const char* kEventFileVersion = "brain.Event:2";

// CRC32C (Castagnoli) of `bytes`, and TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8, which keeps
// a CRC of data that embeds CRCs from being trivially predictable.
uint32_t crc32c(const void* data, size_t bytes);
uint32_t masked_crc32c(const void* data, size_t bytes);

// One TFRecord record around `data` (length, masked CRC of the length, data, masked CRC of the data).
std::string frame_record(const std::string& data);

// Appends events to a new file DIR/events.out.tfevents.<seconds>.<host>.<pid>.<n> (TensorBoard reads every file whose
// name holds "tfevents"; a resumed run starts another, and its session start drops what earlier files hold from
// the resume step on). Events are buffered and reach the file at flush() (and at destruction). Failures (creating
// or writing the file) are WriteError naming the file and the OS error.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& dir, double wall_time);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // wall_time: seconds since the Unix epoch. Non-finite values are written as they are (TensorBoard shows them).
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time);
  // The run (re)starts at `step`: TensorBoard discards events of earlier files with step >= `step`.
  void add_session_start(int64_t step, double wall_time);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);

  std::string path_;
  int fd_ = -1;
  std::string pending_;
};

// A metrics.jsonl training row as scalars at its step: train/loss, train/grad_norm, train/lr, train/samples_per_s,
// train/step_ms, train/data_wait_ms and train/peak_gib. Values metrics.jsonl writes as null (a skipped step's
// non-finite loss or norm, the peak where it is not measured) are left out rather than plotted as NaN.
void add_metrics_row(EventFileWriter* writer, const MetricsRow& row, double wall_time);

// What an event file holds, for tests and tools.
struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
struct EventFileContents {
  std::string file_version;
  std::vector<ScalarEvent> scalars;
  std::vector<int64_t> session_starts;  // steps of SessionLog START events
};

// Reads and checks an event file: every record's framing and both CRCs, every Event's encoding, and the file
// version in the first event. Errors are FormatError naming the file and "record N at byte B".
EventFileContents read_event_file(const std::string& path);

}  // namespace vlatune::formats
