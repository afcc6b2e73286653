// Decoding the images and videos of LeRobot datasets through FFmpeg's libraries: PNG/JPEG bytes (image features
// stored inside parquet) and MP4 video streams (AV1 through libdav1d, H.264, HEVC) addressed by timestamp, always
// to RGB24. Every decoder runs single-threaded: the importer decodes many episodes at once, one per core.
//
// Colour: frames convert to RGB with the stream's signalled matrix and range, else BT.601 limited range (what
// FFmpeg assumes and LeRobot's own encoder writes), chroma upsampled bilinearly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/data_error.h"

namespace vlatune::trainer {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // [height][width][3]
};

// True when this build has FFmpeg's libraries.
bool media_decode_available();

// Decodes one PNG or JPEG (recognized by its first bytes). Throws DataError with the reason (the caller adds the
// file, episode and frame).
RgbImage decode_image(const uint8_t* data, size_t size);

// One video stream of one file, read forward from a seek point.
class VideoReader {
 public:
  // Opens `path` and its first video stream. DataError naming the file when it is missing, not a video or has
  // no decoder in this build.
  explicit VideoReader(const std::string& path);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  const std::string& path() const { return path_; }
  double fps() const;         // the stream's average frame rate
  std::string codec() const;  // e.g. "av1", "h264"
  int64_t width() const;
  int64_t height() const;

  // The frames at `times` (seconds, ascending): out[i] is the decoded frame whose timestamp is closest to
  // times[i], which must lie within `tolerance` seconds of it (LeRobot's rule, whose tolerance is 1e-4 s).
  // Seeks once to the key frame before times.front() and decodes forward. A time that no frame matches throws
  // DataError naming the file, describe(i), the time and the nearest frame's time (or the stream's end).
  void frames_at(const std::vector<double>& times, double tolerance, std::vector<RgbImage>& out,
                 const std::function<std::string(size_t)>& describe);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace vlatune::trainer
