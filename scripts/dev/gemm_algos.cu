// cuBLASLt algorithm search on Pi0.5's biggest bf16 GEMMs: the heuristic's first choice vs the fastest of its top
// candidates, and cublasGemmEx. Column-major problem C[m x n] = op(A) op(B), fp32 accumulation.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>
#define CK(x)                                                    \
  do {                                                           \
    auto e = (x);                                                \
    if (e != 0) {                                                \
      printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); \
      exit(1);                                                   \
    }                                                            \
  } while (0)
struct Case {
  const char* name;
  char ta, tb;
  int m, n, k;
};
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    p[i] = __float2bfloat16(((h >> 8) & 0xffff) / 65536.0f - 0.5f);
  }
}
int main() {
  // torch Linear Y[M,N] = X[M,K] W[N,K]^T: fwd TN (m=N,n=M,k=K); dgrad NN (m=K,n=M,k=N); wgrad NT (m=K,n=N,k=M)
  const int M = 22784;
  std::vector<Case> cases = {
      {"down fwd", 'T', 'N', 2048, M, 16384},      {"down dgrad", 'N', 'N', 16384, M, 2048},
      {"down wgrad", 'N', 'T', 16384, 2048, M},    {"gate_up fwd", 'T', 'N', 32768, M, 2048},
      {"gate_up dgrad", 'N', 'N', 2048, M, 32768}, {"gate_up wgrad", 'N', 'T', 2048, 32768, M},
      {"o fwd", 'T', 'N', 2048, M, 2048},          {"qkv fwd", 'T', 'N', 2560, M, 2048},
      {"fc1 fwd", 'T', 'N', 4304, 16384, 1152},    {"fc2 fwd", 'T', 'N', 1152, 16384, 4304},
      {"fc1 wgrad", 'N', 'T', 1152, 4304, 16384},  {"fc2 dgrad", 'N', 'N', 4304, 16384, 1152},
  };
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  cublasHandle_t cb;
  CK(cublasCreate(&cb));
  size_t ws_bytes = 64 << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cublasSetWorkspace(cb, ws, ws_bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // an L2 flush buffer
  size_t flush_n = 256 << 20;
  char* flush;
  CK(cudaMalloc(&flush, flush_n));
  for (const Case& c : cases) {
    size_t na = (size_t)c.m * c.k, nb = (size_t)c.k * c.n, nc = (size_t)c.m * c.n;
    __nv_bfloat16 *A, *B, *C;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&B, nb * 2));
    CK(cudaMalloc(&C, nc * 2));
    fill<<<(na + 255) / 256, 256>>>(A, na, 1);
    fill<<<(nb + 255) / 256, 256>>>(B, nb, 2);
    cublasOperation_t opa = c.ta == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = c.ta == 'T' ? c.k : c.m, ldb = c.tb == 'T' ? c.n : c.k, ldc = c.m;
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.ta == 'T' ? c.k : c.m, c.ta == 'T' ? c.m : c.k, lda));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c.tb == 'T' ? c.n : c.k, c.tb == 'T' ? c.k : c.n, ldb));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, c.m, c.n, ldc));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof(ws_bytes)));
    const int want = 32;
    cublasLtMatmulHeuristicResult_t res[want];
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, want, res, &got));
    float one = 1.f, zero = 0.f;
    auto time_it = [&](auto&& launch) {
      std::vector<float> ts;
      for (int r = 0; r < 12; ++r) {
        cudaMemsetAsync(flush, r, flush_n);  // cold L2, as in the model
        cudaEventRecord(e0);
        launch();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) ts.push_back(ms);
      }
      std::sort(ts.begin(), ts.end());
      return ts[ts.size() / 2];
    };
    double flop = 2.0 * c.m * c.n * c.k;
    float t_ex = time_it([&] {
      cublasGemmEx(cb, opa, opb, c.m, c.n, c.k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &zero, C, CUDA_R_16BF,
                   ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    float best = 1e9, first = 0;
    int best_i = -1;
    for (int i = 0; i < got; ++i) {
      float t = time_it(
          [&] { cublasLtMatmul(lt, desc, &one, A, la, B, lb, &zero, C, lc, C, lc, &res[i].algo, ws, ws_bytes, 0); });
      if (i == 0) first = t;
      if (t < best) {
        best = t;
        best_i = i;
      }
    }
    printf(
        "%-14s m %5d n %5d k %5d  GemmEx %.3f ms (%3.0f TF/s)  Lt#0 %.3f (%3.0f)  best of %2d: #%d %.3f ms (%3.0f "
        "TF/s)  gain vs GemmEx %.1f%%\n",
        c.name, c.m, c.n, c.k, t_ex, flop / t_ex / 1e9, first, flop / first / 1e9, got, best_i, best, flop / best / 1e9,
        100.0 * (t_ex - best) / t_ex);
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
  return 0;
}
