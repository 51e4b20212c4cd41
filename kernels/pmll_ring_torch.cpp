// pmll_ring_torch.cpp: torch binding of the PMLL ring's CUDA twins (pmll_ring.cu). Built only
// on a GPU machine, by pmll_lab/cuda_ext.py (torch.utils.cpp_extension.load). The Python
// launchers (pmll_lab/ops/pmll/ring.py) check every argument first; the checks here are the
// last line (TORCH_CHECK raises RuntimeError) against a call that skipped them.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "pmll_common.cuh"

namespace {

pmll::Dtype dtype_of(const torch::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return pmll::Dtype::kF32;
    case torch::kBFloat16: return pmll::Dtype::kBF16;
    case torch::kFloat16: return pmll::Dtype::kF16;
    default: TORCH_CHECK(false, name, ": fp32, bf16 or fp16, got ", t.scalar_type());
  }
}

void check_ring(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& count) {
  TORCH_CHECK(k.is_cuda() && k.dim() == 4 && k.is_contiguous(), "mem.k: contiguous 4-D CUDA");
  TORCH_CHECK(v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type() && v.is_contiguous()
              && v.device() == k.device(), "mem.v: like mem.k");
  TORCH_CHECK(count.scalar_type() == torch::kInt64 && count.dim() == 1
              && count.size(0) == k.size(0) && count.device() == k.device(),
              "mem.count: int64 [B] beside mem.k");
}

void ring_write(torch::Tensor k_mem, torch::Tensor v_mem, torch::Tensor count,
                torch::Tensor k_new, torch::Tensor v_new, c10::optional<torch::Tensor> gate) {
  check_ring(k_mem, v_mem, count);
  const c10::cuda::CUDAGuard guard(k_mem.device());
  for (const auto* t : {&k_new, &v_new})
    TORCH_CHECK(t->dim() == 4 && t->size(0) == k_mem.size(0) && t->size(1) == k_mem.size(1)
                && t->size(3) == k_mem.size(3) && t->size(2) == k_new.size(2)
                && t->stride(3) == 1 && t->scalar_type() == k_mem.scalar_type()
                && t->device() == k_mem.device(), "k_new, v_new: [B, H, T, D] like the ring");
  pmll::WriteArgs a{};
  a.k_mem = k_mem.data_ptr();
  a.v_mem = v_mem.data_ptr();
  a.count = count.data_ptr<int64_t>();
  a.k_new = k_new.data_ptr();
  a.v_new = v_new.data_ptr();
  a.B = k_mem.size(0); a.H = k_mem.size(1); a.M = k_mem.size(2); a.D = k_mem.size(3);
  a.T = k_new.size(2);
  a.s_kb = k_new.stride(0); a.s_kh = k_new.stride(1); a.s_kt = k_new.stride(2);
  a.s_vb = v_new.stride(0); a.s_vh = v_new.stride(1); a.s_vt = v_new.stride(2);
  pmll::Dtype gate_dtype = pmll::Dtype::kF32;
  if (gate.has_value()) {
    const auto& g = *gate;
    TORCH_CHECK(g.device() == k_mem.device() && (g.dim() == 2 || g.dim() == 3)
                && g.size(0) == a.B && g.size(-1) == a.T && (g.dim() == 2 || g.size(1) == a.H),
                "gate: [B, T] or [B, H, T] beside the ring");
    gate_dtype = dtype_of(g, "gate");
    a.gate = g.data_ptr();
    a.s_gb = g.stride(0);
    a.s_gh = g.dim() == 3 ? g.stride(1) : 0;
    a.s_gt = g.stride(-1);
  }
  const cudaError_t err = pmll::ring_write(a, dtype_of(k_mem, "mem.k"), gate_dtype,
                                           c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll ring_write launch: ", cudaGetErrorString(err));
}

std::vector<torch::Tensor> ring_read(torch::Tensor k_mem, torch::Tensor v_mem,
                                     torch::Tensor count, int64_t t_ctx) {
  check_ring(k_mem, v_mem, count);
  TORCH_CHECK(t_ctx >= 0, "t_ctx: >= 0");
  const c10::cuda::CUDAGuard guard(k_mem.device());
  const int64_t rows = k_mem.size(2) + t_ctx;
  auto k_out = torch::empty({k_mem.size(0), k_mem.size(1), rows, k_mem.size(3)}, k_mem.options());
  auto v_out = torch::empty_like(k_out);
  pmll::ReadArgs a{k_mem.data_ptr(), v_mem.data_ptr(), count.data_ptr<int64_t>(),
                   k_out.data_ptr(), v_out.data_ptr(),
                   k_mem.size(0), k_mem.size(1), k_mem.size(2), rows, k_mem.size(3)};
  const cudaError_t err = pmll::ring_read(a, dtype_of(k_mem, "mem.k"),
                                          c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll ring_read launch: ", cudaGetErrorString(err));
  return {k_out, v_out};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA twins of the PMLL ring write and chronological read (kernels/pmll_ring.cu)";
  m.def("ring_write", &ring_write, "gated ring write, in place (count is not advanced)",
        py::arg("k_mem"), py::arg("v_mem"), py::arg("count"), py::arg("k_new"),
        py::arg("v_new"), py::arg("gate") = py::none());
  m.def("ring_read", &ring_read, "chronological, right-aligned read",
        py::arg("k_mem"), py::arg("v_mem"), py::arg("count"), py::arg("t_ctx"));
}
