// gdn_decode_torch.cpp: torch binding of the GDN decode's CUDA twin (gdn_decode.cu). Built on a
// GPU machine by pmll_lab/cuda_ext.py. The Python launcher (pmll_lab/ops/gdn/decode.py,
// impl="cuda") checks every argument first; the checks here are the last line (TORCH_CHECK
// raises RuntimeError) against a call that skipped them.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gdn_decode.cuh"

namespace {

using pmll::GdnDtype;

GdnDtype dtype_of(const torch::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return GdnDtype::kF32;
    case torch::kBFloat16: return GdnDtype::kBF16;
    case torch::kFloat16: return GdnDtype::kF16;
    case torch::kInt32: return GdnDtype::kI32;
    case torch::kInt64: return GdnDtype::kI64;
    default: TORCH_CHECK(false, name, ": unsupported dtype ", t.scalar_type());
  }
}

void on(const torch::Tensor& t, const torch::Tensor& state, const char* name, int64_t dim) {
  TORCH_CHECK(t.device() == state.device() && t.dim() == dim && t.stride(-1) == 1, name,
              ": ", dim, "-D, last dim contiguous, on the state's device");
}

void gdn_decode_vk(torch::Tensor state, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                   torch::Tensor g, torch::Tensor beta, torch::Tensor o, double scale,
                   bool use_qk_l2norm, c10::optional<torch::Tensor> A_log,
                   c10::optional<torch::Tensor> dt_bias,
                   c10::optional<torch::Tensor> state_indices,
                   c10::optional<torch::Tensor> out_state_indices) {
  TORCH_CHECK(state.is_cuda() && state.dim() == 4 && state.stride(3) == 1,
              "state: [S, HV, vd, kd] CUDA, last dim contiguous");
  on(q, state, "q", 3); on(k, state, "k", 3); on(v, state, "v", 3);
  on(g, state, "g", 2); on(beta, state, "beta", 2);
  const int64_t B = q.size(0), HK = q.size(1), kd = q.size(2);
  const int64_t HV = state.size(1), vd = state.size(2);
  TORCH_CHECK(state.size(3) == kd && k.sizes() == q.sizes() && v.size(0) == B && v.size(1) == HV
              && v.size(2) == vd && HV % HK == 0 && k.scalar_type() == q.scalar_type()
              && v.scalar_type() == q.scalar_type(), "q, k, v: shapes unlike the state's");
  TORCH_CHECK(kd <= pmll::kGdnMaxKd, "kd: at most ", pmll::kGdnMaxKd);
  TORCH_CHECK(g.size(0) == B && g.size(1) == HV && beta.size(0) == B && beta.size(1) == HV,
              "g, beta: [B, HV]");
  TORCH_CHECK(o.is_contiguous() && o.device() == state.device() && o.dim() == 3
              && o.size(0) == B && o.size(1) == HV && o.size(2) == vd, "o: [B, HV, vd] contiguous");
  TORCH_CHECK(A_log.has_value() == dt_bias.has_value(), "A_log, dt_bias: both or neither");
  const c10::cuda::CUDAGuard guard(state.device());
  pmll::GdnDecodeArgs a{};
  a.state = state.data_ptr(); a.q = q.data_ptr(); a.k = k.data_ptr(); a.v = v.data_ptr();
  a.g = g.data_ptr(); a.beta = beta.data_ptr(); a.o = o.data_ptr();
  a.B = B; a.HK = HK; a.HV = HV; a.kd = kd; a.vd = vd;
  a.s_slot = state.stride(0); a.s_head = state.stride(1); a.s_row = state.stride(2);
  a.q_b = q.stride(0); a.q_h = q.stride(1); a.k_b = k.stride(0); a.k_h = k.stride(1);
  a.v_b = v.stride(0); a.v_h = v.stride(1); a.g_b = g.stride(0); a.beta_b = beta.stride(0);
  a.scale = float(scale); a.l2norm = use_qk_l2norm;
  a.ts = dtype_of(state, "state"); a.ti = dtype_of(q, "q"); a.to = dtype_of(o, "o");
  a.tg = dtype_of(g, "g"); a.tbeta = dtype_of(beta, "beta");
  a.talog = a.tdt = GdnDtype::kF32; a.tidx = a.tout_idx = GdnDtype::kI64;
  if (A_log.has_value()) {
    for (const auto* t : {&*A_log, &*dt_bias})
      TORCH_CHECK(t->device() == state.device() && t->dim() == 1 && t->size(0) == HV
                  && t->is_contiguous(), "A_log, dt_bias: [HV] contiguous");
    a.A_log = A_log->data_ptr(); a.dt_bias = dt_bias->data_ptr();
    a.talog = dtype_of(*A_log, "A_log"); a.tdt = dtype_of(*dt_bias, "dt_bias");
  }
  for (const auto& [opt, name] : {std::pair{&state_indices, "state_indices"},
                                  std::pair{&out_state_indices, "out_state_indices"}}) {
    if (!opt->has_value()) continue;
    const auto& t = **opt;
    TORCH_CHECK(t.device() == state.device() && t.dim() == 1 && t.size(0) == B
                && t.is_contiguous() && (t.scalar_type() == torch::kInt32
                                         || t.scalar_type() == torch::kInt64),
                name, ": [B] int32/int64 contiguous");
  }
  if (state_indices.has_value()) {
    a.idx = state_indices->data_ptr(); a.tidx = dtype_of(*state_indices, "state_indices");
  }
  if (out_state_indices.has_value()) {
    a.out_idx = out_state_indices->data_ptr();
    a.tout_idx = dtype_of(*out_state_indices, "out_state_indices");
  }
  for (GdnDtype t : {a.ts, a.ti, a.to, a.tg, a.tbeta, a.talog, a.tdt})
    TORCH_CHECK(t == GdnDtype::kF32 || t == GdnDtype::kBF16 || t == GdnDtype::kF16,
                "state, q, k, v, o, gates: fp32, bf16 or fp16");
  const cudaError_t err = pmll::gdn_decode_vk(a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll gdn_decode_vk launch: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA twin of the GDN decode on a V-major state (kernels/gdn_decode.cu)";
  m.def("gdn_decode_vk", &gdn_decode_vk, "one decode token per lane, state in place",
        py::arg("state"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
        py::arg("beta"), py::arg("o"), py::arg("scale"), py::arg("use_qk_l2norm"),
        py::arg("A_log") = py::none(), py::arg("dt_bias") = py::none(),
        py::arg("state_indices") = py::none(), py::arg("out_state_indices") = py::none());
}
