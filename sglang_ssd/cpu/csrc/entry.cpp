// The compiled entry to the small-M linear (`linear.py`, "The CPU linear route" in the README).
//
// Through Python and ctypes a call spends about 5 us around the kernel: the route's checks, the
// output allocation, the plan lookup and ctypes' argument conversion. For the 576x576 projection that
// is a tenth of the product itself. This entry makes the same checks and the same call from C++, for
// well under a microsecond. It decides nothing on its own: whenever a call is not the plain case (a
// weight not yet packed or packed before an in-place change, a dtype, device, size, thread count or
// autograd the kernel does not take) it returns None and `linear.py` takes the call, with its messages.
//
// A plan is an int64 tensor kept on the weight by `linear.py` (`Packed.meta`):
//   [weight data_ptr, weight version, packed weight address, lead bytes, successor address, successor bytes]
// The last two are the prefetch hint of `Packed`: the product that ran after this one last time.
#include <torch/extension.h>

#include <ATen/Parallel.h>

namespace {

using Kernel = void (*)(const float *x, long ldx, const void *wp, const float *b, float *y, long ldy, long M,
                        long N, long K, const void *next, long next_bytes);

enum Meta { KEY_PTR, KEY_VERSION, PACKED, LEAD_BYTES, NEXT_PTR, NEXT_BYTES };  // linear.py's Packed.meta

Kernel kernel_f32 = nullptr;   // the route's kernel for fp32 weights; null: every call goes to Python
Kernel kernel_bf16 = nullptr;  // ... for bf16 (compact) weights
long max_rows = 0;
thread_local at::Tensor last_plan;  // the plan of the product this thread ran last (kept alive here)

void set_kernels(int64_t f32, int64_t bf16, int64_t rows) {
    kernel_f32 = reinterpret_cast<Kernel>(f32);
    kernel_bf16 = reinterpret_cast<Kernel>(bf16);
    max_rows = rows;
}

int64_t version_of(const at::Tensor &t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

// Record `plan` as the successor of the product this thread ran before it (`linear._follows`).
void follows(const at::Tensor &plan) {
    if (last_plan.defined()) {
        int64_t *prev = last_plan.data_ptr<int64_t>();
        const int64_t *cur = plan.data_ptr<int64_t>();
        if (prev[NEXT_PTR] != cur[PACKED]) {
            prev[NEXT_PTR] = cur[PACKED];
            prev[NEXT_BYTES] = cur[LEAD_BYTES];
        }
    }
    last_plan = plan;
}

bool takes_bias(const c10::optional<at::Tensor> &bias, int64_t n) {
    if (!bias.has_value()) return true;
    const at::Tensor &b = *bias;
    return b.scalar_type() == at::kFloat && b.is_cpu() && b.dim() == 1 && b.size(0) == n && b.is_contiguous();
}

bool needs_grad(const at::Tensor &x, const at::Tensor &w, const c10::optional<at::Tensor> &bias) {
    return at::GradMode::is_enabled() &&
           (x.requires_grad() || w.requires_grad() || (bias.has_value() && bias->requires_grad()));
}

py::object linear(const at::Tensor &x, const at::Tensor &w, const c10::optional<at::Tensor> &bias,
                  const at::Tensor &plan) {
    Kernel kernel = w.scalar_type() == at::kFloat ? kernel_f32 : w.scalar_type() == at::kBFloat16 ? kernel_bf16 : nullptr;
    if (kernel == nullptr || !x.is_cpu() || x.scalar_type() != at::kFloat || w.dim() != 2 || !w.is_cpu() ||
        !w.is_contiguous() || x.dim() == 0)
        return py::none();
    const int64_t n = w.size(0), k = w.size(1);
    if (k == 0 || x.size(-1) != k) return py::none();
    const int64_t rows = x.numel() / k;
    if (rows == 0 || rows > max_rows || !takes_bias(bias, n) || needs_grad(x, w, bias) || at::get_num_threads() != 1)
        return py::none();
    const int64_t *meta = plan.data_ptr<int64_t>();
    if (meta[KEY_PTR] != reinterpret_cast<int64_t>(w.data_ptr()) || meta[KEY_VERSION] != version_of(w))
        return py::none();  // packed before an in-place change or a re-pointing: Python packs it again

    // Rows with unit column stride are read in place (a slice of a wider buffer included).
    at::Tensor x2 = (x.dim() == 2 && x.stride(1) == 1) ? x : x.reshape({-1, k});
    if (x2.stride(1) != 1) x2 = x2.contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    at::Tensor y = at::empty(shape, x.options());
    follows(plan);
    {
        py::gil_scoped_release unlocked;  // as through ctypes: other Python threads run during the product
        kernel(x2.data_ptr<float>(), x2.stride(0), reinterpret_cast<const void *>(meta[PACKED]),
               bias.has_value() ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), n, rows, n, k,
               reinterpret_cast<const void *>(meta[NEXT_PTR]), meta[NEXT_BYTES]);
    }
    return py::cast(y);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("set_kernels", &set_kernels, "the route's C kernels (addresses; 0 = none) and the row limit");
    m.def("linear", &linear, "the kernel's product, or None where linear.py must decide");
    m.def("follows", &follows, "record a plan as the successor of this thread's last product");
}
