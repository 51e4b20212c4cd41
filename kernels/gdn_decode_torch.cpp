// gdn_decode_torch.cpp: torch binding of the GDN decode's, chain's and carried-state verify's and
// flush's CUDA twins (gdn_decode.cu, gdn_chain.cu, gdn_carry.cu), one module. Built on a GPU
// machine by pmll_lab/cuda_ext.py. The Python launchers (pmll_lab/ops/gdn/decode.py,
// pmll_lab/ops/carry/exact.py and stash.py, impl="cuda") check every argument
// first; the checks here are the last line (TORCH_CHECK raises RuntimeError) against a call
// that skipped them.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gdn_carry.cuh"
#include "gdn_chain.cuh"
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

// The decode's arguments from tensors with `lead` leading dims ([B] for the decode, [B, K] for
// the chain): every check of the decode, then the pointers, sizes, strides and element types.
pmll::GdnDecodeArgs decode_args(const torch::Tensor& state, const torch::Tensor& q,
                                const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& g, const torch::Tensor& beta,
                                const torch::Tensor& o, double scale, bool use_qk_l2norm,
                                const c10::optional<torch::Tensor>& A_log,
                                const c10::optional<torch::Tensor>& dt_bias,
                                const c10::optional<torch::Tensor>& state_indices,
                                const c10::optional<torch::Tensor>& out_state_indices,
                                int64_t lead) {
  TORCH_CHECK(state.is_cuda() && state.dim() == 4 && state.stride(3) == 1,
              "state: [S, HV, vd, kd] CUDA, last dim contiguous");
  on(q, state, "q", lead + 2); on(k, state, "k", lead + 2); on(v, state, "v", lead + 2);
  on(g, state, "g", lead + 1); on(beta, state, "beta", lead + 1);
  const int64_t B = q.size(0), HK = q.size(lead), kd = q.size(lead + 1);
  const int64_t HV = state.size(1), vd = state.size(2);
  TORCH_CHECK(state.size(3) == kd && k.sizes() == q.sizes() && v.size(0) == B
              && v.size(lead) == HV && v.size(lead + 1) == vd && HV % HK == 0
              && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type()
              && (lead == 1 || v.size(1) == q.size(1)), "q, k, v: shapes unlike the state's");
  TORCH_CHECK(kd <= pmll::kGdnMaxKd, "kd: at most ", pmll::kGdnMaxKd);
  TORCH_CHECK(g.size(0) == B && g.size(lead) == HV && beta.size(0) == B && beta.size(lead) == HV
              && (lead == 1 || (g.size(1) == q.size(1) && beta.size(1) == q.size(1))),
              "g, beta: [B, (K,) HV]");
  TORCH_CHECK(o.is_contiguous() && o.device() == state.device() && o.dim() == lead + 2
              && o.size(0) == B && o.size(lead) == HV && o.size(lead + 1) == vd
              && (lead == 1 || o.size(1) == q.size(1)), "o: [B, (K,) HV, vd] contiguous");
  TORCH_CHECK(A_log.has_value() == dt_bias.has_value(), "A_log, dt_bias: both or neither");
  pmll::GdnDecodeArgs a{};
  a.state = state.data_ptr(); a.q = q.data_ptr(); a.k = k.data_ptr(); a.v = v.data_ptr();
  a.g = g.data_ptr(); a.beta = beta.data_ptr(); a.o = o.data_ptr();
  a.B = B; a.HK = HK; a.HV = HV; a.kd = kd; a.vd = vd;
  a.s_slot = state.stride(0); a.s_head = state.stride(1); a.s_row = state.stride(2);
  a.q_b = q.stride(0); a.q_h = q.stride(lead); a.k_b = k.stride(0); a.k_h = k.stride(lead);
  a.v_b = v.stride(0); a.v_h = v.stride(lead); a.g_b = g.stride(0); a.beta_b = beta.stride(0);
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
  return a;
}

void gdn_decode_vk(torch::Tensor state, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                   torch::Tensor g, torch::Tensor beta, torch::Tensor o, double scale,
                   bool use_qk_l2norm, c10::optional<torch::Tensor> A_log,
                   c10::optional<torch::Tensor> dt_bias,
                   c10::optional<torch::Tensor> state_indices,
                   c10::optional<torch::Tensor> out_state_indices) {
  const pmll::GdnDecodeArgs a = decode_args(state, q, k, v, g, beta, o, scale, use_qk_l2norm,
                                            A_log, dt_bias, state_indices, out_state_indices, 1);
  const c10::cuda::CUDAGuard guard(state.device());
  const cudaError_t err = pmll::gdn_decode_vk(a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll gdn_decode_vk launch: ", cudaGetErrorString(err));
}

void gdn_chain_vk(torch::Tensor state, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                  torch::Tensor g, torch::Tensor beta, torch::Tensor o, double scale,
                  bool use_qk_l2norm, c10::optional<torch::Tensor> intermediate,
                  c10::optional<torch::Tensor> A_log, c10::optional<torch::Tensor> dt_bias,
                  c10::optional<torch::Tensor> state_indices,
                  c10::optional<torch::Tensor> out_state_indices) {
  pmll::GdnChainArgs c{};
  c.d = decode_args(state, q, k, v, g, beta, o, scale, use_qk_l2norm, A_log, dt_bias,
                    state_indices, out_state_indices, 2);
  c.K = q.size(1);
  TORCH_CHECK(c.K >= 1, "q: rows K (dim 1) must be >= 1");
  c.q_t = q.stride(1); c.k_t = k.stride(1); c.v_t = v.stride(1);
  c.g_t = g.stride(1); c.beta_t = beta.stride(1);
  if (intermediate.has_value() && c.K > 1) {
    const auto& t = *intermediate;
    TORCH_CHECK(t.device() == state.device() && t.scalar_type() == state.scalar_type()
                && t.dim() == 5 && t.size(0) == c.d.B && t.size(1) == c.K - 1
                && t.size(2) == c.d.HV && t.size(3) == c.d.vd && t.size(4) == c.d.kd
                && t.stride(4) == 1,
                "intermediate: [B, K-1, HV, vd, kd] in the state's dtype, last dim contiguous");
    c.inter = t.data_ptr();
    c.i_b = t.stride(0); c.i_t = t.stride(1); c.i_h = t.stride(2); c.i_row = t.stride(3);
  }
  const c10::cuda::CUDAGuard guard(state.device());
  const cudaError_t err = pmll::gdn_chain_vk(c, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll gdn_chain_vk launch: ", cudaGetErrorString(err));
}

// An int32 or int64 tensor of `shape` (contiguous) on the state's device.
void index_like(const torch::Tensor& t, const torch::Tensor& state, const char* name,
                c10::IntArrayRef shape, bool int32_only) {
  TORCH_CHECK(t.device() == state.device() && t.sizes() == shape && t.is_contiguous()
              && (t.scalar_type() == torch::kInt32
                  || (!int32_only && t.scalar_type() == torch::kInt64)),
              name, ": ", shape, (int32_only ? " int32" : " int32/int64"), " contiguous, on the "
              "state's device");
}

// The stash of one layer: fp32 [S, CAP*(HV*vd + HV + HV*kd)], rows contiguous.
void check_stash(const torch::Tensor& stash, const torch::Tensor& state, int64_t cap) {
  const int64_t S = state.size(0), HV = state.size(1), vd = state.size(2), kd = state.size(3);
  TORCH_CHECK(cap >= 1 && stash.device() == state.device()
              && stash.scalar_type() == torch::kFloat32 && stash.dim() == 2
              && stash.size(0) == S && stash.size(1) == cap * (HV * vd + HV + HV * kd)
              && stash.stride(1) == 1,
              "stash: fp32 [S, CAP*(HV*vd + HV + HV*kd)], rows contiguous, on the state's device");
}

void gdn_carry_verify_vk(torch::Tensor state, torch::Tensor stash, torch::Tensor pend,
                         torch::Tensor slot_tab, torch::Tensor arrive, torch::Tensor q,
                         torch::Tensor k, torch::Tensor v, torch::Tensor g, torch::Tensor beta,
                         torch::Tensor o, torch::Tensor engaged, double scale,
                         bool use_qk_l2norm, int64_t cap, bool lazy,
                         c10::optional<torch::Tensor> A_log,
                         c10::optional<torch::Tensor> dt_bias) {
  pmll::GdnCarryArgs c{};
  c.c.d = decode_args(state, q, k, v, g, beta, o, scale, use_qk_l2norm, A_log, dt_bias,
                      slot_tab, c10::nullopt, 2);
  c.c.K = q.size(1);
  TORCH_CHECK(c.c.K >= 1 && c.c.K <= cap, "q: rows K (dim 1) must lie in [1, CAP]");
  c.c.q_t = q.stride(1); c.c.k_t = k.stride(1); c.c.v_t = v.stride(1);
  c.c.g_t = g.stride(1); c.c.beta_t = beta.stride(1);
  check_stash(stash, state, cap);
  index_like(pend, state, "pend", {state.size(0)}, true);
  index_like(engaged, state, "engaged", {c.c.d.B}, true);
  index_like(arrive, state, "arrive", {state.size(0), c.c.d.HV}, true);
  c.stash = stash.data_ptr<float>(); c.stash_slot = stash.stride(0);
  c.pend = pend.data_ptr<int32_t>(); c.engaged = engaged.data_ptr<int32_t>();
  c.arrive = arrive.data_ptr<int32_t>(); c.cap = cap; c.lazy = lazy;
  const c10::cuda::CUDAGuard guard(state.device());
  const cudaError_t err = pmll::gdn_carry_verify_vk(c, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll gdn_carry_verify_vk launch: ", cudaGetErrorString(err));
}

void gdn_carry_flush_vk(torch::Tensor state, torch::Tensor stash, torch::Tensor pend,
                        torch::Tensor slot_tab, torch::Tensor state_off, torch::Tensor stash_off,
                        torch::Tensor pend_off, int64_t cap) {
  TORCH_CHECK(state.is_cuda() && state.dim() == 4 && state.stride(3) == 1,
              "state: [S, HV, vd, kd] CUDA, last dim contiguous");
  TORCH_CHECK(state.size(3) <= pmll::kGdnMaxKd, "kd: at most ", pmll::kGdnMaxKd);
  check_stash(stash, state, cap);
  index_like(pend, state, "pend", {state.size(0)}, true);
  TORCH_CHECK(slot_tab.dim() == 1, "slot_tab: [B]");
  index_like(slot_tab, state, "slot_tab", {slot_tab.size(0)}, false);
  const int64_t L = state_off.numel();
  for (const auto& [t, name] : {std::pair{&state_off, "state_off"},
                                std::pair{&stash_off, "stash_off"},
                                std::pair{&pend_off, "pend_off"}})
    TORCH_CHECK(t->device() == state.device() && t->dim() == 1 && t->size(0) == L
                && t->is_contiguous() && t->scalar_type() == torch::kInt64,
                name, ": [L] int64 contiguous, on the state's device");
  pmll::GdnFlushArgs f{};
  f.state = state.data_ptr(); f.stash = stash.data_ptr<float>(); f.pend = pend.data_ptr<int32_t>();
  f.idx = slot_tab.data_ptr(); f.tidx = dtype_of(slot_tab, "slot_tab");
  f.state_off = state_off.data_ptr<int64_t>(); f.stash_off = stash_off.data_ptr<int64_t>();
  f.pend_off = pend_off.data_ptr<int64_t>();
  f.B = slot_tab.size(0); f.HV = state.size(1); f.vd = state.size(2); f.kd = state.size(3);
  f.L = L; f.cap = cap;
  f.s_slot = state.stride(0); f.s_head = state.stride(1); f.s_row = state.stride(2);
  f.stash_slot = stash.stride(0);
  f.ts = dtype_of(state, "state");
  TORCH_CHECK(f.ts == GdnDtype::kF32 || f.ts == GdnDtype::kBF16 || f.ts == GdnDtype::kF16,
              "state: fp32, bf16 or fp16");
  const c10::cuda::CUDAGuard guard(state.device());
  const cudaError_t err = pmll::gdn_carry_flush_vk(f, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "pmll gdn_carry_flush_vk launch: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA twins of the GDN decode, chain, carried-state verify and flush on a V-major "
            "state (kernels/gdn_decode.cu, kernels/gdn_chain.cu, kernels/gdn_carry.cu)";
  m.def("gdn_decode_vk", &gdn_decode_vk, "one decode token per lane, state in place",
        py::arg("state"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
        py::arg("beta"), py::arg("o"), py::arg("scale"), py::arg("use_qk_l2norm"),
        py::arg("A_log") = py::none(), py::arg("dt_bias") = py::none(),
        py::arg("state_indices") = py::none(), py::arg("out_state_indices") = py::none());
  m.def("gdn_chain_vk", &gdn_chain_vk,
        "K rows per lane, state in place, the state after each row t < K-1 to intermediate",
        py::arg("state"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
        py::arg("beta"), py::arg("o"), py::arg("scale"), py::arg("use_qk_l2norm"),
        py::arg("intermediate") = py::none(), py::arg("A_log") = py::none(),
        py::arg("dt_bias") = py::none(), py::arg("state_indices") = py::none(),
        py::arg("out_state_indices") = py::none());
  m.def("gdn_carry_verify_vk", &gdn_carry_verify_vk,
        "carried-state verify of K rows per lane (exact form, eager or lazy): pending rows "
        "folded, state written back when the protocol says so, rows stashed",
        py::arg("state"), py::arg("stash"), py::arg("pend"), py::arg("slot_tab"),
        py::arg("arrive"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
        py::arg("beta"), py::arg("o"), py::arg("engaged"), py::arg("scale"),
        py::arg("use_qk_l2norm"), py::arg("cap"), py::arg("lazy"),
        py::arg("A_log") = py::none(), py::arg("dt_bias") = py::none());
  m.def("gdn_carry_flush_vk", &gdn_carry_flush_vk,
        "every listed slot's pending rows folded into its state, L layers at element offsets",
        py::arg("state"), py::arg("stash"), py::arg("pend"), py::arg("slot_tab"),
        py::arg("state_off"), py::arg("stash_off"), py::arg("pend_off"), py::arg("cap"));
}
