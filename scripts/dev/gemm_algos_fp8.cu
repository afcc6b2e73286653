// cuBLASLt algorithm search on Pi0.5's FP8 GEMMs (the Linears the shipped FP8 recipe runs in FP8): the heuristic's
// first choice (what at::_scaled_mm runs) vs the fastest of its top candidates, cold L2, bf16 output, tensorwise
// scales. FP8 on Hopper is "TN" only: C[m x n] = A^T B with A [k x m] and B [k x n] column-major, k contiguous.
// A Linear y = x W^T maps to: forward m = out, n = rows, k = in (A = W e4m3, B = x e4m3, fast accumulation);
// grad input m = in, n = rows, k = out (A = W^T e4m3, B = dy e5m2); grad weight m = in, n = out, k = rows
// (A = x^T e4m3, B = dy^T e5m2).
//   nvcc -O2 -arch=sm_90a scripts/dev/gemm_algos_fp8.cu -lcublasLt -o /tmp/gemm_algos_fp8 && /tmp/gemm_algos_fp8
//   [ROWS...]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                    \
  do {                                                           \
    auto e = (x);                                                \
    if (e != 0) {                                                \
      printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); \
      exit(1);                                                   \
    }                                                            \
  } while (0)

struct Linear {
  const char* name;
  int out, in;
  bool vision;  // SigLIP's rows (batch 32 x 2 images x 256 patches), not the backbone's
};
enum class Pass { kForward, kGradInput, kGradWeight };

// Small finite FP8 bytes (no NaN or inf in either format): sign, exponent bits kept low, any mantissa.
__global__ void fill(unsigned char* p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = (unsigned char)((h & 0x80u) | (0x20u + (h >> 8) % 0x18u));
  }
}

int main(int argc, char** argv) {
  std::vector<int> rows_list;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long rows = strtol(argv[i], &end, 10);
    // FP8 GEMMs need every dimension a multiple of 16 (the trainer pads its rows to that).
    if (end == argv[i] || *end != '\0' || rows <= 0 || rows % 16 != 0 || rows > (1L << 24)) {
      fprintf(stderr, "rows '%s': expected a positive multiple of 16 (at most 2^24)\n", argv[i]);
      return 2;
    }
    rows_list.push_back(static_cast<int>(rows));
  }
  if (rows_list.empty()) rows_list = {18432, 22784};  // prompts trimmed to 64 and untrimmed, batch 32
  const std::vector<Linear> linears = {
      {"gate_up", 32768, 2048, false}, {"down", 2048, 16384, false},  {"qkv", 2560, 2048, false},
      {"o", 2048, 2048, false},        {"vit qkv", 3456, 1152, true}, {"vit fc1", 4304, 1152, true},
      {"vit fc2", 1152, 4304, true},
  };
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t ws_bytes = 32 << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  float* scale;
  CK(cudaMalloc(&scale, sizeof(float)));
  const float one_host = 1.f;
  CK(cudaMemcpy(scale, &one_host, sizeof(float), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const size_t flush_n = 256 << 20;
  char* flush;
  CK(cudaMalloc(&flush, flush_n));
  double total_first = 0, total_best = 0;
  printf(
      "| GEMM | m | n | k | heuristic #0 ms (TFLOP/s) | best of N: #i ms (TFLOP/s) | gain "
      "|\n|---|---|---|---|---|---|---|\n");
  for (int backbone_rows : rows_list) {
    for (const Linear& l : linears) {
      const int rows = l.vision ? 16384 : backbone_rows;
      if (l.vision && backbone_rows != rows_list.front()) continue;  // the vision rows do not change with prompts
      for (Pass pass : {Pass::kForward, Pass::kGradInput, Pass::kGradWeight}) {
        int m, n, k;
        cudaDataType_t tb = CUDA_R_8F_E5M2;
        const char* what;
        if (pass == Pass::kForward) {
          m = l.out, n = rows, k = l.in, tb = CUDA_R_8F_E4M3, what = "fwd";
        } else if (pass == Pass::kGradInput) {
          m = l.in, n = rows, k = l.out, what = "dgrad";
        } else {
          m = l.in, n = l.out, k = rows, what = "wgrad";
        }
        const size_t na = (size_t)k * m, nb = (size_t)k * n, nc = (size_t)m * n;
        unsigned char *A, *B;
        void* C;
        CK(cudaMalloc(&A, na));
        CK(cudaMalloc(&B, nb));
        CK(cudaMalloc(&C, nc * 2));
        fill<<<(na + 255) / 256, 256>>>(A, na, 1);
        fill<<<(nb + 255) / 256, 256>>>(B, nb, 2);
        cublasLtMatmulDesc_t desc;
        CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof(scale)));
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof(scale)));
        const int8_t fast = pass == Pass::kForward ? 1 : 0;
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        cublasLtMatrixLayout_t la, lb, lc;
        CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k));
        CK(cublasLtMatrixLayoutCreate(&lb, tb, k, n, k));
        CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m));
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)));
        const int want = 24;
        cublasLtMatmulHeuristicResult_t res[want];
        int got = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, want, res, &got));
        const float one = 1.f, zero = 0.f;
        auto time_it = [&](int i) {
          std::vector<float> ts;
          for (int r = 0; r < 10; ++r) {
            cudaMemsetAsync(flush, r, flush_n);  // cold L2, as in the step
            cudaEventRecord(e0);
            if (cublasLtMatmul(lt, desc, &one, A, la, B, lb, &zero, C, lc, C, lc, &res[i].algo, ws, ws_bytes, 0) != 0)
              return 1e9f;
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r >= 2) ts.push_back(ms);
          }
          std::sort(ts.begin(), ts.end());
          return ts[ts.size() / 2];
        };
        const double flop = 2.0 * m * n * k;
        float best = 1e9f, first = 0;
        int best_i = -1;
        for (int i = 0; i < got; ++i) {
          const float t = time_it(i);
          if (i == 0) first = t;
          if (t < best) best = t, best_i = i;
        }
        total_first += first;
        total_best += best;
        printf("| %s %s (rows %d) | %d | %d | %d | %.3f (%.0f) | of %d: #%d %.3f (%.0f) | %.1f%% |\n", l.name, what,
               rows, m, n, k, first, flop / first / 1e9, got, best_i, best, flop / best / 1e9,
               100.0 * (first - best) / first);
        fflush(stdout);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
        cudaFree(A);
        cudaFree(B);
        cudaFree(C);
      }
    }
  }
  printf("sum of one GEMM per row: heuristic #0 %.3f ms, best %.3f ms (%.1f%%)\n", total_first, total_best,
         100.0 * (total_first - total_best) / total_first);
  return 0;
}
