// Split-KV decode attention whose splits merge inside a thread-block cluster (Hopper, sm_90a).
//
// K clusters of C CTAs serve one (sequence, KV head): S = K * C splits. CTA `rank` of cluster `kc` is
// split j = kc * C + rank; it takes the KV tiles j, j + S, j + 2S, ... of the sequence's valid positions
// (interleaved, as the Triton kernel does, so the splits end close together), and serves every query head of the GQA group
// against each tile, so K and V are read once per group. Tiles arrive through the tensor-memory
// accelerator (TMA: `cp.async.bulk.tensor`, 128-byte swizzle) into a ring of STAGES shared-memory
// buffers, fed by one producer warp and consumed by four warps of 16 positions each on the tensor
// cores (mma.m16n8k16, bf16 or fp16 in, fp32 accumulate; the query group is padded to 16 rows).
// Each CTA folds its four warps' softmax states into one (max, sum, unnormalised output) in its own
// shared memory; after a cluster barrier CTA `rank` merges column slice `rank` of the head dim over
// all C CTAs, reading their states through distributed shared memory (`cluster.map_shared_rank`).
// With K = 1 that is the output: no second kernel, no round trip through global memory for the
// partials. With K > 1 (a cluster must sit in one GPC, so few large clusters fit at once: on an H200
// only 7 of 10-16 CTAs, but 64 of 2), each cluster's merged state (unnormalised output columns, max and
// sum per row) goes to a small global workspace (with C = 1, straight from the CTA, no cluster step);
// the last of the K CTAs of one rank to arrive (an atomic counter per (sequence, KV head, rank), reset
// by that CTA for the next launch) folds the K states of its columns from L2, loading 16 clusters'
// states at once, and writes the output. Still one launch.
//
// Lengths are read on the device and the grid depends only on host ints, so a launch can be
// captured in a CUDA graph. With programmatic dependent launch the kernel may start before its
// predecessor ends: it waits (griddepcontrol.wait) before reading q, the lengths or the cache.

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace cg = cooperative_groups;

namespace fdc {

constexpr int BLOCK_N = 64;                      // positions per K/V tile
constexpr int WARP_ROWS = 16;                    // positions per consumer warp per tile (an mma k-step)
constexpr int GROUP_WARPS = BLOCK_N / WARP_ROWS;  // consumer warps that share one tile
constexpr int G_PAD = 16;                      // mma rows: the query group padded to 16
constexpr int CHUNK = 64;                      // elements of one 128-byte swizzled row
constexpr int MAX_CLUSTER = 16;                // Hopper's non-portable cluster limit
constexpr int RED_PAD = 8;                     // floats of padding per row of the warps' partials (no bank conflicts)
constexpr int MAX_CLUSTERS = 128;              // K: clusters a (sequence, KV head)

struct Params {
  const uint16_t* q;  // [B, Hq, D] (raw 16-bit elements)
  uint16_t* out;      // [B, Hq, D]
  const int* lengths;  // [B]
  long long stride_qb, stride_qh, stride_ob, stride_oh;  // elements
  int num_kv_heads, group, s_max;
  int num_splits;    // C: CTAs a cluster
  int num_clusters;  // K: clusters a (sequence, KV head)
  float* ws_acc;     // K > 1: [B * Hkv * K][G_PAD][D] each cluster's unnormalised output
  float* ws_ml;      // K > 1: [B * Hkv * K][MAX_CLUSTER][G_PAD][2] each CTA's (max, sum) per row
  int* counters;     // K > 1: [B * Hkv][MAX_CLUSTER] arrivals, zero between launches
  unsigned long long* stamps;  // diagnostics or null: per CTA [8 globaltimer ns][8 clock64] at its phases
  float qk_scale;  // softmax scale * log2(e): scores are base-2 logits
  int probe;       // diagnostics only: 1 = stream the tiles and skip the attention (the output is wrong)
  int layout;      // 0: a tile is [D/64][64 positions][128 B] (D/64 boxes); 1: [64 positions][D/64][128 B] (one box)
  int order;       // 0: CTA r takes tiles r, r + C, ... (interleaved); 1: a contiguous run of tiles
};

// GROUPS groups of GROUP_WARPS consumer warps: group g takes the CTA's tiles g, g + GROUPS, ..., so
// GROUPS tiles are in compute at once; plus one producer warp.
template <int D, int GROUPS>
struct Layout {
  static constexpr int CONSUMERS = GROUPS * GROUP_WARPS;
  static constexpr int THREADS = (CONSUMERS + 1) * 32;
  static constexpr int CHUNKS = D / CHUNK;
  static constexpr int TILE_BYTES = CHUNKS * BLOCK_N * 128;  // one of K or V
  static constexpr int STAGE_BYTES = 2 * TILE_BYTES;
  static constexpr int RED_BYTES = CONSUMERS * G_PAD * ((D + RED_PAD) * 4 + 8);
  static constexpr int PART_BYTES = G_PAD * D * 4 + 2 * G_PAD * 4;
};

template <int D, int STAGES, int GROUPS>
constexpr int smem_bytes() {
  // 1024 bytes of slack: the 128-byte swizzle needs 1024-aligned tiles
  using L = Layout<D, GROUPS>;
  return 1024 + STAGES * L::STAGE_BYTES + L::PART_BYTES + 2 * STAGES * 8;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// One box of a 5-D tensor map (coordinates innermost first: element, 64-element chunk, position, head,
// sequence): a whole tile in one copy.
__device__ __forceinline__ void tma_load5(void* dst, const CUtensorMap* map, uint64_t* bar, int n0, int h, int b) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %3, %4, %5, %6}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(0), "r"(n0), "r"(h), "r"(b)
      : "memory");
}

// One box of a 4-D tensor map (coordinates innermost first: element, position, head, sequence).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                         int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                              uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static __forceinline__ uint16_t store(float x) {
    __nv_bfloat16 v = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t*>(&v);
  }
};

template <>
struct Elem<__half> {
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static __forceinline__ uint16_t store(float x) {
    __half v = __float2half_rn(x);
    return *reinterpret_cast<uint16_t*>(&v);
  }
};

// Byte offset of 16-byte unit `u` (of D / 8) of tile position `r` in a K or V tile of 128-byte lines, the
// 16-byte units of a line XOR-ed with the line's low three bits (TMA's 128-byte swizzle). Layout 0 puts
// chunk u / 8 of every position together ([D/64][64][128 B]); layout 1 keeps a position's chunks together.
template <int CHUNKS>
__device__ __forceinline__ uint32_t swizzled(int layout, int r, int u) {
  const int line = layout ? r * CHUNKS + (u >> 3) : (u >> 3) * BLOCK_N + r;
  return line * 128 + (((u & 7) ^ (line & 7)) << 4);
}

template <typename T, int D, int STAGES, int GROUPS>
__global__ void __launch_bounds__(Layout<D, GROUPS>::THREADS, 1)
    decode_kernel(const __grid_constant__ CUtensorMap kmap,  // K cache [B, Hkv, S_max, D], box [64, 64, 1, 1]
                  const __grid_constant__ CUtensorMap vmap,  // V cache, same
                  const Params p) {
  using L = Layout<D, GROUPS>;
  constexpr int CONSUMERS = L::CONSUMERS;
  constexpr int THREADS = L::THREADS;
  static_assert(L::RED_BYTES <= STAGES * L::STAGE_BYTES, "the warps' partials reuse the stage buffers");
  __shared__ int last_arrival;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* stages = smem;                                              // [STAGES][K tile, V tile]
  float* part_acc = reinterpret_cast<float*>(smem + STAGES * L::STAGE_BYTES);  // [G_PAD][D] this CTA's state
  float* part_m = part_acc + G_PAD * D;                                // [G_PAD] base-2 max
  float* part_l = part_m + G_PAD;                                      // [G_PAD]
  uint64_t* full = reinterpret_cast<uint64_t*>(part_l + G_PAD);        // [STAGES] tile landed
  uint64_t* empty = full + STAGES;                                     // [STAGES] tile consumed

  const int C = p.num_splits;
  const int S = C * p.num_clusters;  // splits of one (sequence, KV head)
  const int split = blockIdx.x;      // j = kc * C + rank (a cluster spans C consecutive blockIdx.x)
  const int rank = split % C;
  const int bh = blockIdx.y;
  const int b = bh / p.num_kv_heads;
  const int h = bh % p.num_kv_heads;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int G = p.group;
  // the phases of this CTA (thread 0, a consumer): 0 entry, 1 length read, 2 first tile landed, 3 own
  // tiles done, 4 every warp's state written, 5 CTA state merged (and cluster synced), 6 cluster merged,
  // 7 exit
  auto stamp = [&](int i) {
    if (p.stamps && threadIdx.x == 0) {
      unsigned long long* st = p.stamps + ((long long)blockIdx.y * gridDim.x + blockIdx.x) * 16;
      st[i] = globaltimer();
      st[8 + i] = clock64();
    }
  };
  stamp(0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], GROUP_WARPS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // launched early (PDL): q, the lengths and the cache are the previous kernels' writes
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  __syncthreads();

  const int length = min(p.lengths[b], p.s_max);  // a bad length must not read past the cache
  stamp(1);
  const int n_tiles = (length + BLOCK_N - 1) / BLOCK_N;
  const int run = (n_tiles + S - 1) / S;  // tiles of a contiguous split
  const int my_tiles = p.order ? max(0, min(run, n_tiles - split * run))
                               : (split < n_tiles ? (n_tiles - 1 - split) / S + 1 : 0);
  // first position of this CTA's i-th tile
  auto tile_start = [&](int i) { return (p.order ? split * run + i : split + i * S) * BLOCK_N; };

  float* red = reinterpret_cast<float*>(stages);           // [CONSUMERS][G_PAD][D + RED_PAD], after the loop
  float* red_m = red + CONSUMERS * G_PAD * (D + RED_PAD);  // [CONSUMERS][G_PAD]
  float* red_l = red_m + CONSUMERS * G_PAD;                // [CONSUMERS][G_PAD]

  if (warp == CONSUMERS) {
    // producer: one lane keeps STAGES tiles in flight
    if (lane == 0) {
      for (int i = 0; i < my_tiles; ++i) {
        const int s = i % STAGES;
        if (i >= STAGES) mbar_wait(&empty[s], ((i / STAGES) - 1) & 1);
        mbar_expect_tx(&full[s], L::STAGE_BYTES);  // out-of-range rows are zero-filled and still counted
        const int n0 = tile_start(i);
        uint8_t* kst = stages + s * L::STAGE_BYTES;
        uint8_t* vst = kst + L::TILE_BYTES;
        if (p.layout) {
          tma_load5(kst, &kmap, &full[s], n0, h, b);
          tma_load5(vst, &vmap, &full[s], n0, h, b);
        } else {
#pragma unroll
          for (int c = 0; c < L::CHUNKS; ++c)
            tma_load(kst + c * BLOCK_N * 128, &kmap, &full[s], c * CHUNK, n0, h, b);
#pragma unroll
          for (int c = 0; c < L::CHUNKS; ++c)
            tma_load(vst + c * BLOCK_N * 128, &vmap, &full[s], c * CHUNK, n0, h, b);
        }
      }
    }
  } else {
    // consumers: warp `warp` takes tile rows [p0, p0 + 16) of every tile
    using E = Elem<T>;
    const int g = lane >> 2;    // mma row (query head within the group) and its +8 twin
    const int tig = lane & 3;  // thread in the quad
    const int p0 = (warp % GROUP_WARPS) * WARP_ROWS;
    const int first = warp / GROUP_WARPS;  // this warp's group takes tiles first, first + GROUPS, ...

    uint32_t qa[D / 16][4];  // q as mma A fragments, one per 16-wide k-step of the head dim
    {
      const uint16_t* qrow = p.q + b * p.stride_qb + (long long)(h * G) * p.stride_qh;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = g + (r & 1) * 8;
          const int col = kk * 16 + (r >> 1) * 8 + tig * 2;
          uint32_t v = 0;
          if (row < G) {
            const uint16_t* e = qrow + row * p.stride_qh + col;
            v = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
          }
          qa[kk][r] = v;
        }
      }
    }

    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, base-2
    float l_run[2] = {0.f, 0.f};              // this lane's share of the row sums

    for (int i = first; i < my_tiles; i += GROUPS) {
      const int s = i % STAGES;
      mbar_wait(&full[s], (i / STAGES) & 1);
      if (i == first) stamp(2);
      const int n0 = tile_start(i);
      const int valid = p.probe ? 0 : length - n0 - p0;  // valid rows among this warp's 16 (warp-uniform)
      uint8_t* kst = stages + s * L::STAGE_BYTES;
      uint8_t* vst = kst + L::TILE_BYTES;
      if (valid > 0) {
        if (valid < WARP_ROWS) {
          // positions past the length hold whatever the cache holds (NaN, say); p is 0 there, but
          // 0 * NaN is NaN, so zero those V rows (only this warp reads them)
          const int units = (WARP_ROWS - valid) * (D / 8);
          for (int e = lane; e < units; e += 32) {
            const int r = p0 + valid + e / (D / 8);
            *reinterpret_cast<uint4*>(vst + swizzled<L::CHUNKS>(p.layout, r, e % (D / 8))) = make_uint4(0, 0, 0, 0);
          }
          // the next TMA write to this stage must come after these generic-proxy writes
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          __syncwarp();
        }
        const uint32_t kbase = smem_u32(kst);
        const uint32_t vbase = smem_u32(vst);
        const int mat = lane >> 3;  // which 8x8 matrix of an x4 ldmatrix this lane addresses

        // scores S = q K^T: two 8-position n-tiles
        float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const int r = p0 + (mat >> 1) * 8 + (lane & 7);
          uint32_t b0, b1, b2, b3;
          ldsm_x4(kbase + swizzled<L::CHUNKS>(p.layout, r, kk * 2 + (mat & 1)), b0, b1, b2, b3);
          E::mma(sc[0], qa[kk], b0, b1);
          E::mma(sc[1], qa[kk], b2, b3);
        }
        // scale, mask past the length, online softmax per row (the quad holds a row's 16 scores)
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int pos = nt * 8 + tig * 2 + (e & 1);  // 0..15 within the warp's rows
            const float v = pos < valid ? sc[nt][e] * p.qk_scale : -INFINITY;
            sc[nt][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
        }
        float base[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
          const float m_new = fmaxf(m_run[r], mx[r]);
          base[r] = m_new == -INFINITY ? 0.f : m_new;  // no -inf - -inf
          alpha[r] = exp2f(m_run[r] - base[r]);
          m_run[r] = m_new;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sc[nt][e] = exp2f(sc[nt][e] - base[e >> 1]);
            rs[e >> 1] += sc[nt][e];
          }
        }
        l_run[0] = l_run[0] * alpha[0] + rs[0];
        l_run[1] = l_run[1] * alpha[1] + rs[1];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][0] *= alpha[0];
          acc[n][1] *= alpha[0];
          acc[n][2] *= alpha[1];
          acc[n][3] *= alpha[1];
        }
        // P as an A fragment: the two score n-tiles' accumulators are exactly its layout
        const uint32_t pa[4] = {E::pack(sc[0][0], sc[0][1]), E::pack(sc[0][2], sc[0][3]),
                                E::pack(sc[1][0], sc[1][1]), E::pack(sc[1][2], sc[1][3])};
        // O += P V: V read transposed, two 8-wide head-dim n-tiles per ldmatrix
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          const int r = p0 + (mat & 1) * 8 + (lane & 7);
          uint32_t b0, b1, b2, b3;
          ldsm_x4_trans(vbase + swizzled<L::CHUNKS>(p.layout, r, n + (mat >> 1)), b0, b1, b2, b3);
          E::mma(acc[n], pa, b0, b1);
          E::mma(acc[n + 1], pa, b2, b3);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffff, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffff, l_run[r], 2);
    }
    stamp(3);
    // every consumer is done with every tile (the producer's copies all landed before they were
    // consumed): the stage buffers now take the warps' partials
    asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS * 32) : "memory");
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = g + half * 8;
      if (row < G) {
        float* dst = red + (warp * G_PAD + row) * (D + RED_PAD);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
          *reinterpret_cast<float2*>(dst + n * 8 + tig * 2) = make_float2(acc[n][half * 2], acc[n][half * 2 + 1]);
        if (tig == 0) {
          red_m[warp * G_PAD + row] = m_run[half];
          red_l[warp * G_PAD + row] = l_run[half];
        }
      }
    }
  }
  __syncthreads();
  stamp(4);

  // this CTA's state: the four warps' states merged. With one CTA a cluster and several clusters a head
  // it goes straight to the workspace; with several CTAs a cluster, to shared memory for the cluster.
  const int K = p.num_clusters;
  const bool straight = C == 1 && K > 1;
  const long long slot = (long long)bh * K + split / C;  // this cluster's workspace slot (K > 1)
  float* ws_acc = p.ws_acc + slot * G_PAD * D;
  float* ws_ml = p.ws_ml + (slot * MAX_CLUSTER + rank) * G_PAD * 2;
  for (int e = threadIdx.x; e < G * D; e += THREADS) {
    const int row = e / D;
    const int col = e % D;
    float mw[CONSUMERS];
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < CONSUMERS; ++w) {
      mw[w] = red_m[w * G_PAD + row];
      mmax = fmaxf(mmax, mw[w]);
    }
    const float base = mmax == -INFINITY ? 0.f : mmax;
    float a = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < CONSUMERS; ++w) {
      const float f = exp2f(mw[w] - base);
      a += f * red[(w * G_PAD + row) * (D + RED_PAD) + col];
      l += f * red_l[w * G_PAD + row];
    }
    if (S == 1) {
      p.out[b * p.stride_ob + (long long)(h * G + row) * p.stride_oh + col] = Elem<T>::store(a / l);
    } else if (straight) {
      ws_acc[row * D + col] = a;
      if (col == 0) *reinterpret_cast<float2*>(ws_ml + row * 2) = make_float2(mmax, l);
    } else {
      part_acc[row * D + col] = a;
      if (col == 0) {
        part_m[row] = mmax;
        part_l[row] = l;
      }
    }
  }
  if (S == 1) {
    stamp(7);
    return;
  }

  int cols = D;  // the head-dim columns this CTA finishes: rank, rank + C, rank + 2C, ...
  if (!straight) {
    // the cluster's merge through distributed shared memory (any C <= 16)
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's state is written (release/acquire at cluster scope)
    stamp(5);
    cols = (D - rank + C - 1) / C;
    for (int e = threadIdx.x; e < G * cols; e += THREADS) {
      const int row = e / cols;
      const int col = rank + (e % cols) * C;
      // the loads stay under `c < C`: unconditional loads of all 16 ranks (each masked) measured slower on
      // the H200 (the merge 2.7 -> 4.2 us for C = 9; docs/results/cluster_timeline_h200_2026-12-04e.json)
      float mc[MAX_CLUSTER];
      float mmax = -INFINITY;
#pragma unroll
      for (int c = 0; c < MAX_CLUSTER; ++c) {
        mc[c] = c < C ? cluster.map_shared_rank(part_m, c)[row] : -INFINITY;
        mmax = fmaxf(mmax, mc[c]);
      }
      // an empty split (-inf) weighs 0; with K = 1 some split is not empty, with K > 1 a whole cluster may be
      const float base = mmax == -INFINITY ? 0.f : mmax;
      float a = 0.f, l = 0.f;
#pragma unroll
      for (int c = 0; c < MAX_CLUSTER; ++c) {
        if (c < C) {
          const float f = exp2f(mc[c] - base);
          a += f * cluster.map_shared_rank(part_acc, c)[row * D + col];
          l += f * cluster.map_shared_rank(part_l, c)[row];
        }
      }
      if (K == 1) {
        p.out[b * p.stride_ob + (long long)(h * G + row) * p.stride_oh + col] = Elem<T>::store(a / l);
      } else {
        ws_acc[row * D + col] = a;
        if (col == rank) *reinterpret_cast<float2*>(ws_ml + row * 2) = make_float2(mmax, l);
      }
    }
    // no CTA leaves while another still reads its shared memory (ordering nothing else: relaxed)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
    stamp(6);
    if (K == 1) {
      stamp(7);
      return;
    }
  }

  // across the K clusters: the last CTA of this rank to arrive merges columns rank, rank + C, ...
  __syncthreads();  // every thread's workspace writes are issued
  int* counter = p.counters + (long long)bh * MAX_CLUSTER + rank;
  if (threadIdx.x == 0) {
    // release (cumulative over the CTA's writes the barrier ordered before it) and acquire (the other
    // CTAs' writes, read below from L2 after the next barrier) in one atomic, no separate fences
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    last_arrival = old == K - 1;
  }
  __syncthreads();
  if (!last_arrival) {
    stamp(7);
    return;
  }
  const float* ml0 = p.ws_ml + ((long long)bh * K * MAX_CLUSTER + rank) * G_PAD * 2;
  const float* acc0 = p.ws_acc + (long long)bh * K * G_PAD * D;
  constexpr int CHUNK_K = 16;  // clusters whose states are loaded at once: one round trip to L2 per chunk
  // with one CTA a cluster the columns are adjacent: two a thread (8-byte loads), so 288 threads cover
  // d128 at GQA 4 in one pass
  const int vec = C == 1 ? 2 : 1;
  const int units = cols / vec;
  for (int e = threadIdx.x; e < G * units; e += THREADS) {
    const int row = e / units;
    const int col = rank + (e % units) * vec * C;  // vec == 2 only when C == 1
    float M = -INFINITY, L = 0.f, A0 = 0.f, A1 = 0.f;
    for (int k0 = 0; k0 < K; k0 += CHUNK_K) {
      float mk[CHUNK_K], lk[CHUNK_K], ak0[CHUNK_K], ak1[CHUNK_K];
#pragma unroll
      for (int j = 0; j < CHUNK_K; ++j) {
        const int k = k0 + j;
        if (k < K) {
          const float2 ml =
              __ldcg(reinterpret_cast<const float2*>(ml0 + ((long long)k * MAX_CLUSTER * G_PAD + row) * 2));
          mk[j] = ml.x;
          lk[j] = ml.y;
          const float* src = acc0 + ((long long)k * G_PAD + row) * D + col;
          if (vec == 2) {
            const float2 a = __ldcg(reinterpret_cast<const float2*>(src));
            ak0[j] = a.x;
            ak1[j] = a.y;
          } else {
            ak0[j] = __ldcg(src);
            ak1[j] = 0.f;
          }
        } else {
          mk[j] = -INFINITY;
          lk[j] = ak0[j] = ak1[j] = 0.f;
        }
      }
      float m_new = M;
#pragma unroll
      for (int j = 0; j < CHUNK_K; ++j) m_new = fmaxf(m_new, mk[j]);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // finite once split 0 (position 0) is in
      const float r = exp2f(M - base);
      A0 *= r;
      A1 *= r;
      L *= r;
#pragma unroll
      for (int j = 0; j < CHUNK_K; ++j) {
        const float f = exp2f(mk[j] - base);
        A0 += f * ak0[j];
        A1 += f * ak1[j];
        L += f * lk[j];
      }
      M = m_new;
    }
    uint16_t* dst = p.out + b * p.stride_ob + (long long)(h * G + row) * p.stride_oh + col;
    dst[0] = Elem<T>::store(A0 / L);
    if (vec == 2) dst[1] = Elem<T>::store(A1 / L);
  }
  if (threadIdx.x == 0) *counter = 0;  // every arrival of this launch is in: ready for the next one
  stamp(7);
}

// ---- host side ------------------------------------------------------------------------------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static EncodeTiled encode_tiled(char* err, int errlen) {
  static EncodeTiled fn = nullptr;
  if (fn) return fn;
  void* sym = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &sym, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !sym) {
    snprintf(err, errlen, "cuTensorMapEncodeTiled not found in the driver (%s)", cudaGetErrorString(e));
    return nullptr;
  }
  fn = reinterpret_cast<EncodeTiled>(sym);
  return fn;
}

static int make_map(CUtensorMap* map, const void* base, int dtype, int D, int S_max, int Hkv, int B, long long sn,
                    long long sh, long long sb, int layout, int promotion, char* err, int errlen) {
  EncodeTiled encode = encode_tiled(err, errlen);
  if (!encode) return 1;
  const cuuint32_t chunks = D / CHUNK;
  // layout 0: [D, S, Hkv, B] in boxes of [64, 64, 1, 1]; layout 1: [64, D/64, S, Hkv, B], a tile one box
  const cuuint64_t dims0[4] = {cuuint64_t(D), cuuint64_t(S_max), cuuint64_t(Hkv), cuuint64_t(B)};
  const cuuint64_t strides0[3] = {cuuint64_t(sn) * 2, cuuint64_t(sh) * 2, cuuint64_t(sb) * 2};  // bytes
  const cuuint32_t box0[4] = {CHUNK, BLOCK_N, 1, 1};
  const cuuint64_t dims1[5] = {CHUNK, chunks, cuuint64_t(S_max), cuuint64_t(Hkv), cuuint64_t(B)};
  const cuuint64_t strides1[4] = {CHUNK * 2, cuuint64_t(sn) * 2, cuuint64_t(sh) * 2, cuuint64_t(sb) * 2};
  const cuuint32_t box1[5] = {CHUNK, chunks, BLOCK_N, 1, 1};
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  const CUtensorMapL2promotion promo[4] = {CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
  CUresult r = encode(map, dtype == 0 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      layout ? 5 : 4, const_cast<void*>(base), layout ? dims1 : dims0, layout ? strides1 : strides0,
                      layout ? box1 : box0, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      promo[promotion & 3], CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    snprintf(err, errlen, "cuTensorMapEncodeTiled failed (CUresult %d) for dims [%d, %d, %d, %d]", int(r), D,
             S_max, Hkv, B);
    return 1;
  }
  return 0;
}

template <typename T, int D, int STAGES, int GROUPS>
static int launch_t(const CUtensorMap& km, const CUtensorMap& vm, const Params& p, int batch, int pdl,
                    cudaStream_t stream, char* err, int errlen) {
  auto kernel = decode_kernel<T, D, STAGES, GROUPS>;
  constexpr int smem = smem_bytes<D, STAGES, GROUPS>();
  static bool configured = false;
  if (!configured) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) {
      snprintf(err, errlen, "cudaFuncSetAttribute: %s", cudaGetErrorString(e));
      return 1;
    }
    configured = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.num_splits * p.num_clusters, batch * p.num_kv_heads, 1);
  cfg.blockDim = dim3(Layout<D, GROUPS>::THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  attrs[n].id = cudaLaunchAttributeClusterDimension;
  attrs[n].val.clusterDim.x = p.num_splits;
  attrs[n].val.clusterDim.y = 1;
  attrs[n].val.clusterDim.z = 1;
  ++n;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, km, vm, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "launch (clusters of %d x %d, D %d, stages %d, %d bytes of shared memory): %s",
             p.num_splits, p.num_clusters, D, STAGES, smem, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

template <typename T, int D, int STAGES, int GROUPS>
static int max_clusters_t(int cluster, int* out, char* err, int errlen) {
  auto kernel = decode_kernel<T, D, STAGES, GROUPS>;
  constexpr int smem = smem_bytes<D, STAGES, GROUPS>();
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster, 1, 1);
  cfg.blockDim = dim3(Layout<D, GROUPS>::THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(out, kernel, &cfg);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaOccupancyMaxActiveClusters(cluster %d): %s", cluster, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

// The instantiated (head dim, stages, consumer groups): the first of each head dim is the default. Two
// groups (8 consumer warps, 288 threads) need more than the 224 registers a thread then gets at d256.
#define FDC_FOR_EACH(X) \
  X(64, 8, 2)           \
  X(64, 4, 1)           \
  X(128, 6, 2)          \
  X(128, 4, 2)          \
  X(128, 6, 1)          \
  X(128, 3, 1)          \
  X(256, 3, 1)          \
  X(256, 2, 1)

}  // namespace fdc

extern "C" int fdc_launch(const void* q, const void* k, const void* v, const int* lengths, void* out, int dtype,
                          int B, int Hq, int Hkv, int D, int S_max, long long sqb, long long sqh, long long skb,
                          long long skh, long long skn, long long svb, long long svh, long long svn, long long sob,
                          long long soh, float scale, int num_splits, int num_clusters, float* ws_acc, float* ws_ml,
                          int* counters, long long ws_slots, long long counter_heads, unsigned long long* stamps,
                          long long stamp_capacity, int stages, int groups, int pdl, int probe, int layout,
                          int promotion, int order, void* stream, char* err, int errlen) {
  using namespace fdc;
  if (stamps && (long long)B * Hkv * num_splits * num_clusters * 16 > stamp_capacity) {
    snprintf(err, errlen, "the stamps hold %lld values; this launch of %lld CTAs writes 16 each", stamp_capacity,
             (long long)B * Hkv * num_splits * num_clusters);
    return 1;
  }
  if (num_splits < 1 || num_splits > MAX_CLUSTER) {
    snprintf(err, errlen, "num_splits %d must be 1..%d", num_splits, MAX_CLUSTER);
    return 1;
  }
  if (num_clusters < 1 || num_clusters > MAX_CLUSTERS) {
    snprintf(err, errlen, "num_clusters %d must be 1..%d", num_clusters, MAX_CLUSTERS);
    return 1;
  }
  if (num_clusters > 1 && (!ws_acc || !ws_ml || !counters || (long long)B * Hkv * num_clusters > ws_slots ||
                           (long long)B * Hkv > counter_heads)) {
    snprintf(err, errlen,
             "%d clusters a head over %d sequences x %d KV heads need %lld workspace slots and %d counter rows; "
             "the workspace has %lld and %lld",
             num_clusters, B, Hkv, (long long)B * Hkv * num_clusters, B * Hkv, ws_slots, counter_heads);
    return 1;
  }
  if (Hkv < 1 || Hq % Hkv || Hq / Hkv > G_PAD) {
    snprintf(err, errlen, "query heads %d over kv heads %d: the group must be 1..%d", Hq, Hkv, G_PAD);
    return 1;
  }
  CUtensorMap km, vm;
  if (make_map(&km, k, dtype, D, S_max, Hkv, B, skn, skh, skb, layout, promotion, err, errlen)) return 1;
  if (make_map(&vm, v, dtype, D, S_max, Hkv, B, svn, svh, svb, layout, promotion, err, errlen)) return 1;
  Params p;
  p.q = static_cast<const uint16_t*>(q);
  p.out = static_cast<uint16_t*>(out);
  p.lengths = lengths;
  p.stride_qb = sqb;
  p.stride_qh = sqh;
  p.stride_ob = sob;
  p.stride_oh = soh;
  p.num_kv_heads = Hkv;
  p.group = Hq / Hkv;
  p.s_max = S_max;
  p.num_splits = num_splits;
  p.num_clusters = num_clusters;
  p.ws_acc = ws_acc;
  p.ws_ml = ws_ml;
  p.counters = counters;
  p.stamps = stamps;
  p.qk_scale = scale * 1.4426950408889634f;
  p.probe = probe;
  p.layout = layout;
  p.order = order;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define FDC_CASE(DD, SS, GG)                                                                   \
  if (D == DD && stages == SS && groups == GG)                                                 \
    return dtype == 0 ? launch_t<__nv_bfloat16, DD, SS, GG>(km, vm, p, B, pdl, st, err, errlen) \
                      : launch_t<__half, DD, SS, GG>(km, vm, p, B, pdl, st, err, errlen);
  FDC_FOR_EACH(FDC_CASE)
#undef FDC_CASE
  snprintf(err, errlen, "no kernel for d%d, %d stages, %d groups", D, stages, groups);
  return 1;
}

extern "C" int fdc_max_active_clusters(int dtype, int D, int stages, int groups, int cluster, int* out, char* err,
                                       int errlen) {
  using namespace fdc;
#define FDC_CASE(DD, SS, GG)                                                                \
  if (D == DD && stages == SS && groups == GG)                                              \
    return dtype == 0 ? max_clusters_t<__nv_bfloat16, DD, SS, GG>(cluster, out, err, errlen) \
                      : max_clusters_t<__half, DD, SS, GG>(cluster, out, err, errlen);
  FDC_FOR_EACH(FDC_CASE)
#undef FDC_CASE
  snprintf(err, errlen, "no kernel for d%d, %d stages, %d groups", D, stages, groups);
  return 1;
}

extern "C" int fdc_smem_bytes(int D, int stages, int groups) {
  using namespace fdc;
#define FDC_CASE(DD, SS, GG) \
  if (D == DD && stages == SS && groups == GG) return smem_bytes<DD, SS, GG>();
  FDC_FOR_EACH(FDC_CASE)
#undef FDC_CASE
  return -1;
}
