#include "trainer/media_decode.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#if defined(VLATUNE_HAVE_FFMPEG)
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}
#endif

namespace vlatune::trainer {

#if !defined(VLATUNE_HAVE_FFMPEG)

struct VideoReader::Impl {};

bool media_decode_available() {
  return false;
}
RgbImage decode_image(const uint8_t*, size_t) {
  throw DataError("cannot decode images: vlatune was built without FFmpeg's libraries");
}
VideoReader::VideoReader(const std::string& path) : path_(path) {
  throw DataError(path + ": cannot decode video: vlatune was built without FFmpeg's libraries");
}
VideoReader::~VideoReader() = default;
double VideoReader::fps() const {
  return 0;
}
std::string VideoReader::codec() const {
  return "";
}
int64_t VideoReader::width() const {
  return 0;
}
int64_t VideoReader::height() const {
  return 0;
}
void VideoReader::frames_at(const std::vector<double>&, double, std::vector<RgbImage>&,
                            const std::function<std::string(size_t)>&) {}

#else

namespace {

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FormatDeleter {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
using CodecContextPtr = std::unique_ptr<AVCodecContext, CodecContextDeleter>;
using FramePtr = std::unique_ptr<AVFrame, FrameDeleter>;
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;

// Converts decoded frames to RGB24 at their own size; keeps one swscale context for a run of equal formats.
class RgbConverter {
 public:
  ~RgbConverter() { sws_freeContext(sws_); }

  void convert(const AVFrame& f, RgbImage& out) {
    const auto format = static_cast<AVPixelFormat>(f.format);
    sws_ = sws_getCachedContext(sws_, f.width, f.height, format, f.width, f.height, AV_PIX_FMT_RGB24,
                                SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr, nullptr);
    if (sws_ == nullptr)
      throw DataError(std::string("cannot convert pixel format ") + av_get_pix_fmt_name(format) + " to RGB");
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    if (desc != nullptr && (desc->flags & AV_PIX_FMT_FLAG_RGB) == 0) {
      // YUV input: the signalled matrix (BT.601 when unspecified) and range (limited unless full is signalled;
      // the deprecated yuvj formats mean full).
      int matrix = SWS_CS_ITU601;
      if (f.colorspace == AVCOL_SPC_BT709) matrix = SWS_CS_ITU709;
      if (f.colorspace == AVCOL_SPC_BT2020_NCL || f.colorspace == AVCOL_SPC_BT2020_CL) matrix = SWS_CS_BT2020;
      const bool full = f.color_range == AVCOL_RANGE_JPEG || format == AV_PIX_FMT_YUVJ420P ||
                        format == AV_PIX_FMT_YUVJ422P || format == AV_PIX_FMT_YUVJ444P;
      sws_setColorspaceDetails(sws_, sws_getCoefficients(matrix), full ? 1 : 0, sws_getCoefficients(SWS_CS_ITU601), 1,
                               0, 1 << 16, 1 << 16);
    }
    out.width = f.width;
    out.height = f.height;
    out.pixels.resize(static_cast<size_t>(f.width) * f.height * 3);
    uint8_t* dst[4] = {out.pixels.data(), nullptr, nullptr, nullptr};
    int stride[4] = {f.width * 3, 0, 0, 0};
    if (sws_scale(sws_, f.data, f.linesize, 0, f.height, dst, stride) != f.height)
      throw DataError("pixel conversion to RGB failed");
  }

 private:
  SwsContext* sws_ = nullptr;
};

// FFmpeg's own log lines would interleave with the progress line; every failure reaches the user as a DataError
// with FFmpeg's reason instead.
void quiet_ffmpeg_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() > AV_LOG_FATAL) av_log_set_level(AV_LOG_FATAL);
  });
}

// Opens a decoder for `codec`, single-threaded.
CodecContextPtr open_decoder(const AVCodec* codec, const AVCodecParameters* params, const std::string& what) {
  quiet_ffmpeg_log();
  if (codec == nullptr) throw DataError(what + ": no decoder for it in this build");
  CodecContextPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) throw std::bad_alloc();
  if (params != nullptr) {
    const int rc = avcodec_parameters_to_context(ctx.get(), params);
    if (rc < 0) throw DataError(what + ": bad codec parameters: " + av_error(rc));
  }
  ctx->thread_count = 1;
  const int rc = avcodec_open2(ctx.get(), codec, nullptr);
  if (rc < 0) throw DataError(what + ": cannot open the " + codec->name + " decoder: " + av_error(rc));
  return ctx;
}

// The best decoder for a stream: for AV1, libdav1d when the build has it (FFmpeg's native AV1 decoder decodes
// through hardware only).
const AVCodec* pick_decoder(AVCodecID id) {
  if (id == AV_CODEC_ID_AV1) {
    if (const AVCodec* dav1d = avcodec_find_decoder_by_name("libdav1d")) return dav1d;
  }
  return avcodec_find_decoder(id);
}

}  // namespace

bool media_decode_available() {
  return true;
}

RgbImage decode_image(const uint8_t* data, size_t size) {
  AVCodecID id = AV_CODEC_ID_NONE;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) id = AV_CODEC_ID_PNG;
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) id = AV_CODEC_ID_MJPEG;
  if (id == AV_CODEC_ID_NONE)
    throw DataError(size == 0 ? std::string("empty image bytes") : std::string("image bytes are neither PNG nor JPEG"));
  if (size > static_cast<size_t>(std::numeric_limits<int>::max() - AV_INPUT_BUFFER_PADDING_SIZE))
    throw DataError("image of " + std::to_string(size) + " bytes is too large");
  auto ctx = open_decoder(avcodec_find_decoder(id), nullptr, id == AV_CODEC_ID_PNG ? "PNG image" : "JPEG image");
  PacketPtr packet(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  if (!packet || !frame) throw std::bad_alloc();
  // The decoders read up to AV_INPUT_BUFFER_PADDING_SIZE bytes past the end: give them a padded copy.
  if (av_new_packet(packet.get(), static_cast<int>(size)) < 0) throw std::bad_alloc();
  std::memcpy(packet->data, data, size);
  int rc = avcodec_send_packet(ctx.get(), packet.get());
  if (rc >= 0) rc = avcodec_send_packet(ctx.get(), nullptr);
  if (rc < 0 && rc != AVERROR_EOF) throw DataError("corrupt image: " + av_error(rc));
  rc = avcodec_receive_frame(ctx.get(), frame.get());
  if (rc < 0) throw DataError("corrupt image: " + av_error(rc));
  if ((frame->decode_error_flags != 0) || (frame->flags & AV_FRAME_FLAG_CORRUPT) != 0)
    throw DataError("corrupt image: the decoder flagged the frame");
  RgbImage out;
  RgbConverter converter;
  converter.convert(*frame, out);
  return out;
}

struct VideoReader::Impl {
  std::unique_ptr<AVFormatContext, FormatDeleter> format;
  AVStream* stream = nullptr;
  CodecContextPtr decoder;
  RgbConverter converter;
  double time_base = 0;
};

VideoReader::VideoReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": missing (a video file the dataset lists)");
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
  quiet_ffmpeg_log();
  AVFormatContext* fmt = nullptr;
  int rc = avformat_open_input(&fmt, path.c_str(), nullptr, nullptr);
  if (rc < 0) throw DataError(path + ": not a readable video: " + av_error(rc));
  impl_->format.reset(fmt);
  rc = avformat_find_stream_info(fmt, nullptr);
  if (rc < 0) throw DataError(path + ": cannot read the stream info (truncated?): " + av_error(rc));
  const int index = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (index < 0) throw DataError(path + ": no video stream");
  impl_->stream = fmt->streams[index];
  const AVCodecParameters* par = impl_->stream->codecpar;
  impl_->decoder =
      open_decoder(pick_decoder(par->codec_id), par, path + ": " + std::string(avcodec_get_name(par->codec_id)));
  impl_->time_base = av_q2d(impl_->stream->time_base);
}

VideoReader::~VideoReader() = default;

double VideoReader::fps() const {
  const AVRational r =
      impl_->stream->avg_frame_rate.num > 0 ? impl_->stream->avg_frame_rate : impl_->stream->r_frame_rate;
  return r.den > 0 ? av_q2d(r) : 0.0;
}

std::string VideoReader::codec() const {
  return avcodec_get_name(impl_->stream->codecpar->codec_id);
}

int64_t VideoReader::width() const {
  return impl_->stream->codecpar->width;
}

int64_t VideoReader::height() const {
  return impl_->stream->codecpar->height;
}

void VideoReader::frames_at(const std::vector<double>& times, double tolerance, std::vector<RgbImage>& out,
                            const std::function<std::string(size_t)>& describe) {
  out.assign(times.size(), RgbImage{});
  if (times.empty()) return;
  Impl& s = *impl_;
  AVFormatContext* fmt = s.format.get();
  AVCodecContext* dec = s.decoder.get();
  const double start = s.stream->start_time != AV_NOPTS_VALUE ? s.stream->start_time * s.time_base : 0.0;
  // Seek to the key frame at or before the first time (relative to the stream's start, as LeRobot's timestamps
  // are), then decode forward.
  const auto target = static_cast<int64_t>(std::floor((times.front() - tolerance + start) / s.time_base));
  int rc = av_seek_frame(fmt, s.stream->index,
                         std::max<int64_t>(target, s.stream->start_time == AV_NOPTS_VALUE ? 0 : s.stream->start_time),
                         AVSEEK_FLAG_BACKWARD);
  if (rc < 0) throw DataError(path_ + ": cannot seek to " + std::to_string(times.front()) + " s: " + av_error(rc));
  avcodec_flush_buffers(dec);

  PacketPtr packet(av_packet_alloc());
  FramePtr frame(av_frame_alloc()), previous(av_frame_alloc());
  if (!packet || !frame || !previous) throw std::bad_alloc();
  bool have_previous = false;
  double previous_time = 0;
  size_t next = 0;  // the first time not matched yet

  auto fail = [&](size_t i, double nearest, bool at_end) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s: no frame within %g s of %.6f s (%s %.6f s)", path_.c_str(), tolerance,
                  times[i], at_end ? "the stream ends with a frame at" : "nearest frame at", nearest);
    throw DataError(std::string(buf) + " for " + describe(i));
  };
  // Matches every pending time t <= `now` to the closer of the previous and the current frame; at the end of the
  // stream (current null), every pending time to the last frame.
  auto match = [&](const AVFrame* current, double now) {
    while (next < times.size() && (current == nullptr || times[next] <= now)) {
      const double t = times[next];
      const AVFrame* best = have_previous ? previous.get() : nullptr;
      double best_time = previous_time;
      if (current != nullptr && (best == nullptr || std::abs(now - t) < std::abs(best_time - t))) {
        best = current;
        best_time = now;
      }
      if (best == nullptr) throw DataError(path_ + ": no frame decoded before its end, for " + describe(next));
      if (std::abs(best_time - t) > tolerance) fail(next, best_time, current == nullptr);
      s.converter.convert(*best, out[next]);
      ++next;
    }
  };
  auto take_frames = [&]() {
    while (next < times.size()) {
      rc = avcodec_receive_frame(dec, frame.get());
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
      if (rc < 0) throw DataError(path_ + ": decoding failed: " + av_error(rc));
      const int64_t pts = frame->best_effort_timestamp != AV_NOPTS_VALUE ? frame->best_effort_timestamp : frame->pts;
      const double now = static_cast<double>(pts) * s.time_base - start;
      match(frame.get(), now);
      av_frame_unref(previous.get());
      av_frame_move_ref(previous.get(), frame.get());
      have_previous = true;
      previous_time = now;
    }
  };

  while (next < times.size()) {
    rc = av_read_frame(fmt, packet.get());
    if (rc < 0) {
      if (rc != AVERROR_EOF) throw DataError(path_ + ": reading failed (truncated?): " + av_error(rc));
      avcodec_send_packet(dec, nullptr);
      take_frames();
      match(nullptr, 0.0);
      break;
    }
    if (packet->stream_index != s.stream->index) {
      av_packet_unref(packet.get());
      continue;
    }
    rc = avcodec_send_packet(dec, packet.get());
    av_packet_unref(packet.get());
    if (rc < 0 && rc != AVERROR(EAGAIN)) throw DataError(path_ + ": corrupt video data: " + av_error(rc));
    take_frames();
  }
}

#endif  // VLATUNE_HAVE_FFMPEG

}  // namespace vlatune::trainer
