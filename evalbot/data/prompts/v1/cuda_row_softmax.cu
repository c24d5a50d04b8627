// row_softmax.cu - numerically stable softmax over the last dimension of a
// [rows, cols] float matrix, one thread block per row.
//
// Each block makes two passes over its row: first a max-reduction, then a
// sum of exp(x - max). Subtracting the max keeps exp() from overflowing for
// large logits. Warp shuffles do most of the reduction; shared memory only
// carries one partial per warp.
//
// Build: nvcc -O3 -arch=sm_80 row_softmax.cu -o row_softmax

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CUDA_CHECK(call)                                                        \
    do {                                                                        \
        cudaError_t err__ = (call);                                             \
        if (err__ != cudaSuccess) {                                             \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,             \
                         cudaGetErrorString(err__));                            \
            std::exit(1);                                                       \
        }                                                                       \
    } while (0)

constexpr int kWarp = 32;

__inline__ __device__ float warp_max(float v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

__inline__ __device__ float warp_sum(float v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// Reduce one value per thread to a single value visible to every thread of the block.
template <bool IsMax>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x % kWarp;
    const int warp = threadIdx.x / kWarp;
    const int n_warps = (blockDim.x + kWarp - 1) / kWarp;

    v = IsMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();

    const float identity = IsMax ? -FLT_MAX : 0.0f;
    v = (threadIdx.x < n_warps) ? scratch[lane] : identity;
    if (warp == 0) v = IsMax ? warp_max(v) : warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return v;
}

// x, y: [rows, cols], row-major. grid = rows, block = up to 1024 threads.
__global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float scratch[kWarp];
    const float* in = x + static_cast<size_t>(blockIdx.x) * cols;
    float* out = y + static_cast<size_t>(blockIdx.x) * cols;

    float m = -FLT_MAX;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, in[c]);
    m = block_reduce<true>(m, scratch);

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(in[c] - m);
    s = block_reduce<false>(s, scratch);

    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __expf(in[c] - m) * inv;
}

static void softmax_reference(const std::vector<float>& x, std::vector<float>& y, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        const float* in = &x[static_cast<size_t>(r) * cols];
        float* out = &y[static_cast<size_t>(r) * cols];
        float m = -FLT_MAX;
        for (int c = 0; c < cols; ++c) m = std::fmax(m, in[c]);
        double s = 0.0;
        for (int c = 0; c < cols; ++c) s += std::exp(static_cast<double>(in[c] - m));
        for (int c = 0; c < cols; ++c) out[c] = static_cast<float>(std::exp(in[c] - m) / s);
    }
}

int main() {
    const int rows = 4096, cols = 1000;
    const size_t n = static_cast<size_t>(rows) * cols;
    std::vector<float> hx(n), hy(n), ref(n);
    srand(1234);
    for (auto& v : hx) v = 20.0f * (static_cast<float>(rand()) / RAND_MAX - 0.5f);

    float *dx = nullptr, *dy = nullptr;
    CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    row_softmax<<<rows, 256>>>(dx, dy, cols);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(hy.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));

    softmax_reference(hx, ref, rows, cols);
    float worst = 0.0f;
    for (size_t i = 0; i < n; ++i) worst = std::fmax(worst, std::fabs(hy[i] - ref[i]));
    std::printf("max abs error vs reference: %.3e\n", worst);

    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dy));
    return worst < 1e-5f ? 0 : 1;
}
