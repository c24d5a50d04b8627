// Torch binding of the cluster decode kernel: checks the tensors, then hands raw pointers, strides and
// the caller's stream to the launcher in flash_decode_cluster.cu (built by nvcc without torch headers).

#include <torch/extension.h>

#include <algorithm>
#include <string>

extern "C" int fdc_launch(const void* q, const void* k, const void* v, const int* lengths, void* out, int dtype,
                          int B, int Hq, int Hkv, int D, int S_max, long long sqb, long long sqh, long long skb,
                          long long skh, long long skn, long long svb, long long svh, long long svn, long long sob,
                          long long soh, float scale, int num_splits, int num_clusters, float* ws_acc, float* ws_ml,
                          int* counters, long long ws_slots, long long counter_heads, unsigned long long* stamps,
                          long long stamp_capacity, int stages, int groups, int pdl, int probe, int layout,
                          int promotion, int order, void* stream, char* err, int errlen);
extern "C" int fdc_max_active_clusters(int dtype, int D, int stages, int groups, int cluster, int* out, char* err,
                                       int errlen);
extern "C" int fdc_smem_bytes(int D, int stages, int groups);

namespace {

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kBFloat16) return 0;
  if (t.scalar_type() == at::kHalf) return 1;
  TORCH_CHECK(false, "flash_decode_cluster: dtype ", t.scalar_type(), " is not bfloat16 or float16");
}

// A size-1 dimension's stride is meaningless to torch but checked by the tensor map: give it a
// consistent value (the extent of the dimensions inside it).
int64_t stride_of(const at::Tensor& t, int dim) {
  if (t.size(dim) != 1) return t.stride(dim);
  return t.stride(dim + 1) * t.size(dim + 1);
}

void launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
            const at::Tensor& out, double scale, int64_t num_splits, int64_t num_clusters, const at::Tensor& ws_acc,
            const at::Tensor& ws_ml, const at::Tensor& counters, const at::Tensor& stamps, int64_t stages,
            int64_t groups, bool pdl,
            int64_t probe, int64_t layout, int64_t promotion, int64_t order, int64_t stream) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && lengths.is_cuda() && out.is_cuda(),
              "flash_decode_cluster: every tensor must be on the GPU");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes() && out.sizes() == q.sizes(),
              "flash_decode_cluster: expected q, out [B, Hq, D] and k, v [B, Hkv, S_max, D]");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(2), "flash_decode_cluster: batch or head dim differ");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "flash_decode_cluster: q, k, v and out must share one dtype");
  TORCH_CHECK(lengths.scalar_type() == at::kInt && lengths.dim() == 1 && lengths.size(0) == q.size(0),
              "flash_decode_cluster: lengths must be int32 [B]");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && out.stride(2) == 1,
              "flash_decode_cluster: the head dim must be contiguous");
  // the cross-cluster workspace: [slots][16][256] floats, [slots][16][16][2] floats, [heads][16] int32 counters
  TORCH_CHECK(ws_acc.is_cuda() && ws_ml.is_cuda() && counters.is_cuda() && ws_acc.device() == q.device() &&
                  ws_ml.device() == q.device() && counters.device() == q.device(),
              "flash_decode_cluster: the workspace must be on q's GPU");
  TORCH_CHECK(ws_acc.scalar_type() == at::kFloat && ws_ml.scalar_type() == at::kFloat &&
                  counters.scalar_type() == at::kInt && ws_acc.is_contiguous() && ws_ml.is_contiguous() &&
                  counters.is_contiguous(),
              "flash_decode_cluster: the workspace must be contiguous float32, float32 and int32");
  const int64_t slots = std::min(ws_acc.numel() / (16 * q.size(2)), ws_ml.numel() / (16 * 16 * 2));
  const int64_t heads = counters.numel() / 16;
  // diagnostics: an empty tensor (none) or int64 [CTAs * 16] on q's GPU
  TORCH_CHECK(stamps.numel() == 0 || (stamps.is_cuda() && stamps.device() == q.device() &&
                                      stamps.scalar_type() == at::kLong && stamps.is_contiguous()),
              "flash_decode_cluster: stamps must be contiguous int64 on q's GPU");
  auto* stamp_ptr = stamps.numel() ? reinterpret_cast<unsigned long long*>(stamps.data_ptr<int64_t>()) : nullptr;
  char err[512] = {0};
  int rc = fdc_launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), lengths.data_ptr<int>(), out.data_ptr(),
                      dtype_code(q), int(q.size(0)), int(q.size(1)), int(k.size(1)), int(q.size(2)), int(k.size(2)),
                      stride_of(q, 0), stride_of(q, 1), stride_of(k, 0), stride_of(k, 1), stride_of(k, 2),
                      stride_of(v, 0), stride_of(v, 1), stride_of(v, 2), stride_of(out, 0), stride_of(out, 1),
                      float(scale), int(num_splits), int(num_clusters), ws_acc.data_ptr<float>(),
                      ws_ml.data_ptr<float>(), counters.data_ptr<int>(), slots, heads, stamp_ptr, stamps.numel(), int(stages), int(groups), pdl ? 1 : 0, int(probe), int(layout),
                      int(promotion), int(order), reinterpret_cast<void*>(stream), err, sizeof(err));
  TORCH_CHECK(rc == 0, "flash_decode_cluster: ", std::string(err));
}

int64_t max_active_clusters(int64_t dtype, int64_t head_dim, int64_t stages, int64_t groups, int64_t cluster) {
  char err[512] = {0};
  int n = 0;
  int rc = fdc_max_active_clusters(int(dtype), int(head_dim), int(stages), int(groups), int(cluster), &n, err,
                                   sizeof(err));
  TORCH_CHECK(rc == 0, "flash_decode_cluster: ", std::string(err));
  return n;
}

int64_t smem_bytes(int64_t head_dim, int64_t stages, int64_t groups) {
  return fdc_smem_bytes(int(head_dim), int(stages), int(groups));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch", &launch, "split-KV decode attention merged in thread-block clusters");
  m.def("max_active_clusters", &max_active_clusters, "clusters of a size that fit on the device at once");
  m.def("smem_bytes", &smem_bytes, "dynamic shared memory of one CTA");
}
