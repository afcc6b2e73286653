// Writes LeRobot datasets (v2.0 / v2.1 / v3.0) with known contents; see lerobot_fixture.h.
//
// Layout follows huggingface/lerobot (src/lerobot/datasets/utils.py, dataset_metadata.py, io_utils.py and
// scripts/convert_dataset_v21_to_v30.py). Parquet is written with Arrow's parquet writer (snappy, dictionary
// encoding on, one row group per episode, as LeRobot's writers do); PNG and MP4 with FFmpeg.
//
// All content functions use integer arithmetic only, so the values are bit-identical in every translation unit,
// whatever the compiler flags (no libm, no FMA contraction).
#include "tests/lerobot_fixture/lerobot_fixture.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/util/compression.h>
#include <arrow/util/key_value_metadata.h>
#include <parquet/arrow/writer.h>
#include <parquet/properties.h>

#include <nlohmann/json.hpp>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include <errno.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

namespace vlatune::testing {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kChunksSize = 1000;

// ---------------------------------------------------------------------------------------------------------------
// Deterministic content.

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  uint64_t h = mix64(seed ^ 0x6c65726f626f7421ULL);
  h = mix64(h ^ a);
  h = mix64(h ^ (b + 0x1000));
  h = mix64(h ^ (c + 0x2000));
  return mix64(h ^ (d + 0x3000));
}

// A smooth periodic wave of period 1024 with values in [-65536, 65536]: two parabolic arcs (a sine look-alike).
int64_t wave(int64_t t) {
  t %= 1024;
  if (t < 0) t += 1024;
  if (t < 512) return t * (512 - t) * 65536 / (256 * 256);
  t -= 512;
  return -(t * (512 - t) * 65536 / (256 * 256));
}

// One 1-D gradient term, in [5, 95]. axis 0: along x (n = width), axis 1: along y (n = height).
int64_t gradient(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame, int64_t axis, int64_t pos,
                 int64_t n, int64_t channel) {
  const uint64_t h = hash(f.seed, 11 + axis, static_cast<uint64_t>(camera), static_cast<uint64_t>(channel));
  const int64_t half_cycles = 1 + static_cast<int64_t>(h % 3);     // 0.5, 1 or 1.5 periods across the image
  const int64_t speed = 20 + static_cast<int64_t>((h >> 8) % 30);  // phase drift per frame (of 1024)
  const int64_t phase = static_cast<int64_t>(hash(f.seed, 13 + axis, camera, channel, episode) % 1024);
  const int64_t t = pos * 512 * half_cycles / std::max<int64_t>(n, 1) + phase + frame * speed * (axis == 0 ? 1 : -1);
  return 50 + 45 * wave(t) / 65536;
}

// The bright square: side and top-left corner.
struct Square {
  int64_t side, x0, y0;
};

Square square(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame) {
  Square s;
  s.side = std::max<int64_t>(2, 8 * std::min(f.width, f.height) / 64);
  s.side = std::min<int64_t>(s.side, std::min(f.width, f.height)) & ~int64_t{1};
  const int64_t span_x = f.width - s.side + 1, span_y = f.height - s.side + 1;
  const uint64_t h = hash(f.seed, 21, camera, episode);
  const int64_t step = std::max<int64_t>(2, (s.side / 4) & ~int64_t{1});
  // Walks right (every frame) and down (slower) with the frame index, wrapping around.
  s.x0 = (static_cast<int64_t>(h % span_x) + frame * step) % span_x;
  s.y0 = (static_cast<int64_t>((h >> 20) % span_y) + frame * (step / 2) + 2 * (frame / 3)) % span_y;
  // Even corner and side: the square covers whole 2x2 chroma blocks of yuv420p.
  s.x0 &= ~int64_t{1};
  s.y0 &= ~int64_t{1};
  return s;
}

// A vector component: a mix of two waves with a per-dim scale and offset, exactly representable in float32.
float vector_value(const LeRobotFixture& f, uint64_t domain, int64_t episode, int64_t frame, int64_t dim) {
  static constexpr int64_t kAmp16[8] = {16, 48, 8, 160, 4, 112, 800, 32};  // amplitude * 16: 1, 3, .5, 10, ...
  const int64_t amp16 = kAmp16[dim % 8] * (1 + (dim / 8) % 3);             // at most 2400: |num| below stays < 2^24
  const uint64_t h = hash(f.seed, domain, dim);
  const int64_t speed1 = 9 + static_cast<int64_t>(h % 40), speed2 = 31 + static_cast<int64_t>((h >> 16) % 50);
  const int64_t p1 = static_cast<int64_t>(hash(f.seed, domain + 1, dim, episode) % 1024);
  const int64_t p2 = static_cast<int64_t>(hash(f.seed, domain + 2, dim, episode) % 1024);
  const int64_t v = (3 * wave(p1 + frame * speed1) + wave(p2 - frame * speed2)) / 4;  // [-65536, 65536]
  const int64_t offset = (static_cast<int64_t>((h >> 32) % 257) - 128) * 256 + (episode % 1024) * 97;  // units of 2^-16
  const int64_t num = offset + amp16 * v / 16;
  return std::ldexp(static_cast<float>(num), -16);  // |num| < 2^24: exact
}

// ---------------------------------------------------------------------------------------------------------------
// Files and paths.

std::string fmt(const char* pattern, int64_t a, int64_t b = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), pattern, static_cast<long long>(a), static_cast<long long>(b));
  return buf;
}

bool is_v3(const LeRobotFixture& f) {
  return f.version == "v3.0";
}

// v3.0: the file group (0, 1, ...) holding an episode, and its chunk/file indices.
int64_t group_of(const LeRobotFixture& f, int64_t episode) {
  return is_v3(f) ? episode / f.episodes_per_file : episode;
}
int64_t chunk_of_group(int64_t group) {
  return group / kChunksSize;
}
int64_t file_of_group(int64_t group) {
  return group % kChunksSize;
}

std::string rel_data_path(const LeRobotFixture& f, int64_t episode) {
  if (is_v3(f)) {
    const int64_t g = group_of(f, episode);
    return fmt("data/chunk-%03lld/file-%03lld.parquet", chunk_of_group(g), file_of_group(g));
  }
  return fmt("data/chunk-%03lld/episode_%06lld.parquet", episode / kChunksSize, episode);
}

std::string rel_video_path(const LeRobotFixture& f, int64_t camera, int64_t episode) {
  const std::string& key = f.cameras.at(camera);
  if (is_v3(f)) {
    const int64_t g = group_of(f, episode);
    return "videos/" + key + fmt("/chunk-%03lld/file-%03lld.mp4", chunk_of_group(g), file_of_group(g));
  }
  return fmt("videos/chunk-%03lld/", episode / kChunksSize) + key + fmt("/episode_%06lld.mp4", episode);
}

void make_dir(const std::string& path, bool must_be_new) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  const int err = errno;
  if (err == EEXIST && !must_be_new) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  }
  throw std::runtime_error("lerobot fixture: mkdir " + path + ": " + std::strerror(err));
}

// Creates every missing directory of `path` (not the last component).
void make_parents(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    make_dir(path.substr(0, pos), false);
  }
}

void write_text(const std::string& path, const std::string& text) {
  make_parents(path);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("lerobot fixture: cannot write " + path);
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics (as LeRobot's compute_stats: population std; images per channel in [0, 1], shaped [3, 1, 1]).

const std::array<std::pair<const char*, double>, 5> kQuantiles = {
    {{"q01", 0.01}, {"q10", 0.10}, {"q50", 0.50}, {"q90", 0.90}, {"q99", 0.99}}};

struct FeatureStats {
  std::vector<int64_t> shape;  // of each statistic: {n} or {3, 1, 1}
  int64_t count = 0;
  std::vector<std::pair<std::string, std::vector<double>>> values;  // min, max, mean, std[, q01 .. q99]
};

// Linear-interpolated quantile (numpy's default) of the k-th order statistics given by `at`.
template <typename At>
double quantile(int64_t n, double q, At at) {
  const double pos = q * static_cast<double>(n - 1);
  const int64_t lo = static_cast<int64_t>(std::floor(pos));
  const int64_t hi = std::min(lo + 1, n - 1);
  const double a = at(lo), b = at(hi);
  return a + (pos - static_cast<double>(lo)) * (b - a);
}

// samples[d] = every value of component d.
FeatureStats stats_of_samples(const std::vector<std::vector<double>>& samples, bool quantiles) {
  FeatureStats s;
  const size_t dims = samples.size();
  s.shape = {static_cast<int64_t>(dims)};
  s.count = dims ? static_cast<int64_t>(samples[0].size()) : 0;
  std::vector<double> mn(dims), mx(dims), mean(dims), sd(dims);
  std::vector<std::vector<double>> qs(kQuantiles.size(), std::vector<double>(dims));
  for (size_t d = 0; d < dims; ++d) {
    std::vector<double> v = samples[d];
    std::sort(v.begin(), v.end());
    const int64_t n = static_cast<int64_t>(v.size());
    double sum = 0;
    for (double x : v) sum += x;
    const double m = sum / static_cast<double>(n);
    double ss = 0;
    for (double x : v) ss += (x - m) * (x - m);
    mn[d] = v.front();
    mx[d] = v.back();
    mean[d] = m;
    sd[d] = std::sqrt(ss / static_cast<double>(n));
    for (size_t k = 0; k < kQuantiles.size(); ++k) {
      qs[k][d] = quantile(n, kQuantiles[k].second, [&](int64_t i) { return v[i]; });
    }
  }
  s.values = {{"min", mn}, {"max", mx}, {"mean", mean}, {"std", sd}};
  if (quantiles) {
    for (size_t k = 0; k < kQuantiles.size(); ++k) s.values.emplace_back(kQuantiles[k].first, qs[k]);
  }
  return s;
}

using Histograms = std::array<std::array<int64_t, 256>, 3>;  // [channel][level]

FeatureStats stats_of_histograms(const Histograms& hist, int64_t frames, bool quantiles) {
  FeatureStats s;
  s.shape = {3, 1, 1};
  s.count = frames;
  std::vector<double> mn(3), mx(3), mean(3), sd(3);
  std::vector<std::vector<double>> qs(kQuantiles.size(), std::vector<double>(3));
  for (int c = 0; c < 3; ++c) {
    const auto& h = hist[c];
    int64_t n = 0;
    double sum = 0, sumsq = 0;
    int lo = 255, hi = 0;
    for (int v = 0; v < 256; ++v) {
      if (!h[v]) continue;
      n += h[v];
      sum += static_cast<double>(v) * static_cast<double>(h[v]);
      sumsq += static_cast<double>(v) * v * static_cast<double>(h[v]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const double m = sum / static_cast<double>(n);
    mn[c] = lo / 255.0;
    mx[c] = hi / 255.0;
    mean[c] = m / 255.0;
    sd[c] = std::sqrt(std::max(0.0, sumsq / static_cast<double>(n) - m * m)) / 255.0;
    auto at = [&](int64_t i) {
      int64_t cum = 0;
      for (int v = 0; v < 256; ++v) {
        cum += h[v];
        if (cum > i) return v / 255.0;
      }
      return 1.0;
    };
    for (size_t k = 0; k < kQuantiles.size(); ++k) qs[k][c] = quantile(n, kQuantiles[k].second, at);
  }
  s.values = {{"min", mn}, {"max", mx}, {"mean", mean}, {"std", sd}};
  if (quantiles) {
    for (size_t k = 0; k < kQuantiles.size(); ++k) s.values.emplace_back(kQuantiles[k].first, qs[k]);
  }
  return s;
}

json stat_json(const FeatureStats& s, const std::vector<double>& v) {
  json a = json::array();
  if (s.shape.size() == 3) {
    for (double x : v) a.push_back(json::array({json::array({x})}));
  } else {
    for (double x : v) a.push_back(x);
  }
  return a;
}

// {"min": .., "max": .., "mean": .., "std": .., "count": [n], "q01": ..}, LeRobot's key order.
json stats_json(const FeatureStats& s) {
  json o = json::object();
  for (size_t i = 0; i < s.values.size(); ++i) {
    o[s.values[i].first] = stat_json(s, s.values[i].second);
    if (i == 3) o["count"] = json::array({s.count});
  }
  return o;
}

// Collects the raw values of one set of frames (an episode or the whole dataset).
struct StatsAccumulator {
  std::vector<Histograms> images;                  // per camera
  std::vector<std::vector<double>> state, action;  // [dim][sample]
  std::vector<std::vector<double>> scalars;        // timestamp, frame_index, episode_index, index, task_index
  int64_t frames = 0;

  StatsAccumulator(const LeRobotFixture& f)
      : images(f.cameras.size()), state(f.state_dim), action(f.action_dim), scalars(5) {
    for (auto& h : images) {
      for (auto& c : h) c.fill(0);
    }
  }
  void add_frame(const LeRobotFixture& f, int64_t episode, int64_t frame, int64_t index) {
    for (int64_t d = 0; d < f.state_dim; ++d) state[d].push_back(fixture_state(f, episode, frame, d));
    for (int64_t d = 0; d < f.action_dim; ++d) action[d].push_back(fixture_action(f, episode, frame, d));
    scalars[0].push_back(static_cast<float>(static_cast<double>(frame) / static_cast<double>(f.fps)));
    scalars[1].push_back(static_cast<double>(frame));
    scalars[2].push_back(static_cast<double>(episode));
    scalars[3].push_back(static_cast<double>(index));
    scalars[4].push_back(static_cast<double>(fixture_task_index(f, episode)));
    ++frames;
  }
  void add_image(int64_t camera, const std::vector<uint8_t>& rgb) {
    auto& h = images[camera];
    for (size_t i = 0; i + 2 < rgb.size(); i += 3) {
      ++h[0][rgb[i]];
      ++h[1][rgb[i + 1]];
      ++h[2][rgb[i + 2]];
    }
  }
  void merge(const StatsAccumulator& o) {
    for (size_t c = 0; c < images.size(); ++c) {
      for (int ch = 0; ch < 3; ++ch) {
        for (int v = 0; v < 256; ++v) images[c][ch][v] += o.images[c][ch][v];
      }
    }
    auto cat = [](std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
      for (size_t d = 0; d < a.size(); ++d) a[d].insert(a[d].end(), b[d].begin(), b[d].end());
    };
    cat(state, o.state);
    cat(action, o.action);
    cat(scalars, o.scalars);
    frames += o.frames;
  }
  // (feature key, stats) in info.json's feature order.
  std::vector<std::pair<std::string, FeatureStats>> compute(const LeRobotFixture& f, bool quantiles) const {
    std::vector<std::pair<std::string, FeatureStats>> out;
    for (size_t c = 0; c < images.size(); ++c) {
      out.emplace_back(f.cameras[c], stats_of_histograms(images[c], frames, quantiles));
    }
    out.emplace_back(f.state_key, stats_of_samples(state, quantiles));
    out.emplace_back(f.action_key, stats_of_samples(action, quantiles));
    static const char* kScalarKeys[5] = {"timestamp", "frame_index", "episode_index", "index", "task_index"};
    for (int i = 0; i < 5; ++i) out.emplace_back(kScalarKeys[i], stats_of_samples({scalars[i]}, quantiles));
    return out;
  }
};

json stats_dict_json(const std::vector<std::pair<std::string, FeatureStats>>& stats) {
  json o = json::object();
  for (const auto& [key, s] : stats) o[key] = stats_json(s);
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// FFmpeg helpers.

std::string av_error(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(err, buf, sizeof(buf));
  return std::string(buf) + " (" + std::to_string(err) + ")";
}

[[noreturn]] void av_fail(const std::string& call, const std::string& file, int err) {
  throw std::runtime_error("lerobot fixture: " + call + " failed for " + file + ": " + av_error(err));
}

const AVCodec* find_encoder(const std::string& name, const std::string& purpose) {
  const AVCodec* codec = avcodec_find_encoder_by_name(name.c_str());
  if (!codec) {
    throw std::runtime_error("lerobot fixture: FFmpeg encoder '" + name + "' (for " + purpose +
                             ") is not available in this FFmpeg build (avcodec_find_encoder_by_name returned null)");
  }
  return codec;
}

// Throws if avcodec_open2 left options it did not know.
void check_options_consumed(AVDictionary* opts, const std::string& encoder, const std::string& file) {
  const AVDictionaryEntry* e = av_dict_get(opts, "", nullptr, AV_DICT_IGNORE_SUFFIX);
  if (e) {
    const std::string key = e->key;
    av_dict_free(&opts);
    throw std::runtime_error("lerobot fixture: encoder " + encoder + " does not accept option '" + key + "' (" + file +
                             ")");
  }
  av_dict_free(&opts);
}

// Encodes RGB24 frames as PNG files (bytes in memory).
// Encodes RGB frames as the image cells of a parquet column: PNG (lossless) or JPEG (through yuvj420p, as PIL's
// default JPEG writer subsamples chroma).
class ImageEncoder {
 public:
  ImageEncoder(const std::string& format, int64_t width, int64_t height)
      : jpeg_(format == "jpeg"), width_(width), height_(height) {
    const char* name = jpeg_ ? "mjpeg" : "png";
    const std::string what = jpeg_ ? "JPEG frames" : "PNG frames";
    const AVCodec* codec = find_encoder(name, "image storage");
    ctx_ = avcodec_alloc_context3(codec);
    frame_ = av_frame_alloc();
    pkt_ = av_packet_alloc();
    if (!ctx_ || !frame_ || !pkt_) throw std::runtime_error("lerobot fixture: out of memory (image encoder)");
    ctx_->width = static_cast<int>(width);
    ctx_->height = static_cast<int>(height);
    ctx_->pix_fmt = jpeg_ ? AV_PIX_FMT_YUVJ420P : AV_PIX_FMT_RGB24;
    ctx_->time_base = AVRational{1, 25};
    ctx_->thread_count = 1;
    AVDictionary* opts = nullptr;
    if (jpeg_) {
      ctx_->color_range = AVCOL_RANGE_JPEG;
      ctx_->flags |= AV_CODEC_FLAG_QSCALE;
      ctx_->global_quality = 2 * FF_QP2LAMBDA;
    } else {
      ctx_->compression_level = 1;             // zlib level 1, as LeRobot's image writer (PIL compress_level=1)
      av_dict_set(&opts, "pred", "paeth", 0);  // PIL-like filtering, so sizes resemble LeRobot's PNGs
    }
    const int ret = avcodec_open2(ctx_, codec, &opts);
    if (ret < 0) {
      av_dict_free(&opts);
      av_fail(std::string("avcodec_open2(") + name + ")", what, ret);
    }
    check_options_consumed(opts, name, what);
    frame_->format = ctx_->pix_fmt;
    frame_->width = ctx_->width;
    frame_->height = ctx_->height;
    frame_->color_range = ctx_->color_range;
    if (const int r = av_frame_get_buffer(frame_, 0); r < 0) av_fail("av_frame_get_buffer", what, r);
    if (jpeg_) {
      sws_ = sws_getContext(ctx_->width, ctx_->height, AV_PIX_FMT_RGB24, ctx_->width, ctx_->height, AV_PIX_FMT_YUVJ420P,
                            SWS_BILINEAR | SWS_ACCURATE_RND, nullptr, nullptr, nullptr);
      if (!sws_) av_fail("sws_getContext(rgb24->yuvj420p)", what, AVERROR(EINVAL));
      const int* coeffs = sws_getCoefficients(SWS_CS_ITU601);
      const int r = sws_setColorspaceDetails(sws_, coeffs, 1, coeffs, 1, 0, 1 << 16, 1 << 16);  // full -> full
      if (r < 0) av_fail("sws_setColorspaceDetails", what, r);
    }
  }
  ~ImageEncoder() {
    sws_freeContext(sws_);
    av_packet_free(&pkt_);
    av_frame_free(&frame_);
    avcodec_free_context(&ctx_);
  }
  ImageEncoder(const ImageEncoder&) = delete;
  ImageEncoder& operator=(const ImageEncoder&) = delete;

  std::string encode(const std::vector<uint8_t>& rgb, const std::string& what) {
    if (int r = av_frame_make_writable(frame_); r < 0) av_fail("av_frame_make_writable", what, r);
    if (jpeg_) {
      const uint8_t* src[1] = {rgb.data()};
      const int src_stride[1] = {static_cast<int>(width_ * 3)};
      if (int r = sws_scale(sws_, src, src_stride, 0, static_cast<int>(height_), frame_->data, frame_->linesize); r < 0)
        av_fail("sws_scale", what, r);
    } else {
      for (int64_t y = 0; y < height_; ++y) {
        std::memcpy(frame_->data[0] + y * frame_->linesize[0], rgb.data() + y * width_ * 3, width_ * 3);
      }
    }
    frame_->pts = pts_++;
    if (int r = avcodec_send_frame(ctx_, frame_); r < 0) av_fail("avcodec_send_frame(image)", what, r);
    const int r = avcodec_receive_packet(ctx_, pkt_);
    if (r < 0) av_fail("avcodec_receive_packet(image)", what, r);
    std::string out(reinterpret_cast<const char*>(pkt_->data), pkt_->size);
    av_packet_unref(pkt_);
    return out;
  }

 private:
  bool jpeg_;
  int64_t width_, height_, pts_ = 0;
  AVCodecContext* ctx_ = nullptr;
  AVFrame* frame_ = nullptr;
  AVPacket* pkt_ = nullptr;
  SwsContext* sws_ = nullptr;
};

// Writes one MP4 with a single yuv420p video stream; frame i at pts i / fps.
class VideoWriter {
 public:
  VideoWriter(const std::string& path, const std::string& encoder, int64_t width, int64_t height, int64_t fps)
      : path_(path), encoder_(encoder), width_(width), height_(height) {
    const AVCodec* codec = find_encoder(encoder, "video storage");
    make_parents(path);
    int ret = avformat_alloc_output_context2(&oc_, nullptr, "mp4", path.c_str());
    if (ret < 0 || !oc_) av_fail("avformat_alloc_output_context2(mp4)", path, ret < 0 ? ret : AVERROR_MUXER_NOT_FOUND);
    st_ = avformat_new_stream(oc_, nullptr);
    if (!st_) av_fail("avformat_new_stream", path, AVERROR(ENOMEM));
    ctx_ = avcodec_alloc_context3(codec);
    frame_ = av_frame_alloc();
    pkt_ = av_packet_alloc();
    if (!ctx_ || !frame_ || !pkt_) av_fail("avcodec_alloc_context3/av_frame_alloc", path, AVERROR(ENOMEM));
    ctx_->width = static_cast<int>(width);
    ctx_->height = static_cast<int>(height);
    ctx_->pix_fmt = AV_PIX_FMT_YUV420P;
    ctx_->time_base = AVRational{1, static_cast<int>(fps)};
    ctx_->framerate = AVRational{static_cast<int>(fps), 1};
    ctx_->gop_size = 2;  // LeRobot's g=2
    ctx_->color_range = AVCOL_RANGE_MPEG;
    ctx_->colorspace = AVCOL_SPC_SMPTE170M;  // BT.601, what swscale converts with below (and its default)
    if (oc_->oformat->flags & AVFMT_GLOBALHEADER) ctx_->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    AVDictionary* opts = nullptr;
    if (encoder == "libsvtav1") {
      av_dict_set(&opts, "preset", "10", 0);
      av_dict_set(&opts, "crf", "30", 0);
    } else if (encoder == "libx264") {
      av_dict_set(&opts, "preset", "veryfast", 0);
      av_dict_set(&opts, "crf", "18", 0);
    } else if (encoder == "libx265") {
      av_dict_set(&opts, "preset", "veryfast", 0);
      av_dict_set(&opts, "crf", "18", 0);
      av_dict_set(&opts, "x265-params", "log-level=error", 0);
    }
    ret = avcodec_open2(ctx_, codec, &opts);
    if (ret < 0) {
      av_dict_free(&opts);
      std::string call = "avcodec_open2(" + encoder + ", " + std::to_string(width) + "x" + std::to_string(height) + ")";
      if (encoder == "libsvtav1" && (width < 64 || height < 64)) call += " [SVT-AV1 1.x needs frames of >= 64x64]";
      av_fail(call, path, ret);
    }
    check_options_consumed(opts, encoder, path);
    ret = avcodec_parameters_from_context(st_->codecpar, ctx_);
    if (ret < 0) av_fail("avcodec_parameters_from_context", path, ret);
    st_->time_base = ctx_->time_base;
    st_->avg_frame_rate = ctx_->framerate;
    ret = avio_open(&oc_->pb, path.c_str(), AVIO_FLAG_WRITE);
    if (ret < 0) av_fail("avio_open", path, ret);
    ret = avformat_write_header(oc_, nullptr);
    if (ret < 0) av_fail("avformat_write_header", path, ret);

    frame_->format = AV_PIX_FMT_YUV420P;
    frame_->width = ctx_->width;
    frame_->height = ctx_->height;
    frame_->color_range = AVCOL_RANGE_MPEG;
    frame_->colorspace = AVCOL_SPC_SMPTE170M;
    ret = av_frame_get_buffer(frame_, 0);
    if (ret < 0) av_fail("av_frame_get_buffer", path, ret);
    sws_ = sws_getContext(ctx_->width, ctx_->height, AV_PIX_FMT_RGB24, ctx_->width, ctx_->height, AV_PIX_FMT_YUV420P,
                          SWS_BILINEAR | SWS_ACCURATE_RND, nullptr, nullptr, nullptr);
    if (!sws_) av_fail("sws_getContext(rgb24->yuv420p)", path, AVERROR(EINVAL));
    const int* coeffs = sws_getCoefficients(SWS_CS_ITU601);
    // Source RGB full range, destination limited ("tv") range.
    ret = sws_setColorspaceDetails(sws_, coeffs, 1, coeffs, 0, 0, 1 << 16, 1 << 16);
    if (ret < 0) av_fail("sws_setColorspaceDetails", path, ret);
  }

  ~VideoWriter() {
    sws_freeContext(sws_);
    av_packet_free(&pkt_);
    av_frame_free(&frame_);
    avcodec_free_context(&ctx_);
    if (oc_) {
      if (oc_->pb) avio_closep(&oc_->pb);
      avformat_free_context(oc_);
    }
  }
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;

  void add(const std::vector<uint8_t>& rgb) {
    int ret = av_frame_make_writable(frame_);
    if (ret < 0) av_fail("av_frame_make_writable", path_, ret);
    const uint8_t* src[1] = {rgb.data()};
    const int src_stride[1] = {static_cast<int>(width_ * 3)};
    ret = sws_scale(sws_, src, src_stride, 0, static_cast<int>(height_), frame_->data, frame_->linesize);
    if (ret < 0) av_fail("sws_scale", path_, ret);
    frame_->pts = next_pts_++;
    ret = avcodec_send_frame(ctx_, frame_);
    if (ret < 0) av_fail("avcodec_send_frame(" + encoder_ + ")", path_, ret);
    drain();
  }

  void finish() {
    int ret = avcodec_send_frame(ctx_, nullptr);
    if (ret < 0) av_fail("avcodec_send_frame(" + encoder_ + ", flush)", path_, ret);
    drain();
    ret = av_write_trailer(oc_);
    if (ret < 0) av_fail("av_write_trailer", path_, ret);
    ret = avio_closep(&oc_->pb);
    if (ret < 0) av_fail("avio_closep", path_, ret);
    if (written_ != next_pts_) {
      throw std::runtime_error("lerobot fixture: encoder " + encoder_ + " returned " + std::to_string(written_) +
                               " packets for " + std::to_string(next_pts_) + " frames (" + path_ + ")");
    }
  }

 private:
  void drain() {
    for (;;) {
      int ret = avcodec_receive_packet(ctx_, pkt_);
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      if (ret < 0) av_fail("avcodec_receive_packet(" + encoder_ + ")", path_, ret);
      if (pkt_->duration <= 0) pkt_->duration = 1;
      av_packet_rescale_ts(pkt_, ctx_->time_base, st_->time_base);
      pkt_->stream_index = st_->index;
      ++written_;
      ret = av_interleaved_write_frame(oc_, pkt_);  // takes the packet's reference
      if (ret < 0) av_fail("av_interleaved_write_frame", path_, ret);
    }
  }

  std::string path_, encoder_;
  int64_t width_, height_;
  int64_t next_pts_ = 0, written_ = 0;
  AVFormatContext* oc_ = nullptr;
  AVStream* st_ = nullptr;
  AVCodecContext* ctx_ = nullptr;
  AVFrame* frame_ = nullptr;
  AVPacket* pkt_ = nullptr;
  SwsContext* sws_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// Arrow / Parquet helpers.

void check(const arrow::Status& st, const std::string& what) {
  if (!st.ok()) throw std::runtime_error("lerobot fixture: " + what + ": " + st.ToString());
}

template <typename T>
T check(arrow::Result<T> r, const std::string& what) {
  if (!r.ok()) throw std::runtime_error("lerobot fixture: " + what + ": " + r.status().ToString());
  return std::move(r).ValueOrDie();
}

std::shared_ptr<arrow::DataType> image_type() {
  return arrow::struct_({arrow::field("bytes", arrow::binary()), arrow::field("path", arrow::utf8())});
}

std::shared_ptr<arrow::DataType> vector_type(const LeRobotFixture& f, int64_t n) {
  if (f.vector_layout == "list") return arrow::list(arrow::float32());
  return arrow::fixed_size_list(arrow::float32(), static_cast<int32_t>(n));
}

// The HF datasets feature description LeRobot's files carry in their "huggingface" schema metadata.
json hf_vector_feature(const LeRobotFixture& f, int64_t n) {
  json feature = {{"feature", {{"dtype", "float32"}, {"_type", "Value"}}}};
  if (f.vector_layout != "list") feature["length"] = n;
  feature["_type"] = "Sequence";
  return feature;
}

std::shared_ptr<arrow::Schema> data_schema(const LeRobotFixture& f) {
  std::vector<std::shared_ptr<arrow::Field>> fields;
  json hf = json::object();
  if (f.storage == "image") {
    for (const auto& cam : f.cameras) {
      fields.push_back(arrow::field(cam, image_type()));
      hf[cam] = {{"_type", "Image"}};
    }
  }
  fields.push_back(arrow::field(f.state_key, vector_type(f, f.state_dim)));
  hf[f.state_key] = hf_vector_feature(f, f.state_dim);
  fields.push_back(arrow::field(f.action_key, vector_type(f, f.action_dim)));
  hf[f.action_key] = hf_vector_feature(f, f.action_dim);
  fields.push_back(arrow::field("timestamp", arrow::float32()));
  hf["timestamp"] = {{"dtype", "float32"}, {"_type", "Value"}};
  for (const char* k : {"frame_index", "episode_index", "index", "task_index"}) {
    fields.push_back(arrow::field(k, arrow::int64()));
    hf[k] = {{"dtype", "int64"}, {"_type", "Value"}};
  }
  const json meta = {{"info", {{"features", hf}}}};
  return arrow::schema(fields, arrow::key_value_metadata({"huggingface"}, {meta.dump()}));
}

std::shared_ptr<parquet::WriterProperties> writer_properties() {
  parquet::WriterProperties::Builder b;
  b.compression(arrow::util::Codec::IsAvailable(arrow::Compression::SNAPPY) ? parquet::Compression::SNAPPY
                                                                            : parquet::Compression::UNCOMPRESSED);
  return b.build();
}

// As pyarrow: the Arrow schema (and its metadata) stored in the file.
std::shared_ptr<parquet::ArrowWriterProperties> arrow_writer_properties() {
  return parquet::ArrowWriterProperties::Builder().store_schema()->build();
}

std::shared_ptr<arrow::io::FileOutputStream> open_output(const std::string& path) {
  make_parents(path);
  return check(arrow::io::FileOutputStream::Open(path), "open " + path);
}

void write_single_table(const std::shared_ptr<arrow::Table>& table, const std::string& path) {
  auto out = open_output(path);
  check(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, std::max<int64_t>(1, table->num_rows()),
                                   writer_properties(), arrow_writer_properties()),
        "parquet::arrow::WriteTable " + path);
  check(out->Close(), "close " + path);
}

std::shared_ptr<arrow::Array> finish(arrow::ArrayBuilder& b, const std::string& what) {
  std::shared_ptr<arrow::Array> a;
  check(b.Finish(&a), "build column " + what);
  return a;
}

std::shared_ptr<arrow::Array> int64_column(const std::vector<int64_t>& v, const std::string& what) {
  arrow::Int64Builder b;
  check(b.AppendValues(v), "append " + what);
  return finish(b, what);
}

std::shared_ptr<arrow::Array> double_column(const std::vector<double>& v, const std::string& what) {
  arrow::DoubleBuilder b;
  check(b.AppendValues(v), "append " + what);
  return finish(b, what);
}

// A column of fixed_size_list<float32, n> or list<float32>, one row per frame.
std::shared_ptr<arrow::Array> vector_column(const LeRobotFixture& f, int64_t n, const std::vector<float>& values,
                                            const std::string& what) {
  auto pool = arrow::default_memory_pool();
  auto floats = std::make_shared<arrow::FloatBuilder>(pool);
  const int64_t rows = n ? static_cast<int64_t>(values.size()) / n : 0;
  if (f.vector_layout == "list") {
    arrow::ListBuilder lb(pool, floats, vector_type(f, n));
    for (int64_t r = 0; r < rows; ++r) {
      check(lb.Append(), "append " + what);  // a list starts where the values appended so far end
      check(floats->AppendValues(values.data() + r * n, n), "append " + what);
    }
    return finish(lb, what);
  }
  arrow::FixedSizeListBuilder fb(pool, floats, vector_type(f, n));
  check(fb.AppendValues(rows), "append " + what);
  check(floats->AppendValues(values), "append " + what);
  return finish(fb, what);
}

// A stats column of the v3.0 episodes table: list<double> (or list<list<list<double>>> for images), one row per
// episode; count columns are list<int64>.
std::shared_ptr<arrow::Array> stats_column(const std::vector<FeatureStats>& per_episode, const std::string& stat,
                                           const std::string& what) {
  auto pool = arrow::default_memory_pool();
  const bool image = per_episode.at(0).shape.size() == 3;
  if (stat == "count") {
    auto ints = std::make_shared<arrow::Int64Builder>(pool);
    arrow::ListBuilder lb(pool, ints);
    for (const auto& s : per_episode) {
      check(lb.Append(), what);
      check(ints->Append(s.count), what);
    }
    return finish(lb, what);
  }
  auto values_of = [&](const FeatureStats& s) -> const std::vector<double>& {
    for (const auto& [name, v] : s.values) {
      if (name == stat) return v;
    }
    throw std::runtime_error("lerobot fixture: missing statistic " + stat);
  };
  auto doubles = std::make_shared<arrow::DoubleBuilder>(pool);
  if (!image) {
    arrow::ListBuilder lb(pool, doubles);
    for (const auto& s : per_episode) {
      check(lb.Append(), what);
      check(doubles->AppendValues(values_of(s)), what);
    }
    return finish(lb, what);
  }
  auto inner = std::make_shared<arrow::ListBuilder>(pool, doubles);
  auto middle = std::make_shared<arrow::ListBuilder>(pool, inner);
  arrow::ListBuilder outer(pool, middle);
  for (const auto& s : per_episode) {
    check(outer.Append(), what);
    for (double v : values_of(s)) {
      check(middle->Append(), what);
      check(inner->Append(), what);
      check(doubles->Append(v), what);
    }
  }
  return finish(outer, what);
}

// ---------------------------------------------------------------------------------------------------------------
// The writer.

void validate(const LeRobotFixture& f) {
  auto bad = [](const std::string& why) { throw std::runtime_error("lerobot fixture: " + why); };
  if (f.dir.empty()) bad("dir is empty");
  if (f.version != "v2.0" && f.version != "v2.1" && f.version != "v3.0") bad("unknown version " + f.version);
  if (f.storage != "image" && f.storage != "video") bad("unknown storage " + f.storage);
  if (f.vector_layout != "fixed" && f.vector_layout != "list") bad("unknown vector_layout " + f.vector_layout);
  if (f.cameras.empty()) bad("no cameras");
  if (f.width < 2 || f.height < 2) bad("frame size too small");
  if (f.image_format != "png" && f.image_format != "jpeg") bad("unknown image_format " + f.image_format);
  if ((f.storage == "video" || f.image_format == "jpeg") && (f.width % 2 || f.height % 2))
    bad("4:2:0 chroma needs even width and height");
  if (f.state_dim < 1 || f.action_dim < 1) bad("state_dim and action_dim must be >= 1");
  if (f.fps < 1) bad("fps must be >= 1");
  if (f.episode_lengths.empty()) bad("no episodes");
  for (int64_t len : f.episode_lengths) {
    if (len < 1) bad("episode lengths must be >= 1");
  }
  if (f.tasks.empty()) bad("no tasks");
  if (f.episodes_per_file < 1) bad("episodes_per_file must be >= 1");
  const int64_t groups = group_of(f, static_cast<int64_t>(f.episode_lengths.size()) - 1) + 1;
  if (is_v3(f) && groups > kChunksSize * 1000) bad("too many files");
}

std::string video_codec_name(const std::string& encoder) {
  const AVCodec* codec = avcodec_find_encoder_by_name(encoder.c_str());
  if (codec) return avcodec_get_name(codec->id);  // "av1", "h264", "hevc"
  return encoder;
}

json info_json(const LeRobotFixture& f, int64_t total_frames) {
  const bool v3 = is_v3(f);
  const int64_t episodes = static_cast<int64_t>(f.episode_lengths.size());
  const bool video = f.storage == "video";
  json features = json::object();
  for (const auto& cam : f.cameras) {
    json ft = {{"dtype", video ? "video" : "image"},
               {"shape", {f.height, f.width, 3}},
               {"names", {"height", "width", "channel"}}};
    if (video) {
      ft["info"] = {
          {"video.height", f.height},   {"video.width", f.width},      {"video.codec", video_codec_name(f.codec)},
          {"video.pix_fmt", "yuv420p"}, {"video.is_depth_map", false}, {"video.fps", f.fps},
          {"video.channels", 3},        {"has_audio", false}};
    }
    features[cam] = ft;
  }
  auto names = [](const std::string& prefix, int64_t n) {
    json a = json::array();
    for (int64_t i = 0; i < n; ++i) a.push_back(prefix + "_" + std::to_string(i));
    return a;
  };
  features[f.state_key] = {{"dtype", "float32"}, {"shape", {f.state_dim}}, {"names", names(f.state_key, f.state_dim)}};
  features[f.action_key] = {
      {"dtype", "float32"}, {"shape", {f.action_dim}}, {"names", names(f.action_key, f.action_dim)}};
  features["timestamp"] = {{"dtype", "float32"}, {"shape", {1}}, {"names", nullptr}};
  for (const char* k : {"frame_index", "episode_index", "index", "task_index"}) {
    features[k] = {{"dtype", "int64"}, {"shape", {1}}, {"names", nullptr}};
  }
  if (v3) {
    for (auto& [key, ft] : features.items()) {
      if (ft["dtype"] != "video") ft["fps"] = f.fps;
    }
  }
  json info = json::object();
  info["codebase_version"] = f.version;
  info["robot_type"] = "panda";
  info["total_episodes"] = episodes;
  info["total_frames"] = total_frames;
  info["total_tasks"] = static_cast<int64_t>(f.tasks.size());
  if (!v3) {
    info["total_videos"] = video ? episodes * static_cast<int64_t>(f.cameras.size()) : 0;
    info["total_chunks"] = (episodes + kChunksSize - 1) / kChunksSize;
  }
  info["chunks_size"] = kChunksSize;
  if (v3) {
    info["data_files_size_in_mb"] = 100;
    info["video_files_size_in_mb"] = 500;
  }
  info["fps"] = f.fps;
  info["splits"] = {{"train", "0:" + std::to_string(episodes)}};
  if (v3) {
    info["data_path"] = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet";
    info["video_path"] =
        video ? json("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4") : json(nullptr);
  } else {
    info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet";
    info["video_path"] =
        video ? json("videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4") : json(nullptr);
  }
  info["features"] = features;
  return info;
}

// meta/tasks.parquet as pandas writes a DataFrame indexed by "task": column task_index, then the index column.
void write_tasks_parquet(const LeRobotFixture& f) {
  arrow::StringBuilder tb;
  std::vector<int64_t> idx;
  for (size_t i = 0; i < f.tasks.size(); ++i) {
    check(tb.Append(f.tasks[i]), "tasks");
    idx.push_back(static_cast<int64_t>(i));
  }
  const json pandas = {{"index_columns", {"task"}},
                       {"column_indexes",
                        {{{"name", nullptr},
                          {"field_name", nullptr},
                          {"pandas_type", "unicode"},
                          {"numpy_type", "object"},
                          {"metadata", {{"encoding", "UTF-8"}}}}}},
                       {"columns",
                        {{{"name", "task_index"},
                          {"field_name", "task_index"},
                          {"pandas_type", "int64"},
                          {"numpy_type", "int64"},
                          {"metadata", nullptr}},
                         {{"name", "task"},
                          {"field_name", "task"},
                          {"pandas_type", "unicode"},
                          {"numpy_type", "object"},
                          {"metadata", nullptr}}}},
                       {"creator", {{"library", "pyarrow"}, {"version", "15.0.0"}}},
                       {"pandas_version", "2.2.0"}};
  auto schema = arrow::schema({arrow::field("task_index", arrow::int64()), arrow::field("task", arrow::utf8())},
                              arrow::key_value_metadata({"pandas"}, {pandas.dump()}));
  auto table = arrow::Table::Make(schema, {int64_column(idx, "task_index"), finish(tb, "task")});
  write_single_table(table, f.dir + "/meta/tasks.parquet");
}

struct EpisodeRecord {
  int64_t index, length, from_index;
  std::vector<std::pair<std::string, FeatureStats>> stats;
};

void write_episodes_parquet(const LeRobotFixture& f, const std::vector<EpisodeRecord>& eps) {
  std::vector<std::shared_ptr<arrow::Field>> fields;
  std::vector<std::shared_ptr<arrow::Array>> cols;
  auto add = [&](const std::string& name, std::shared_ptr<arrow::Array> a) {
    fields.push_back(arrow::field(name, a->type()));
    cols.push_back(std::move(a));
  };
  std::vector<int64_t> ep_index, length, data_chunk, data_file, from, to, zeros;
  auto strings = std::make_shared<arrow::StringBuilder>();
  arrow::ListBuilder tasks(arrow::default_memory_pool(), strings);
  for (const auto& e : eps) {
    ep_index.push_back(e.index);
    check(tasks.Append(), "tasks");
    check(strings->Append(fixture_task(f, e.index)), "tasks");
    length.push_back(e.length);
    const int64_t g = group_of(f, e.index);
    data_chunk.push_back(chunk_of_group(g));
    data_file.push_back(file_of_group(g));
    from.push_back(e.from_index);
    to.push_back(e.from_index + e.length);
    zeros.push_back(0);
  }
  add("episode_index", int64_column(ep_index, "episode_index"));
  add("tasks", finish(tasks, "tasks"));
  add("length", int64_column(length, "length"));
  add("data/chunk_index", int64_column(data_chunk, "data/chunk_index"));
  add("data/file_index", int64_column(data_file, "data/file_index"));
  add("dataset_from_index", int64_column(from, "dataset_from_index"));
  add("dataset_to_index", int64_column(to, "dataset_to_index"));
  if (f.storage == "video") {
    // Timestamps inside each video file: the file's episodes are concatenated.
    std::vector<double> from_ts, to_ts;
    int64_t group = -1, frames_before = 0;
    for (const auto& e : eps) {
      const int64_t g = group_of(f, e.index);
      if (g != group) {
        group = g;
        frames_before = 0;
      }
      from_ts.push_back(static_cast<double>(frames_before) / static_cast<double>(f.fps));
      to_ts.push_back(static_cast<double>(frames_before + e.length) / static_cast<double>(f.fps));
      frames_before += e.length;
    }
    for (const auto& cam : f.cameras) {
      const std::string p = "videos/" + cam + "/";
      add(p + "chunk_index", int64_column(data_chunk, p + "chunk_index"));
      add(p + "file_index", int64_column(data_file, p + "file_index"));
      add(p + "from_timestamp", double_column(from_ts, p + "from_timestamp"));
      add(p + "to_timestamp", double_column(to_ts, p + "to_timestamp"));
    }
  }
  // Per-episode statistics, flattened as LeRobot does: stats/<feature>/<stat>.
  const auto& first = eps.at(0).stats;
  for (size_t k = 0; k < first.size(); ++k) {
    std::vector<FeatureStats> per_episode;
    for (const auto& e : eps) per_episode.push_back(e.stats[k].second);
    std::vector<std::string> stat_names;
    for (const auto& [name, v] : first[k].second.values) stat_names.push_back(name);
    stat_names.insert(stat_names.begin() + 4, "count");
    for (const auto& stat : stat_names) {
      const std::string name = "stats/" + first[k].first + "/" + stat;
      add(name, stats_column(per_episode, stat, name));
    }
  }
  add("meta/episodes/chunk_index", int64_column(zeros, "meta/episodes/chunk_index"));
  add("meta/episodes/file_index", int64_column(zeros, "meta/episodes/file_index"));
  write_single_table(arrow::Table::Make(arrow::schema(fields), cols),
                     f.dir + "/meta/episodes/chunk-000/file-000.parquet");
}

// Writes the parquet rows of one episode (and encodes its frames, as PNG or into the open video writers).
class DataFileWriter {
 public:
  DataFileWriter(const LeRobotFixture& f, const std::string& path) : f_(f), path_(path), schema_(data_schema(f)) {
    out_ = open_output(path);
    writer_ = check(parquet::arrow::FileWriter::Open(*schema_, arrow::default_memory_pool(), out_, writer_properties(),
                                                     arrow_writer_properties()),
                    "parquet::arrow::FileWriter::Open " + path);
  }

  void write_episode(int64_t episode, int64_t length, int64_t first_index,
                     const std::vector<std::vector<std::string>>& pngs /* [camera][frame], image storage */) {
    std::vector<std::shared_ptr<arrow::Array>> cols;
    auto pool = arrow::default_memory_pool();
    if (f_.storage == "image") {
      for (size_t c = 0; c < f_.cameras.size(); ++c) {
        auto bytes = std::make_shared<arrow::BinaryBuilder>(pool);
        auto path = std::make_shared<arrow::StringBuilder>(pool);
        arrow::StructBuilder sb(image_type(), pool, {bytes, path});
        for (int64_t i = 0; i < length; ++i) {
          check(sb.Append(), "image struct");
          check(bytes->Append(pngs[c][i]), "image bytes");
          check(path->Append(fmt(f_.image_format == "jpeg" ? "frame_%06lld.jpg" : "frame_%06lld.png", i)),
                "image path");
        }
        cols.push_back(finish(sb, f_.cameras[c]));
      }
    }
    std::vector<float> state, action;
    arrow::FloatBuilder ts;
    std::vector<int64_t> frame_index, episode_index, index, task_index;
    for (int64_t i = 0; i < length; ++i) {
      for (int64_t d = 0; d < f_.state_dim; ++d) state.push_back(fixture_state(f_, episode, i, d));
      for (int64_t d = 0; d < f_.action_dim; ++d) action.push_back(fixture_action(f_, episode, i, d));
      check(ts.Append(static_cast<float>(static_cast<double>(i) / static_cast<double>(f_.fps))), "timestamp");
      frame_index.push_back(i);
      episode_index.push_back(episode);
      index.push_back(first_index + i);
      task_index.push_back(fixture_task_index(f_, episode));
    }
    cols.push_back(vector_column(f_, f_.state_dim, state, f_.state_key));
    cols.push_back(vector_column(f_, f_.action_dim, action, f_.action_key));
    cols.push_back(finish(ts, "timestamp"));
    cols.push_back(int64_column(frame_index, "frame_index"));
    cols.push_back(int64_column(episode_index, "episode_index"));
    cols.push_back(int64_column(index, "index"));
    cols.push_back(int64_column(task_index, "task_index"));
    auto table = arrow::Table::Make(schema_, cols, length);
    check(table->Validate(), "validate episode table");
    check(writer_->WriteTable(*table, length), "parquet WriteTable " + path_);  // one row group per episode
  }

  void close() {
    check(writer_->Close(), "parquet close " + path_);
    check(out_->Close(), "close " + path_);
  }

 private:
  const LeRobotFixture& f_;
  std::string path_;
  std::shared_ptr<arrow::Schema> schema_;
  std::shared_ptr<arrow::io::FileOutputStream> out_;
  std::unique_ptr<parquet::arrow::FileWriter> writer_;
};

}  // namespace

// -----------------------------------------------------------------------------------------------------------------
// Public API.

uint8_t fixture_pixel(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame, int64_t y, int64_t x,
                      int64_t channel) {
  const Square s = square(f, camera, episode, frame);
  if (x >= s.x0 && x < s.x0 + s.side && y >= s.y0 && y < s.y0 + s.side) return 232;
  const int64_t v = 25 + gradient(f, camera, episode, frame, 0, x, f.width, channel) +
                    gradient(f, camera, episode, frame, 1, y, f.height, channel);
  return static_cast<uint8_t>(v);  // [35, 215]
}

std::vector<uint8_t> fixture_frame(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame) {
  const int64_t w = f.width, h = f.height;
  std::vector<uint8_t> out(static_cast<size_t>(w * h * 3));
  std::vector<int64_t> gx(w * 3), gy(h * 3);
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t x = 0; x < w; ++x) gx[x * 3 + c] = gradient(f, camera, episode, frame, 0, x, w, c);
    for (int64_t y = 0; y < h; ++y) gy[y * 3 + c] = gradient(f, camera, episode, frame, 1, y, h, c);
  }
  const Square s = square(f, camera, episode, frame);
  uint8_t* p = out.data();
  for (int64_t y = 0; y < h; ++y) {
    const bool row_in = y >= s.y0 && y < s.y0 + s.side;
    for (int64_t x = 0; x < w; ++x, p += 3) {
      if (row_in && x >= s.x0 && x < s.x0 + s.side) {
        p[0] = p[1] = p[2] = 232;
        continue;
      }
      for (int64_t c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(25 + gx[x * 3 + c] + gy[y * 3 + c]);
    }
  }
  return out;
}

float fixture_state(const LeRobotFixture& f, int64_t episode, int64_t frame, int64_t dim) {
  return vector_value(f, 100, episode, frame, dim);
}

float fixture_action(const LeRobotFixture& f, int64_t episode, int64_t frame, int64_t dim) {
  return vector_value(f, 200, episode, frame, dim);
}

const std::string& fixture_task(const LeRobotFixture& f, int64_t episode) {
  return f.tasks.at(static_cast<size_t>(episode) % f.tasks.size());
}

int64_t fixture_task_index(const LeRobotFixture& f, int64_t episode) {
  return static_cast<int64_t>(static_cast<size_t>(episode) % f.tasks.size());
}

std::string fixture_data_file(const LeRobotFixture& f, int64_t episode) {
  return f.dir + "/" + rel_data_path(f, episode);
}

std::string fixture_video_file(const LeRobotFixture& f, int64_t camera, int64_t episode) {
  return f.dir + "/" + rel_video_path(f, camera, episode);
}

int64_t fixture_global_index(const LeRobotFixture& f, int64_t episode, int64_t frame) {
  int64_t index = 0;
  for (int64_t e = 0; e < episode; ++e) index += f.episode_lengths.at(e);
  return index + frame;
}

int64_t fixture_video_first_frame(const LeRobotFixture& f, int64_t episode) {
  int64_t first = 0;
  for (int64_t e = episode - 1; e >= 0 && group_of(f, e) == group_of(f, episode); --e) first += f.episode_lengths.at(e);
  return first;
}

void write_lerobot_fixture(const LeRobotFixture& f) {
  validate(f);
  // The encoders' statistics are noise here (SVT-AV1 logs by itself, its level from SVT_LOG: 1 = errors).
  if (av_log_get_level() > AV_LOG_ERROR) av_log_set_level(AV_LOG_ERROR);
  ::setenv("SVT_LOG", "1", 0);
  if (f.storage == "video") find_encoder(f.codec, "video storage");  // fail before creating anything
  if (f.storage == "image") find_encoder(f.image_format == "jpeg" ? "mjpeg" : "png", "image storage");
  std::string dir = f.dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  make_parents(dir);  // the parents of dir ...
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) throw std::runtime_error("lerobot fixture: " + f.dir + " already exists");
  make_dir(dir, true);  // ... dir itself must be new

  const bool v3 = is_v3(f);
  const bool video = f.storage == "video";
  const int64_t episodes = static_cast<int64_t>(f.episode_lengths.size());
  const int64_t ncam = static_cast<int64_t>(f.cameras.size());

  StatsAccumulator total(f);
  std::vector<EpisodeRecord> records;
  std::vector<std::unique_ptr<ImageEncoder>> png(video ? 0 : ncam);  // one per camera: cameras encode in parallel
  for (auto& p : png) p = std::make_unique<ImageEncoder>(f.image_format, f.width, f.height);

  int64_t global_index = 0;
  for (int64_t first = 0; first < episodes;) {
    const int64_t g = group_of(f, first);
    int64_t last = first;  // exclusive end of this file's episodes
    while (last < episodes && group_of(f, last) == g) ++last;
    DataFileWriter data(f, fixture_data_file(f, first));
    std::vector<std::unique_ptr<VideoWriter>> videos;
    if (video) {
      for (int64_t c = 0; c < ncam; ++c) {
        videos.push_back(
            std::make_unique<VideoWriter>(fixture_video_file(f, c, first), f.codec, f.width, f.height, f.fps));
      }
    }
    for (int64_t e = first; e < last; ++e) {
      const int64_t length = f.episode_lengths[e];
      StatsAccumulator ep_stats(f);
      std::vector<std::vector<std::string>> pngs(video ? 0 : ncam);
      // Each camera's frames are made, counted and encoded on a thread of its own (touching only its own state).
      auto camera_work = [&](int64_t c) {
        for (int64_t i = 0; i < length; ++i) {
          const std::vector<uint8_t> rgb = fixture_frame(f, c, e, i);
          ep_stats.add_image(c, rgb);
          if (video) {
            videos[c]->add(rgb);
          } else {
            pngs[c].push_back(png[c]->encode(rgb, fixture_data_file(f, e)));
            if (e == f.corrupt_image_episode && i == f.corrupt_image_frame) {
              // A PNG signature, then bytes that are no PNG chunk: the decoder must refuse it.
              pngs[c].back().resize(std::min<size_t>(pngs[c].back().size(), 64));
              for (size_t b = 8; b < pngs[c].back().size(); ++b) pngs[c].back()[b] = static_cast<char>(0xa5 ^ b);
            }
          }
        }
      };
      std::vector<std::exception_ptr> errors(ncam);
      std::vector<std::thread> threads;
      for (int64_t c = 1; c < ncam; ++c) {
        threads.emplace_back([&, c] {
          try {
            camera_work(c);
          } catch (...) {
            errors[c] = std::current_exception();
          }
        });
      }
      try {
        camera_work(0);
      } catch (...) {
        errors[0] = std::current_exception();
      }
      for (auto& t : threads) t.join();
      for (const auto& err : errors) {
        if (err) std::rethrow_exception(err);
      }
      for (int64_t i = 0; i < length; ++i) ep_stats.add_frame(f, e, i, global_index + i);
      data.write_episode(e, length, global_index, pngs);
      records.push_back({e, length, global_index, ep_stats.compute(f, v3)});
      total.merge(ep_stats);
      global_index += length;
    }
    for (auto& v : videos) v->finish();
    data.close();
    first = last;
  }

  // Metadata.
  write_text(f.dir + "/meta/info.json", info_json(f, global_index).dump(4) + "\n");
  write_text(f.dir + "/meta/stats.json", stats_dict_json(total.compute(f, v3)).dump(4) + "\n");
  if (v3) {
    write_tasks_parquet(f);
    write_episodes_parquet(f, records);
    return;
  }
  std::string episodes_jsonl, tasks_jsonl, stats_jsonl;
  for (const auto& r : records) {
    episodes_jsonl +=
        json({{"episode_index", r.index}, {"tasks", {fixture_task(f, r.index)}}, {"length", r.length}}).dump() + "\n";
    stats_jsonl += json({{"episode_index", r.index}, {"stats", stats_dict_json(r.stats)}}).dump() + "\n";
  }
  for (size_t t = 0; t < f.tasks.size(); ++t) {
    tasks_jsonl += json({{"task_index", static_cast<int64_t>(t)}, {"task", f.tasks[t]}}).dump() + "\n";
  }
  write_text(f.dir + "/meta/episodes.jsonl", episodes_jsonl);
  write_text(f.dir + "/meta/tasks.jsonl", tasks_jsonl);
  if (f.version == "v2.1") write_text(f.dir + "/meta/episodes_stats.jsonl", stats_jsonl);
}

}  // namespace vlatune::testing
