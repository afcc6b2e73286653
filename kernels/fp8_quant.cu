// Fused FP8 quantization: amax, scale, cast and transposed copy in one pass (contract in fp8.h, design in fp8.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/fp8.h"
#include "kernels/fused_device.cuh"
#include "kernels/geglu_device.cuh"

namespace vlatune::kernels {

using fused_detail::from_float;
using fused_detail::geglu_grads2;
using fused_detail::geglu_value2;
using fused_detail::GegluGrads2;
using fused_detail::gelu_tanh_pair;
using fused_detail::GeluTanhPair;
using fused_detail::kVec;
using fused_detail::load_pack;
using fused_detail::NvtxRange;
using fused_detail::Pack;
using fused_detail::round_to2;
using fused_detail::to_float;

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // a block casts 64 x 64 tiles: rows read as 16-byte vectors, the transpose via smem
constexpr int kAmaxBlocksPerSm = 8;
constexpr int64_t kMaxWalkTiles = int64_t{1} << 30;  // TileWalk's int arithmetic

template <Fp8Format F>
__device__ __forceinline__ uint8_t cast_fp8(float x) {
  // Round to nearest even, saturating to +-max (NaN stays NaN): as ATen's clamp(-max, max).to(fp8).
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, F == Fp8Format::kE4m3 ? __NV_E4M3 : __NV_E5M2));
}

// Maximum over the block (every thread gets it). fmaxf drops NaN.
__device__ __forceinline__ float block_max_all(float x) {
  __shared__ float warp_max[32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, offset));
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}

// Non-negative floats order as their bit patterns: an integer atomicMax is a float max.
__device__ __forceinline__ void atomic_max_nonneg(float* address, float value) {
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

using Tile = uint8_t[kTile][kTile + 16];  // an FP8 tile in shared memory, padded against bank conflicts

// The shared-memory column of tile element (r, c): each row's 8-byte chunks are XOR-swizzled by the row's 16-row
// group. The transposed read has the lanes of a warp read one column in four 16-row groups, and the 80-byte row
// stride puts rows 16 apart in the same bank: unswizzled that read is a 4-way bank conflict, swizzled it hits four
// different chunks. A stored vector (8 or 4 bytes at a multiple of its size) stays inside its chunk.
__device__ __forceinline__ int tile_col(int r, int c) {
  return c ^ (((r >> 4) & 3) << 3);
}

// A kTile x kTile tile of a [rows, cols] matrix: its first row and column. Tiles are numbered down the rows first,
// so the blocks working at one time write neighbouring segments of the transposed copy's rows.
struct TileAt {
  int64_t row0, col0;
};
__host__ __device__ __forceinline__ int64_t tile_count(int64_t rows, int64_t cols) {
  return ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
}

__device__ __forceinline__ TileAt tile_at(int64_t tile, int64_t rows) {
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  return {(tile % row_tiles) * kTile, (tile / row_tiles) * kTile};
}

// The GeGLU casts' walk over the same tiles (blockIdx.x, then every gridDim.x-th, in tile_at's order), stepped by
// additions instead of a division per tile: with it the staged GeGLU casts ran 1.69 -> 1.56 ms (backward) and
// 1.10 -> 1.05 ms (forward) per backbone layer at batch 32. The plain cast ran slower with it (0.056 -> 0.063 ms
// for [22,784, 2,048]: more registers, fewer resident blocks) and keeps tile_at. The GeGLU launches keep the tile
// count within int (kMaxWalkTiles).
struct TileWalk {
  int row_tile, col_tile;    // the current tile
  int row_tiles, col_tiles;  // of the matrix
  int step_rows, step_cols;  // gridDim.x tiles as whole columns of tiles and a remainder of row tiles

  __device__ __forceinline__ bool valid() const { return col_tile < col_tiles; }
  __device__ __forceinline__ TileAt at() const {
    return {static_cast<int64_t>(row_tile) * kTile, static_cast<int64_t>(col_tile) * kTile};
  }
  __device__ __forceinline__ TileWalk next() const {
    TileWalk w = *this;
    w.row_tile += step_rows;
    w.col_tile += step_cols;
    if (w.row_tile >= row_tiles) {
      w.row_tile -= row_tiles;
      ++w.col_tile;
    }
    return w;
  }
};
__device__ __forceinline__ TileWalk tile_walk(int64_t rows, int64_t cols) {
  const int row_tiles = static_cast<int>((rows + kTile - 1) / kTile);
  const int col_tiles = static_cast<int>((cols + kTile - 1) / kTile);
  const int first = static_cast<int>(blockIdx.x), step = static_cast<int>(gridDim.x);
  return {first % row_tiles, first / row_tiles, row_tiles, col_tiles, step % row_tiles, step / row_tiles};
}

// This thread's 16-byte vectors (V elements of T) of tile `at` inside a [rows, cols] matrix: body(j, r, c, gr, gc)
// for the thread's j-th vector (j < kTileVectors<V>), its first element at (r, c) in the tile and (gr, gc) in the
// matrix. rows and cols are multiples of 16, so vectors are whole.
template <int V>
constexpr int kTileVectors = kTile* kTile / V / kThreads;  // per thread and tile: 2 of bf16, 4 of fp32
template <int V, typename Body>
__device__ __forceinline__ void for_each_tile_vector(TileAt at, int64_t rows, int64_t cols, Body body) {
  constexpr int kVecPerRow = kTile / V;  // vectors per tile row
#pragma unroll
  for (int j = 0; j < kTileVectors<V>; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads;
    const int r = i / kVecPerRow, c = (i % kVecPerRow) * V;
    const int64_t gr = at.row0 + r, gc = at.col0 + c;
    if (gr >= rows || gc >= cols) continue;
    body(j, r, c, gr, gc);
  }
}

// The GeGLU casts read their inputs one tile ahead: a block issues the next tile's loads as asynchronous copies into
// shared memory (cp.async) before it casts the current tile, so they are in flight while it computes and stores.
// Each thread copies and later reads only its own vectors' slots, so waiting for its own copies (no barrier) makes
// them visible, and a stage is refilled only after the thread consumed it the iteration before. The casts are
// issue-bound (ncu: ~75% of issue slots busy, DRAM at 35-45% of peak); staging mostly helps the forward cast that
// writes e4m3 blocks, which has few warps per SM to hide its loads with.
constexpr int kStages = 2;
extern __shared__ __align__(16) unsigned char stage_smem[];

template <int kBytes>
__device__ __forceinline__ void async_copy(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));  // L2 only: streamed once
  } else {
    static_assert(kBytes == 8 || kBytes == 4, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(kBytes));
  }
}
__device__ __forceinline__ void async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Wait until at most one group (the tile issued last) is still in flight.
__device__ __forceinline__ void async_wait_all_but_last() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}
template <typename Slot>
__device__ __forceinline__ void async_copy_slot(Slot& dst, const void* src) {
  async_copy<sizeof(Slot)>(&dst, src);
}

// The staged tile loop of the GeGLU casts. The block's first tile (walk) must be issued into stages[0] already, so
// that its copies overlap the scale read; issue(tile, stage) copies a tile's inputs (or commits an empty group past
// the last tile), body(at, stage, first) casts a tile once its copies have landed.
template <typename Stage, typename Issue, typename Body>
__device__ __forceinline__ void for_each_staged_tile(TileWalk walk, Stage* stages, Issue issue, Body body) {
  int s = 0;
  for (bool first = true; walk.valid(); first = false, s ^= 1) {
    const TileWalk next = walk.next();
    issue(next, stages[s ^ 1]);
    async_wait_all_but_last();
    body(walk.at(), stages[s], first);
    walk = next;
  }
}

// A share of a tile's transposed write: 4 tile columns (c, a multiple of 4) by 16 rows from r, read as 16 4-byte words
// and transposed by byte permutes into 4 output rows of 16 bytes. 64 threads write a whole tile
// (kTransposeThreads); byte-wise reads took about twice the instructions.
constexpr int kTransposeThreads = (kTile / 4) * (kTile / 16);
struct TilePart {
  int c, r;
};
// Share `index` in [0, kTransposeThreads): 16 consecutive shares cover a 16-row band.
__device__ __forceinline__ TilePart tile_part(int index) {
  return {(index % (kTile / 4)) * 4, (index / (kTile / 4)) * 16};
}
// The output rows `part.c .. part.c + 3` of out_row0 (the tile's first output row; rows ld bytes apart), bytes gr
// to gr + 15. Call after the block's barrier.
__device__ __forceinline__ void write_transposed(const Tile& tile, TilePart part, uint8_t* out_row0, int64_t ld,
                                                 int64_t gr) {
  uint32_t column[4][4];  // [k][q]: tile column part.c + k, rows part.r + 4q .. + 3, first row in the low byte
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t w[4];  // rows part.r + 4q + i, columns part.c .. + 3 (a word stays inside its swizzle chunk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = part.r + 4 * q + i;
      w[i] = *reinterpret_cast<const uint32_t*>(&tile[r][tile_col(r, part.c)]);
    }
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);  // columns 0, 1
    const uint32_t hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);  // columns 2, 3
    column[0][q] = __byte_perm(lo01, lo23, 0x5410);
    column[1][q] = __byte_perm(lo01, lo23, 0x7632);
    column[2][q] = __byte_perm(hi01, hi23, 0x5410);
    column[3][q] = __byte_perm(hi01, hi23, 0x7632);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    *reinterpret_cast<uint4*>(out_row0 + (part.c + k) * ld + gr) =
        make_uint4(column[k][0], column[k][1], column[k][2], column[k][3]);
}

// The plain casts' transposed write, by all kThreads threads: tile column c = threadIdx.x / 4 to output row c, 16
// source rows per thread read byte by byte. With one output tile, spreading it over every thread beat the word-wise
// shares of 64 threads (0.0627 against 0.0642 ms for [22,784, 2,048]).
__device__ __forceinline__ void write_transposed_bytes(const Tile& tile, uint8_t* out_row0, int64_t ld, TileAt at,
                                                       int64_t rows, int64_t cols) {
  const int c = static_cast<int>(threadIdx.x) / (kTile / 16), r = (static_cast<int>(threadIdx.x) % (kTile / 16)) * 16;
  if (at.row0 + r >= rows || at.col0 + c >= cols) return;
  Pack<uint8_t, 16> q;
#pragma unroll
  for (int j = 0; j < 16; ++j) q.v[j] = tile[r + j][tile_col(r + j, c)];
  *reinterpret_cast<Pack<uint8_t, 16>*>(out_row0 + c * ld + at.row0 + r) = q;
}

// Where block (row, col / kGegluBlock) keeps its dequantization scale: [2F / kGegluBlock, rows], so that a tile's
// 64 rows read and write 256 contiguous bytes of scales. Row-major ([rows, 2F / kGegluBlock]) a tile wrote one float
// into each of 64 rows 2 KB apart, and the forward cast took 0.17 ms more per backbone layer at batch 32
// (bench/RESULTS.md, 2026-12-02, sixth session).
__device__ __forceinline__ int64_t block_scale_index(int64_t row, int64_t col, int64_t rows) {
  return (col / kGegluBlock) * rows + row;
}

// One kGegluBlock-element block of a merged row, held V elements per lane by the kGegluBlock / V consecutive lanes
// of a tile row (for_each_tile_vector's layout; every lane of the warp takes part): cast to e4m3 with the block's
// own scale into data (row stride ld elements), the block's first lane writing its dequantization scale.
template <typename T, int V>
__device__ __forceinline__ void write_e4m3_block(const Pack<T, V>& v, int64_t row, int64_t col, int64_t ld,
                                                 int64_t rows, uint8_t* data, float* inv_scale) {
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) m = fmaxf(m, fabsf(to_float(v.v[k])));
#pragma unroll
  for (int offset = 1; offset < kGegluBlock / V; offset <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  const float scale = (m > 0.f && isfinite(m)) ? __fdiv_rn(fp8_max_value(Fp8Format::kE4m3), m) : 1.f;
  Pack<uint8_t, V> q;
#pragma unroll
  for (int k = 0; k < V; ++k) q.v[k] = cast_fp8<Fp8Format::kE4m3>(__fmul_rn(to_float(v.v[k]), scale));
  *reinterpret_cast<Pack<uint8_t, V>*>(data + row * ld + col) = q;
  if (col % kGegluBlock == 0) inv_scale[block_scale_index(row, col, rows)] = __fdiv_rn(1.f, scale);
}

// The block's max |value| into amax_out (atomic), when one is wanted.
__device__ __forceinline__ void record_amax(float m, float* amax_out) {
  if (amax_out == nullptr) return;
  m = block_max_all(m);
  if (threadIdx.x == 0) atomic_max_nonneg(amax_out, m);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_amax_kernel(const Fp8AmaxParams p) {
  constexpr int V = kVec<T>;
  const T* x = static_cast<const T*>(p.x);
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p.count % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    for (int64_t i = first; i < p.count / V; i += stride) {
      const Pack<T, V> v = load_pack(x, i);
#pragma unroll
      for (int k = 0; k < V; ++k) m = fmaxf(m, fabsf(to_float(v.v[k])));
    }
  } else {
    for (int64_t i = first; i < p.count; i += stride) m = fmaxf(m, fabsf(to_float(x[i])));
  }
  m = block_max_all(m);
  if (threadIdx.x == 0) atomic_max_nonneg(p.amax_out, m);
}

// scale = fp8_max / max(amax_in[i], i != skip); 1 when that is 0, not finite, or amax_in is null (amax-only passes).
// Called by a whole warp: each lane reads its share of the history, so a 16-entry history costs one round trip to
// L2 instead of 16 in a row (every block reads it before it can cast). Lane 0 writes amax_used. fmaxf drops NaN
// in any order, so the result is the sequential maximum's.
__device__ __forceinline__ float warp_scale_from(const float* amax_in, int count, int skip, float fmax,
                                                 float* amax_used) {
  const int lane = threadIdx.x & 31;
  float amax = 0.f;
  if (amax_in != nullptr)
    for (int i = lane; i < count; i += 32)
      if (i != skip) amax = fmaxf(amax, amax_in[i]);
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (lane == 0 && amax_used != nullptr) *amax_used = amax;
  return (amax > 0.f && isfinite(amax)) ? __fdiv_rn(fmax, amax) : 1.f;
}

// The cast of one vector: amax into m, the FP8 bytes stored row-major (out) and into the transposed write's tile.
template <Fp8Format F, typename T, int V>
__device__ __forceinline__ void cast_vector(const Pack<T, V>& v, float scale, float& m, uint8_t* out, Tile& tile,
                                            bool to_tile, int r, int c) {
  Pack<uint8_t, V> q;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float f = to_float(v.v[k]);
    m = fmaxf(m, fabsf(f));
    q.v[k] = cast_fp8<F>(__fmul_rn(f, scale));
  }
  if (out != nullptr) *reinterpret_cast<Pack<uint8_t, V>*>(out) = q;
  if (to_tile) *reinterpret_cast<Pack<uint8_t, V>*>(&tile[r][tile_col(r, c)]) = q;
}

// The cast's scale from p.amax_in, read by warp 0 into s_scale; block 0 also writes inv_scale_out and amax_used_out.
// The caller's barrier publishes it.
template <Fp8Format F>
__device__ __forceinline__ void read_scale(const Fp8QuantParams& p, float& s_scale) {
  if (threadIdx.x >= 32) return;
  const bool first = blockIdx.x == 0;
  const float scale =
      warp_scale_from(p.amax_in, p.amax_count, p.amax_skip, fp8_max_value(F), first ? p.amax_used_out : nullptr);
  if (threadIdx.x == 0) {
    s_scale = scale;
    if (first && p.inv_scale_out != nullptr) p.inv_scale_out[0] = __fdiv_rn(1.f, scale);
  }
}

// The backward casts' two scales: the gradient's from p (as read_scale) and the rebuilt activation's (e4m3, from
// act_amax_in alone), read by warp 0 into s_scale and s_act_scale; block 0 also writes amax_used_out and both inverse
// scales. The caller's barrier publishes them.
template <Fp8Format F>
__device__ __forceinline__ void read_backward_scales(const Fp8QuantParams& p, const float* act_amax_in,
                                                     float* act_inv_scale_out, float& s_scale, float& s_act_scale) {
  if (threadIdx.x >= 32) return;
  const bool first = blockIdx.x == 0;
  const float scale =
      warp_scale_from(p.amax_in, p.amax_count, p.amax_skip, fp8_max_value(F), first ? p.amax_used_out : nullptr);
  const float act_scale = warp_scale_from(act_amax_in, 1, -1, fp8_max_value(Fp8Format::kE4m3), nullptr);
  if (threadIdx.x == 0) {
    s_scale = scale;
    s_act_scale = act_scale;
    if (first && p.inv_scale_out != nullptr) p.inv_scale_out[0] = __fdiv_rn(1.f, scale);
    if (first && act_inv_scale_out != nullptr) act_inv_scale_out[0] = __fdiv_rn(1.f, act_scale);
  }
}

// The plain cast, x [rows, cols]: x loaded directly (staged, the copies' extra instructions made it slower:
// 0.50 -> 0.56 ms for [22,784, 16,384]), the transposed copy written byte-wise by every thread. kGelu: the values
// cast are gelu_tanh(x) rounded to T, as the GELU kernel stores them (SigLIP's fc2 input, never in memory).
template <typename T, Fp8Format F, bool kGelu>
__global__ void __launch_bounds__(kThreads) fp8_quant_kernel(const Fp8QuantParams p) {
  constexpr int V = kVec<T>;  // elements per 16-byte load: 8 bf16, 4 fp32
  __shared__ float s_scale;
  __shared__ __align__(16) Tile tile;  // FP8 tile for the transposed write
  read_scale<F>(p, s_scale);
  __syncthreads();
  const float scale = s_scale;
  const T* x = static_cast<const T*>(p.x);
  uint8_t* out = static_cast<uint8_t*>(p.out);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t);
  float m = 0.f;
  const int64_t tiles = tile_count(p.rows, p.cols);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileAt at = tile_at(t, p.rows);
    if (out_t != nullptr && t != blockIdx.x) __syncthreads();  // the previous tile's transposed reads are done
    for_each_tile_vector<V>(at, p.rows, p.cols, [&](int, int r, int c, int64_t gr, int64_t gc) {
      Pack<T, V> v = load_pack(x + gr * p.cols + gc, 0);
      if constexpr (kGelu) {
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = from_float<T>(fused_detail::gelu_tanh(to_float(v.v[k])));
      }
      cast_vector<F>(v, scale, m, out ? out + gr * p.out_ld + gc : nullptr, tile, out_t != nullptr, r, c);
    });
    if (out_t != nullptr) {
      __syncthreads();
      write_transposed_bytes(tile, out_t + at.col0 * p.out_t_ld, p.out_t_ld, at, p.rows, p.cols);
    }
  }
  record_amax(m, p.amax_out);
}

// One stage of the GeGLU casts' staged inputs (kStages of them in stage_smem): slot [half][j][thread], one 16-byte
// vector of merged's gate (0) or up (1) half each.
template <typename T>
struct GegluCastStage {
  static constexpr int V = kVec<T>;
  Pack<T, V> in[2][kTileVectors<V>][kThreads];
};

// The GeGLU casts' body: merged [rows, 2 * cols] staged a tile ahead, the value cast geglu(merged) rounded to T as
// the geglu kernel stores it, the transposed copy written word-wise. kBlocks: merged also goes to p.blocks_out.
template <typename T, Fp8Format F, bool kBlocks>
__device__ __forceinline__ void geglu_quantize_tiles(const Fp8QuantParams& p) {
  constexpr int V = kVec<T>;
  using Stage = GegluCastStage<T>;
  Stage* stages = reinterpret_cast<Stage*>(stage_smem);
  __shared__ float s_scale;
  __shared__ __align__(16) Tile tile;
  const T* x = static_cast<const T*>(p.x);
  const auto issue = [&](const TileWalk& w, Stage& stage) {
    if (w.valid()) {
      for_each_tile_vector<V>(w.at(), p.rows, p.cols, [&](int j, int, int, int64_t gr, int64_t gc) {
        const T* row = x + gr * 2 * p.cols;
        async_copy_slot(stage.in[0][j][threadIdx.x], row + gc);
        async_copy_slot(stage.in[1][j][threadIdx.x], row + p.cols + gc);
      });
    }
    async_commit();  // an empty group past the last tile keeps the wait's count uniform
  };
  const TileWalk walk = tile_walk(p.rows, p.cols);
  issue(walk, stages[0]);
  read_scale<F>(p, s_scale);
  __syncthreads();
  const float scale = s_scale;
  uint8_t* out = static_cast<uint8_t*>(p.out);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t);
  float m = 0.f;
  for_each_staged_tile(walk, stages, issue, [&](const TileAt& at, const Stage& stage, bool first) {
    if (out_t != nullptr && !first) __syncthreads();  // the previous tile's transposed reads are done
    for_each_tile_vector<V>(at, p.rows, p.cols, [&](int j, int r, int c, int64_t gr, int64_t gc) {
      const Pack<T, V> g = stage.in[0][j][threadIdx.x], u = stage.in[1][j][threadIdx.x];
      if constexpr (kBlocks) {
        uint8_t* blocks = static_cast<uint8_t*>(p.blocks_out);
        write_e4m3_block<T, V>(g, gr, gc, 2 * p.cols, p.rows, blocks, p.blocks_inv_scale_out);
        write_e4m3_block<T, V>(u, gr, p.cols + gc, 2 * p.cols, p.rows, blocks, p.blocks_inv_scale_out);
      }
      Pack<T, V> v;
#pragma unroll
      for (int k = 0; k < V; k += 2) {
        const float2 a = geglu_value2<T>(make_float2(to_float(g.v[k]), to_float(g.v[k + 1])),
                                         make_float2(to_float(u.v[k]), to_float(u.v[k + 1])));
        v.v[k] = from_float<T>(a.x);
        v.v[k + 1] = from_float<T>(a.y);
      }
      cast_vector<F>(v, scale, m, out ? out + gr * p.out_ld + gc : nullptr, tile, out_t != nullptr, r, c);
    });
    if (out_t != nullptr) {
      __syncthreads();
      if (threadIdx.x < kTransposeThreads) {
        const TilePart part = tile_part(threadIdx.x);
        const int64_t gr = at.row0 + part.r;
        if (gr < p.rows && at.col0 + part.c < p.cols)
          write_transposed(tile, part, out_t + at.col0 * p.out_t_ld, p.out_t_ld, gr);
      }
    }
  });
  record_amax(m, p.amax_out);
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) fp8_geglu_quant_kernel(const Fp8QuantParams p) {
  geglu_quantize_tiles<T, F, false>(p);
}

// The forward GeGLU cast that also writes merged's e4m3 blocks, compiled for a minimum of one resident block per SM:
// the compiler then takes more registers (80, against 48 without the bound), which took this cast from 1.50 to
// 1.38 ms per backbone layer at batch 32 when it was introduced (bench/RESULTS.md, 2026-12-02, sixth session).
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads, 1) fp8_geglu_blocks_quant_kernel(const Fp8QuantParams p) {
  geglu_quantize_tiles<T, F, true>(p);
}

// One stage of the GeGLU backward's staged inputs: dy and, per half of merged, its 16-byte vector (kBlocks false)
// or its e4m3 bytes with the block's dequantization scale (kBlocks).
template <typename T, bool kBlocks>
struct GegluBwdStage {
  static constexpr int V = kVec<T>;
  using Merged = std::conditional_t<kBlocks, Pack<uint8_t, V>, Pack<T, V>>;
  Pack<T, V> dy[kTileVectors<V>][kThreads];
  Merged gate[kTileVectors<V>][kThreads], up[kTileVectors<V>][kThreads];
  float gate_inv_scale[kBlocks ? kTileVectors<V> : 1][kThreads], up_inv_scale[kBlocks ? kTileVectors<V> : 1][kThreads];
};

// V elements of a merged row as staged, in fp32: the vector itself, or read back from its e4m3 block: fp32(q) times
// the block's inverse scale, rounded to T (two per conversion).
template <typename T, int V>
__device__ __forceinline__ Pack<float, V> staged_merged(const Pack<T, V>& v, float) {
  Pack<float, V> f;
#pragma unroll
  for (int k = 0; k < V; ++k) f.v[k] = to_float(v.v[k]);
  return f;
}
template <typename T, int V>
__device__ __forceinline__ Pack<float, V> staged_merged(const Pack<uint8_t, V>& q, float inv) {
  Pack<float, V> f;
#pragma unroll
  for (int k = 0; k < V; k += 2) {
    __nv_fp8_e4m3 e0, e1;
    e0.__x = q.v[k];
    e1.__x = q.v[k + 1];
    const float2 r =
        round_to2<T>(make_float2(__fmul_rn(static_cast<float>(e0), inv), __fmul_rn(static_cast<float>(e1), inv)));
    f.v[k] = r.x;
    f.v[k + 1] = r.y;
  }
  return f;
}

// The GeGLU backward, cast: 64 x 64 tiles of the GeGLU width, a block walking several; d gate, d up and the
// recomputed GeGLU output take three shared-memory tiles for their transposed writes. kBlocks: merged is read from
// its e4m3 blocks.
template <typename T, Fp8Format F, bool kBlocks>
__global__ void __launch_bounds__(kThreads) fp8_geglu_bwd_kernel(const Fp8GegluBwdParams bp) {
  const Fp8QuantParams& p = bp.grad_merged;
  constexpr int V = kVec<T>;
  using Stage = GegluBwdStage<T, kBlocks>;
  Stage* stages = reinterpret_cast<Stage*>(stage_smem);
  __shared__ float s_scale, s_act_scale;
  __shared__ __align__(16) Tile tile_g;
  __shared__ __align__(16) Tile tile_u;
  __shared__ __align__(16) Tile tile_a;
  const T* merged = static_cast<const T*>(p.x);
  const uint8_t* blocks = static_cast<const uint8_t*>(bp.merged_blocks);
  const T* grad = static_cast<const T*>(bp.grad);
  const int64_t f = p.cols;
  const auto issue = [&](const TileWalk& w, Stage& stage) {
    if (w.valid()) {
      for_each_tile_vector<V>(w.at(), p.rows, f, [&](int j, int, int, int64_t gr, int64_t gc) {
        const int i = threadIdx.x;
        async_copy_slot(stage.dy[j][i], grad + gr * f + gc);
        if constexpr (kBlocks) {
          async_copy_slot(stage.gate[j][i], blocks + gr * 2 * f + gc);
          async_copy_slot(stage.up[j][i], blocks + gr * 2 * f + f + gc);
          async_copy_slot(stage.gate_inv_scale[j][i], bp.merged_blocks_inv_scale + block_scale_index(gr, gc, p.rows));
          async_copy_slot(stage.up_inv_scale[j][i], bp.merged_blocks_inv_scale + block_scale_index(gr, f + gc, p.rows));
        } else {
          async_copy_slot(stage.gate[j][i], merged + gr * 2 * f + gc);
          async_copy_slot(stage.up[j][i], merged + gr * 2 * f + f + gc);
        }
      });
    }
    async_commit();  // an empty group past the last tile keeps the wait's count uniform
  };
  const TileWalk walk = tile_walk(p.rows, f);
  issue(walk, stages[0]);
  read_backward_scales<F>(p, bp.act_amax_in, bp.act_inv_scale_out, s_scale, s_act_scale);
  __syncthreads();
  const float scale = s_scale, act_scale = s_act_scale;
  uint8_t* out = static_cast<uint8_t*>(p.out);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t);
  uint8_t* act_t = static_cast<uint8_t*>(bp.act_t);
  const bool transposes = out_t != nullptr || act_t != nullptr;
  float m = 0.f;
  for_each_staged_tile(walk, stages, issue, [&](const TileAt& at, const Stage& stage, bool first) {
    if (transposes && !first) __syncthreads();  // the previous tile's transposed reads are done
    for_each_tile_vector<V>(at, p.rows, f, [&](int j, int r, int c, int64_t gr, int64_t gc) {
      const int i = threadIdx.x;
      const Pack<float, V> g = staged_merged<T, V>(stage.gate[j][i], stage.gate_inv_scale[kBlocks ? j : 0][i]);
      const Pack<float, V> u = staged_merged<T, V>(stage.up[j][i], stage.up_inv_scale[kBlocks ? j : 0][i]);
      const Pack<T, V> dy = stage.dy[j][i];
      Pack<uint8_t, V> qg, qu, qa;
#pragma unroll
      for (int k = 0; k < V; k += 2) {
        // The geglu backward kernel's values, rounded to T where it stores them; two elements at a time.
        const GegluGrads2 e = geglu_grads2<T>(make_float2(g.v[k], g.v[k + 1]), make_float2(u.v[k], u.v[k + 1]),
                                              make_float2(to_float(dy.v[k]), to_float(dy.v[k + 1])));
        const float2 dg = round_to2<T>(e.d_gate), du = round_to2<T>(e.d_up), act = round_to2<T>(e.act);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(dg.x), fabsf(du.x)), fmaxf(fabsf(dg.y), fabsf(du.y))));
        qg.v[k] = cast_fp8<F>(__fmul_rn(dg.x, scale));
        qg.v[k + 1] = cast_fp8<F>(__fmul_rn(dg.y, scale));
        qu.v[k] = cast_fp8<F>(__fmul_rn(du.x, scale));
        qu.v[k + 1] = cast_fp8<F>(__fmul_rn(du.y, scale));
        qa.v[k] = cast_fp8<Fp8Format::kE4m3>(__fmul_rn(act.x, act_scale));
        qa.v[k + 1] = cast_fp8<Fp8Format::kE4m3>(__fmul_rn(act.y, act_scale));
      }
      if (out != nullptr) {
        *reinterpret_cast<Pack<uint8_t, V>*>(out + gr * p.out_ld + gc) = qg;
        *reinterpret_cast<Pack<uint8_t, V>*>(out + gr * p.out_ld + f + gc) = qu;
      }
      if (out_t != nullptr) {
        *reinterpret_cast<Pack<uint8_t, V>*>(&tile_g[r][tile_col(r, c)]) = qg;
        *reinterpret_cast<Pack<uint8_t, V>*>(&tile_u[r][tile_col(r, c)]) = qu;
      }
      if (act_t != nullptr) *reinterpret_cast<Pack<uint8_t, V>*>(&tile_a[r][tile_col(r, c)]) = qa;
    });
    if (transposes) {
      __syncthreads();
      // Three transposed tiles, one per 64 threads (a warp-uniform choice); the last 64 threads have none.
      const int which = static_cast<int>(threadIdx.x) / kTransposeThreads;
      const TilePart part = tile_part(static_cast<int>(threadIdx.x) % kTransposeThreads);
      const int64_t gr = at.row0 + part.r, col0 = at.col0;
      if (gr < p.rows && col0 + part.c < f) {
        if (which == 0 && out_t != nullptr) write_transposed(tile_g, part, out_t + col0 * p.out_t_ld, p.out_t_ld, gr);
        if (which == 1 && out_t != nullptr)
          write_transposed(tile_u, part, out_t + (f + col0) * p.out_t_ld, p.out_t_ld, gr);
        if (which == 2 && act_t != nullptr) write_transposed(tile_a, part, act_t + col0 * bp.act_t_ld, bp.act_t_ld, gr);
      }
    }
  });
  record_amax(m, p.amax_out);
}

// One stage of the GELU backward's staged inputs: dy and pre, one 16-byte vector each per slot.
template <typename T>
struct GeluBwdStage {
  static constexpr int V = kVec<T>;
  Pack<T, V> dy[kTileVectors<V>][kThreads], pre[kTileVectors<V>][kThreads];
};

// A tile's column sums in two steps around the tile's barrier. for_each_tile_vector gives a thread the same V
// columns in every row it covers, so `sums` holds its columns' sums over its rows; stage_column_sums adds them across
// the warp's lanes of those columns (shuffles) into warp_sums[warp]; after the barrier, write_column_sums has thread
// `column` (< kTile) add the warps' sums in warp order into partials[at.row0 / kTile][at.col0 + column]. Fixed
// order: deterministic.
using WarpColumnSums = float[kThreads / 32][kTile];
template <int V>
__device__ __forceinline__ void stage_column_sums(float (&sums)[V], WarpColumnSums& warp_sums) {
  constexpr int kVecPerRow = kTile / V;  // lanes l, l + kVecPerRow, ... of a warp hold the same columns
#pragma unroll
  for (int offset = kVecPerRow; offset < 32; offset <<= 1)
#pragma unroll
    for (int k = 0; k < V; ++k) sums[k] += __shfl_xor_sync(0xffffffffu, sums[k], offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane < kVecPerRow)
#pragma unroll
    for (int k = 0; k < V; ++k) warp_sums[warp][lane * V + k] = sums[k];
}
__device__ __forceinline__ void write_column_sums(const WarpColumnSums& warp_sums, int column, TileAt at, int64_t cols,
                                                  float* partials) {
  if (at.col0 + column >= cols) return;
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) sum += warp_sums[w][column];
  partials[(at.row0 / kTile) * cols + at.col0 + column] = sum;
}

// The GELU backward, cast: 64 x 64 tiles, a block walking several, pre and dy staged a tile ahead; the input gradient
// and the rebuilt GELU output take a shared-memory tile each for their transposed writes, and the input gradient's
// column sums become one row of bias partials per tile.
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads) fp8_gelu_bwd_kernel(const Fp8GeluBwdParams bp) {
  static_assert(kGeluBwdPartialRows == kTile, "a bias partial row is one tile's rows");
  const Fp8QuantParams& p = bp.grad_pre;
  constexpr int V = kVec<T>;
  using Stage = GeluBwdStage<T>;
  Stage* stages = reinterpret_cast<Stage*>(stage_smem);
  __shared__ float s_scale, s_act_scale;
  __shared__ __align__(16) Tile tile_g;
  __shared__ __align__(16) Tile tile_a;
  __shared__ WarpColumnSums warp_sums;
  const T* pre = static_cast<const T*>(p.x);
  const T* grad = static_cast<const T*>(bp.grad);
  const auto issue = [&](const TileWalk& w, Stage& stage) {
    if (w.valid()) {
      for_each_tile_vector<V>(w.at(), p.rows, p.cols, [&](int j, int, int, int64_t gr, int64_t gc) {
        async_copy_slot(stage.dy[j][threadIdx.x], grad + gr * p.cols + gc);
        async_copy_slot(stage.pre[j][threadIdx.x], pre + gr * p.cols + gc);
      });
    }
    async_commit();  // an empty group past the last tile keeps the wait's count uniform
  };
  const TileWalk walk = tile_walk(p.rows, p.cols);
  issue(walk, stages[0]);
  read_backward_scales<F>(p, bp.act_amax_in, bp.act_inv_scale_out, s_scale, s_act_scale);
  __syncthreads();
  const float scale = s_scale, act_scale = s_act_scale;
  uint8_t* out = static_cast<uint8_t*>(p.out);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t);
  uint8_t* act_t = static_cast<uint8_t*>(bp.act_t);
  float* partials = bp.bias_partials;
  const bool shares = out_t != nullptr || act_t != nullptr || partials != nullptr;  // through shared memory
  float m = 0.f;
  for_each_staged_tile(walk, stages, issue, [&](const TileAt& at, const Stage& stage, bool first) {
    if (shares && !first) __syncthreads();  // the previous tile's shared reads are done
    float sums[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sums[k] = 0.f;
    for_each_tile_vector<V>(at, p.rows, p.cols, [&](int j, int r, int c, int64_t gr, int64_t gc) {
      const Pack<T, V> x = stage.pre[j][threadIdx.x], dy = stage.dy[j][threadIdx.x];
      Pack<uint8_t, V> qg, qa;
#pragma unroll
      for (int k = 0; k < V; k += 2) {
        // The GELU backward kernel's values: d pre = dy * slope and the activation, each rounded to T.
        const GeluTanhPair e0 = gelu_tanh_pair(to_float(x.v[k])), e1 = gelu_tanh_pair(to_float(x.v[k + 1]));
        const float2 dx = round_to2<T>(make_float2(to_float(dy.v[k]) * e0.slope, to_float(dy.v[k + 1]) * e1.slope));
        const float2 act = round_to2<T>(make_float2(e0.value, e1.value));
        m = fmaxf(m, fmaxf(fabsf(dx.x), fabsf(dx.y)));
        sums[k] += dx.x;
        sums[k + 1] += dx.y;
        qg.v[k] = cast_fp8<F>(__fmul_rn(dx.x, scale));
        qg.v[k + 1] = cast_fp8<F>(__fmul_rn(dx.y, scale));
        qa.v[k] = cast_fp8<Fp8Format::kE4m3>(__fmul_rn(act.x, act_scale));
        qa.v[k + 1] = cast_fp8<Fp8Format::kE4m3>(__fmul_rn(act.y, act_scale));
      }
      if (out != nullptr) *reinterpret_cast<Pack<uint8_t, V>*>(out + gr * p.out_ld + gc) = qg;
      if (out_t != nullptr) *reinterpret_cast<Pack<uint8_t, V>*>(&tile_g[r][tile_col(r, c)]) = qg;
      if (act_t != nullptr) *reinterpret_cast<Pack<uint8_t, V>*>(&tile_a[r][tile_col(r, c)]) = qa;
    });
    if (partials != nullptr) stage_column_sums<V>(sums, warp_sums);
    if (shares) {
      __syncthreads();
      // Per 64 threads (a warp-uniform choice): the input gradient's transposed tile, the activation's, the column
      // sums; the last 64 threads have none.
      const int which = static_cast<int>(threadIdx.x) / kTransposeThreads;
      const int index = static_cast<int>(threadIdx.x) % kTransposeThreads;
      if (which == 2) {
        if (partials != nullptr) write_column_sums(warp_sums, index, at, p.cols, partials);
      } else if (which < 2) {
        const TilePart part = tile_part(index);
        const int64_t gr = at.row0 + part.r, col0 = at.col0;
        if (gr < p.rows && col0 + part.c < p.cols) {
          if (which == 0 && out_t != nullptr) write_transposed(tile_g, part, out_t + col0 * p.out_t_ld, p.out_t_ld, gr);
          if (which == 1 && act_t != nullptr)
            write_transposed(tile_a, part, act_t + col0 * bp.act_t_ld, bp.act_t_ld, gr);
        }
      }
    }
  });
  record_amax(m, p.amax_out);
}

// A tile loop's launch: one block per tile up to as many as stay resident at once (each block then walks tiles
// `gridDim.x` apart), so the scale read and the block's amax reduction and atomic happen once per resident block
// rather than once per 64 x 64 tile (91k tiles for one backbone GeGLU backward at batch 32).
// `Stage`: the kernel's staged-input stage (kStages of them in dynamic shared memory), or void.
template <auto kKernel, typename Stage, typename Params>
void launch_tiles(const Params& p, int64_t tiles, cudaStream_t stream) {
  constexpr int kStageBytes = [] {
    if constexpr (std::is_void_v<Stage>)
      return 0;
    else
      return kStages * static_cast<int>(sizeof(Stage));
  }();
  static const int per_sm = [] {  // per kernel instance: their register counts and stages differ
    VLATUNE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStageBytes));
    int blocks = 0;
    VLATUNE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kThreads, kStageBytes));
    return std::max(blocks, 1);
  }();
  const int64_t grid = std::min<int64_t>(tiles, static_cast<int64_t>(fused_detail::sm_count()) * per_sm);
  kKernel<<<static_cast<unsigned>(grid), kThreads, kStageBytes, stream>>>(p);
}

// What a cast launcher casts: x itself, gelu_tanh(x), or geglu(merged).
enum class CastValue { kPlain, kGelu, kGeglu };

template <typename T, CastValue kValue>
void launch_quant_typed(const Fp8QuantParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.rows, p.cols);
  const bool e4m3 = p.format == Fp8Format::kE4m3;
  if constexpr (kValue == CastValue::kGeglu) {
    using Stage = GegluCastStage<T>;
    if (p.blocks_out != nullptr) {
      if (e4m3) return launch_tiles<fp8_geglu_blocks_quant_kernel<T, Fp8Format::kE4m3>, Stage>(p, tiles, stream);
      return launch_tiles<fp8_geglu_blocks_quant_kernel<T, Fp8Format::kE5m2>, Stage>(p, tiles, stream);
    }
    if (e4m3) return launch_tiles<fp8_geglu_quant_kernel<T, Fp8Format::kE4m3>, Stage>(p, tiles, stream);
    return launch_tiles<fp8_geglu_quant_kernel<T, Fp8Format::kE5m2>, Stage>(p, tiles, stream);
  } else {
    constexpr bool kGelu = kValue == CastValue::kGelu;
    if (e4m3) return launch_tiles<fp8_quant_kernel<T, Fp8Format::kE4m3, kGelu>, void>(p, tiles, stream);
    launch_tiles<fp8_quant_kernel<T, Fp8Format::kE5m2, kGelu>, void>(p, tiles, stream);
  }
}

template <typename T>
void launch_geglu_bwd_typed(const Fp8GegluBwdParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.grad_merged.rows, p.grad_merged.cols);
  const bool e4m3 = p.grad_merged.format == Fp8Format::kE4m3;
  if (p.merged_blocks != nullptr) {
    using Stage = GegluBwdStage<T, true>;
    if (e4m3) return launch_tiles<fp8_geglu_bwd_kernel<T, Fp8Format::kE4m3, true>, Stage>(p, tiles, stream);
    return launch_tiles<fp8_geglu_bwd_kernel<T, Fp8Format::kE5m2, true>, Stage>(p, tiles, stream);
  }
  using Stage = GegluBwdStage<T, false>;
  if (e4m3) return launch_tiles<fp8_geglu_bwd_kernel<T, Fp8Format::kE4m3, false>, Stage>(p, tiles, stream);
  launch_tiles<fp8_geglu_bwd_kernel<T, Fp8Format::kE5m2, false>, Stage>(p, tiles, stream);
}

template <typename T>
void launch_gelu_bwd_typed(const Fp8GeluBwdParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.grad_pre.rows, p.grad_pre.cols);
  using Stage = GeluBwdStage<T>;
  if (p.grad_pre.format == Fp8Format::kE4m3)
    return launch_tiles<fp8_gelu_bwd_kernel<T, Fp8Format::kE4m3>, Stage>(p, tiles, stream);
  launch_tiles<fp8_gelu_bwd_kernel<T, Fp8Format::kE5m2>, Stage>(p, tiles, stream);
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// launch(T{}) with T the activations' element type (bf16 or fp32), inside op's NVTX range; then the launch's error.
template <typename Launch>
void launch_by_act_dtype(ActDtype dtype, const char* op, Launch launch) {
  NvtxRange range(op);
  if (dtype == ActDtype::kBf16) {
    launch(__nv_bfloat16{});
  } else {
    launch(float{});
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool fp8_quantize_supported(int64_t rows, int64_t cols) {
  return rows > 0 && cols > 0 && rows % 16 == 0 && cols % 16 == 0;
}

void launch_fp8_amax(const Fp8AmaxParams& p, CUstream_st* stream) {
  if (p.count == 0) return;
  if (p.amax_out == nullptr || p.x == nullptr) throw std::invalid_argument("vlatune::fp8_amax: null pointer");
  launch_by_act_dtype(p.dtype, "vlatune::fp8_amax", [&](auto element) {
    using T = decltype(element);
    constexpr int V = kVec<T>;
    const int64_t items = p.count % V == 0 && aligned16(p.x) ? p.count / V : p.count;  // as the kernel's loop
    const int64_t blocks =
        std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads,
                                               static_cast<int64_t>(fused_detail::sm_count()) * kAmaxBlocksPerSm));
    fp8_amax_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  });
}

namespace {

// The checks of launch_fp8_quantize; `what` names the launcher. With `need_amax_in` false (amax-only passes of the
// GeGLU casts) amax_in may be null; with `need_x` false (the GeGLU backward reading merged's e4m3 blocks), x.
void check_quant(const Fp8QuantParams& p, const char* op, bool need_amax_in, bool need_x = true) {
  if (!fp8_quantize_supported(p.rows, p.cols))
    throw std::invalid_argument(std::string(op) +
                                ": rows and cols must be positive multiples of 16 (at most 2^42 "
                                "elements), got " +
                                std::to_string(p.rows) + " x " + std::to_string(p.cols));
  if ((need_x && (p.x == nullptr || !aligned16(p.x))) || (need_amax_in && (p.amax_in == nullptr || p.amax_count < 1)))
    throw std::invalid_argument(std::string(op) + ": x (16-byte aligned) and amax_in are required");
  if ((p.out != nullptr && (!aligned16(p.out) || p.out_ld % 16 != 0 || p.out_ld < p.cols)) ||
      (p.out_t != nullptr && (!aligned16(p.out_t) || p.out_t_ld % 16 != 0 || p.out_t_ld < p.rows)))
    throw std::invalid_argument(std::string(op) + ": outputs must be 16-byte aligned with 16-byte row strides");
}

// The e4m3 blocks of merged [rows, 2 * f] (written or read): aligned, F a multiple of kGegluBlock.
void check_blocks(const void* data, const float* inv_scale, int64_t f, const char* op) {
  if (data == nullptr) return;
  if (inv_scale == nullptr || !aligned16(data) || f % kGegluBlock != 0)
    throw std::invalid_argument(std::string(op) +
                                ": e4m3 blocks need their scales, 16-byte alignment and F a multiple "
                                "of " +
                                std::to_string(kGegluBlock) + ", got F " + std::to_string(f));
}

// The GeGLU casts' tiles fit TileWalk's int arithmetic.
void check_walk(int64_t rows, int64_t cols, const char* op) {
  if (tile_count(rows, cols) > kMaxWalkTiles)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) + " x " + std::to_string(cols) +
                                " is more than 2^30 tiles of 64 x 64");
}

// The checks the backward casts share beyond check_quant: their input gradient, the rebuilt activation's transposed
// output, and something to write.
void check_backward_cast(const void* grad, const void* act_t, int64_t act_t_ld, const float* act_amax_in,
                         const Fp8QuantParams& g, bool writes, const char* op) {
  if (grad == nullptr || !aligned16(grad))
    throw std::invalid_argument(std::string(op) + ": grad (16-byte aligned) is required");
  if (act_t != nullptr && (act_amax_in == nullptr || !aligned16(act_t) || act_t_ld % 16 != 0 || act_t_ld < g.rows))
    throw std::invalid_argument(std::string(op) + ": act_t needs act_amax_in and a 16-byte aligned layout");
  if (!writes && g.amax_out == nullptr) throw std::invalid_argument(std::string(op) + ": nothing to write");
}

template <CastValue kValue>
void launch_quant(const Fp8QuantParams& p, CUstream_st* stream, const char* op) {
  constexpr bool kGeglu = kValue == CastValue::kGeglu;
  // The activation casts may run as an amax pass alone (current scaling: no outputs, no history).
  constexpr bool kAmaxPass = kValue != CastValue::kPlain;
  if (!kGeglu && p.blocks_out != nullptr) throw std::invalid_argument(std::string(op) + ": blocks are GeGLU's");
  if (kGeglu) check_walk(p.rows, p.cols, op);
  check_blocks(p.blocks_out, p.blocks_inv_scale_out, p.cols, op);
  const bool writes = p.out != nullptr || p.out_t != nullptr || p.blocks_out != nullptr;
  check_quant(p, op, !kAmaxPass || writes);
  if (kAmaxPass && !writes && p.amax_out == nullptr)
    throw std::invalid_argument(std::string(op) + ": nothing to write");
  launch_by_act_dtype(p.dtype, op, [&](auto element) { launch_quant_typed<decltype(element), kValue>(p, stream); });
}

}  // namespace

void launch_fp8_quantize(const Fp8QuantParams& p, CUstream_st* stream) {
  launch_quant<CastValue::kPlain>(p, stream, "vlatune::fp8_quantize");
}

void launch_fp8_gelu_quantize(const Fp8QuantParams& p, CUstream_st* stream) {
  launch_quant<CastValue::kGelu>(p, stream, "vlatune::fp8_gelu_quantize");
}

void launch_fp8_geglu_quantize(const Fp8QuantParams& p, CUstream_st* stream) {
  launch_quant<CastValue::kGeglu>(p, stream, "vlatune::fp8_geglu_quantize");
}

void launch_fp8_geglu_backward_quantize(const Fp8GegluBwdParams& p, CUstream_st* stream) {
  const char* op = "vlatune::fp8_geglu_backward_quantize";
  const Fp8QuantParams& g = p.grad_merged;
  check_walk(g.rows, g.cols, op);
  const bool writes = g.out != nullptr || g.out_t != nullptr || p.act_t != nullptr;
  check_quant(g, op, writes, p.merged_blocks == nullptr);
  check_blocks(p.merged_blocks, p.merged_blocks_inv_scale, g.cols, op);
  if (g.out != nullptr && g.out_ld < 2 * g.cols)
    throw std::invalid_argument(std::string(op) + ": out holds [rows, 2F]: out_ld must be >= 2F");
  check_backward_cast(p.grad, p.act_t, p.act_t_ld, p.act_amax_in, g, writes, op);
  launch_by_act_dtype(g.dtype, op, [&](auto element) { launch_geglu_bwd_typed<decltype(element)>(p, stream); });
}

void launch_fp8_gelu_backward_quantize(const Fp8GeluBwdParams& p, CUstream_st* stream) {
  const char* op = "vlatune::fp8_gelu_backward_quantize";
  const Fp8QuantParams& g = p.grad_pre;
  check_walk(g.rows, g.cols, op);
  const bool writes = g.out != nullptr || g.out_t != nullptr || p.act_t != nullptr || p.bias_partials != nullptr;
  check_quant(g, op, writes);
  check_backward_cast(p.grad, p.act_t, p.act_t_ld, p.act_amax_in, g, writes, op);
  launch_by_act_dtype(g.dtype, op, [&](auto element) { launch_gelu_bwd_typed<decltype(element)>(p, stream); });
}

}  // namespace vlatune::kernels
