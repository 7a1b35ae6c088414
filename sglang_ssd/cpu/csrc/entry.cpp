// The compiled entry to the small-M linear (`linear.py`, docs/CPU_ROUTE.md), to
// the paged attention with its KV write (`attention.py`), to the rotary embedding (`rope.py`), and to
// SGLang's SiLU-and-mul (`silu_mul.py`).
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

#include <cstring>

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

// ---- attention: the layer's KV write and the C attention (csrc/attention.c) in one call ----
//
// Why: in the server a layer's attention spent 70-90 us in Python around a 20-35 us kernel (SGLang's
// KV write with its dtype, layout and bounds branches, then the argument checks and conversions of
// attention.py), and Python runs slowly there: every step streams 540 MB of weights through the
// caches. attention.py calls this only for SGLang's plain fp32 KV pool; anything this function does
// not take returns None before anything is written (but see rc below), and attention.py takes the call.

using AttentionKernel = int (*)(const float *q, long ldq, float *out, const float *k_cache, const float *v_cache,
                                long pool_stride, const int32_t *req_to_token, long table_stride,
                                const int64_t *req_rows, const int64_t *seq_lens, int lens_count_queries, long bs,
                                long n, const uint8_t *mask, long heads, long kv_heads, long dim, float scale);

AttentionKernel attention_kernel = nullptr;  // null: every call goes to attention.py

void set_attention(int64_t fn) { attention_kernel = reinterpret_cast<AttentionKernel>(fn); }

bool f32_cpu(const at::Tensor &t) { return t.is_cpu() && t.scalar_type() == at::kFloat; }

at::Tensor as_int64(const at::Tensor &t) {
    return t.scalar_type() == at::kLong && t.is_contiguous() ? t : t.to(at::kLong).contiguous();
}

// A pool of [slots, kv_heads, dim] rows the kernel reads in place (K and V alike).
bool plain_pool(const at::Tensor &k_cache, const at::Tensor &v_cache) {
    return f32_cpu(k_cache) && f32_cpu(v_cache) && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() &&
           v_cache.strides() == k_cache.strides() && k_cache.stride(2) == 1 && k_cache.stride(1) == k_cache.size(2);
}

// Every request's table row exists, its positions fit the table, and every slot the kernel will read
// is a pool row: the kernel reads them all unchecked.
bool requests_fit(const at::Tensor &rows, const at::Tensor &lens, const at::Tensor &table, int64_t n, bool decode,
                  int64_t slots) {
    const int64_t *r = rows.data_ptr<int64_t>(), *len = lens.data_ptr<int64_t>();
    const int32_t *t = table.data_ptr<int32_t>();
    for (int64_t b = 0; b < rows.numel(); ++b) {
        const int64_t prefix = len[b] - (decode ? n : 0);
        if (r[b] < 0 || r[b] >= table.size(0) || prefix < 0 || prefix + n > table.size(1)) return false;
        const int32_t *row = t + r[b] * table.stride(0);
        for (int64_t j = 0; j < prefix + n; ++j)
            if (row[j] < 0 || row[j] >= slots) return false;
    }
    return true;
}

// k and v: T rows of [kv_heads * dim] into the pool rows at loc (T int64 slots); false (nothing written)
// when a shape or a slot does not fit.
bool write_kv(const at::Tensor &k, const at::Tensor &v, const at::Tensor &loc, at::Tensor &k_cache,
              at::Tensor &v_cache) {
    if (!loc.is_cpu()) return false;
    const at::Tensor slots = as_int64(loc);
    const int64_t rows = slots.numel(), width = k_cache.size(1) * k_cache.size(2);
    // one row per slot, as SGLang's `k_cache[loc] = k` takes them ([T, kv_heads, dim] or [T, kv_heads * dim])
    if (!f32_cpu(k) || !f32_cpu(v) || k.dim() < 1 || v.dim() < 1 || k.size(0) != rows || v.size(0) != rows ||
        k.numel() != rows * width || v.numel() != rows * width)
        return false;
    const int64_t *s = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < rows; ++t)
        if (s[t] < 0 || s[t] >= k_cache.size(0)) return false;
    at::Tensor k2 = k.reshape({rows, width}), v2 = v.reshape({rows, width});
    if (k2.stride(1) != 1) k2 = k2.contiguous();
    if (v2.stride(1) != 1) v2 = v2.contiguous();
    float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
    const size_t bytes = sizeof(float) * static_cast<size_t>(width);
    for (int64_t t = 0; t < rows; ++t) {
        std::memcpy(kc + s[t] * k_cache.stride(0), k2.data_ptr<float>() + t * k2.stride(0), bytes);
        std::memcpy(vc + s[t] * v_cache.stride(0), v2.data_ptr<float>() + t * v2.stride(0), bytes);
    }
    return true;
}

// q: [requests * n, heads * dim] rows; k/v/loc: this step's K/V and their slots (all three or none);
// table: int32 token table, req_rows/seq_lens per request (any integer dtype); mask: uint8 [requests,
// n, n] or None (causal chain). Returns the attention output, or None with nothing written.
py::object attention(const at::Tensor &q, const c10::optional<at::Tensor> &k, const c10::optional<at::Tensor> &v,
                     at::Tensor k_cache, at::Tensor v_cache, const c10::optional<at::Tensor> &loc,
                     const at::Tensor &table, const at::Tensor &req_rows, const at::Tensor &seq_lens, int64_t n,
                     int64_t heads, double scaling, bool decode, const c10::optional<at::Tensor> &mask) {
    if (attention_kernel == nullptr || n < 1 || heads < 1 || !f32_cpu(q) || !plain_pool(k_cache, v_cache)) return py::none();
    const int64_t kv_heads = k_cache.size(1), dim = k_cache.size(2);
    if (kv_heads < 1 || heads % kv_heads || dim < 1 || q.numel() % (heads * dim)) return py::none();
    if (!table.is_cpu() || table.scalar_type() != at::kInt || table.dim() != 2 || table.stride(1) != 1) return py::none();
    const bool writes = k.has_value() && v.has_value() && loc.has_value();
    if (!writes && (k.has_value() || v.has_value() || loc.has_value())) return py::none();
    if (!req_rows.is_cpu() || !seq_lens.is_cpu()) return py::none();
    const at::Tensor rows = as_int64(req_rows), lens = as_int64(seq_lens);
    const int64_t bs = rows.numel();
    at::Tensor q2 = q.reshape({-1, heads * dim});
    if (q2.stride(1) != 1) q2 = q2.contiguous();
    if (lens.numel() != bs || q2.size(0) != bs * n || !requests_fit(rows, lens, table, n, decode, k_cache.size(0)))
        return py::none();
    if (mask.has_value() && (!mask->is_cpu() || mask->scalar_type() != at::kByte || !mask->is_contiguous() ||
                             mask->numel() != bs * n * n))
        return py::none();
    at::Tensor out = at::empty({bs * n, heads * dim}, q.options());
    if (writes && !write_kv(*k, *v, *loc, k_cache, v_cache)) return py::none();
    int rc;
    {
        py::gil_scoped_release unlocked;
        rc = attention_kernel(q2.data_ptr<float>(), q2.stride(0), out.data_ptr<float>(), k_cache.data_ptr<float>(),
                              v_cache.data_ptr<float>(), k_cache.stride(0), table.data_ptr<int32_t>(), table.stride(0),
                              rows.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), decode ? 1 : 0, bs, n,
                              mask.has_value() ? mask->data_ptr<uint8_t>() : nullptr, heads, kv_heads, dim,
                              static_cast<float>(scaling));
    }
    // rc != 0 (the kernel had no scratch memory) is the one refusal after the write: attention.py then
    // takes the call and writes the same K/V again
    return rc == 0 ? py::cast(out) : py::none();
}

// ---- rotary embedding: csrc/rope.c on q and k in one call ----
//
// Why: the kernel takes a few microseconds a layer, the ctypes call around it (sixteen converted
// arguments, the position and output tensors made in Python) 25-35 us in the server. rope.py calls
// this only for an embedding it has found plain; anything else here returns None and rope.py decides.

using RopeKernel = int (*)(const float *q, long ldq, const float *k, long ldk, float *oq, float *ok, const int64_t *pos,
                           long tokens, long q_heads, long k_heads, long head, long rot, int neox, const float *cache,
                           long ld_cache, long n_cache);

RopeKernel rope_kernel = nullptr;  // null: every call goes to rope.py

void set_rope(int64_t fn) { rope_kernel = reinterpret_cast<RopeKernel>(fn); }

// [tokens, heads * head] rows with unit column stride, read in place; an undefined tensor if x is not.
at::Tensor rope_rows(const at::Tensor &x, int64_t tokens, int64_t head) {
    if (!f32_cpu(x) || x.dim() < 1 || x.size(-1) % head || x.numel() != tokens * x.size(-1)) return at::Tensor();
    at::Tensor x2 = (x.dim() == 2 && x.stride(1) == 1) ? x : x.reshape({tokens, x.size(-1)});
    return x2.stride(1) == 1 ? x2 : x2.contiguous();
}

// Returns (q, k) rotated, new contiguous tensors of the inputs' shapes, or None with nothing done.
py::object rope(const at::Tensor &positions, const at::Tensor &query, const at::Tensor &key, const at::Tensor &cache,
                int64_t head, int64_t rot, bool neox) {
    if (rope_kernel == nullptr || head < 1 || rot < 2 || rot % 2 || rot > head || !positions.is_cpu()) return py::none();
    if (!f32_cpu(cache) || cache.dim() != 2 || cache.stride(1) != 1 || cache.size(1) != rot) return py::none();
    const int64_t tokens = positions.numel();
    const at::Tensor q2 = rope_rows(query, tokens, head), k2 = rope_rows(key, tokens, head);
    if (!q2.defined() || !k2.defined()) return py::none();
    const at::Tensor pos = as_int64(positions.reshape({-1}));
    at::Tensor oq = at::empty(query.sizes(), query.options()), ok = at::empty(key.sizes(), key.options());
    const int rc = rope_kernel(q2.data_ptr<float>(), q2.stride(0), k2.data_ptr<float>(), k2.stride(0),
                               oq.data_ptr<float>(), ok.data_ptr<float>(), pos.data_ptr<int64_t>(), tokens,
                               q2.size(1) / head, k2.size(1) / head, head, rot, neox ? 1 : 0, cache.data_ptr<float>(),
                               cache.stride(0), cache.size(0));
    // rc != 0: a position outside the cache; SGLang's own code raises or grows the cache
    if (rc != 0) return py::none();
    return py::make_tuple(oq, ok);
}

// ---- SiLU-and-mul: SGLang's native SiluAndMul, its two ATen calls made from C++ ----
//
// Why: silu(x[..., :d]) * x[..., d:] is two ATen kernels of a few microseconds on a decode step's rows,
// and SGLang's Python around them (the custom-op dispatch, two slices) cost 26-38 us a layer in the
// server. The same at::silu and at::mul run here on the same views, so the bits are the native path's.
py::object silu_mul(const at::Tensor &x) {
    if (!x.is_cpu() || x.dim() < 1 || x.size(-1) % 2) return py::none();
    const int64_t d = x.size(-1) / 2;
    return py::cast(at::mul(at::silu(x.narrow(-1, 0, d)), x.narrow(-1, d, d)));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("set_kernels", &set_kernels, "the route's C kernels (addresses; 0 = none) and the row limit");
    m.def("linear", &linear, "the kernel's product, or None where linear.py must decide");
    m.def("follows", &follows, "record a plan as the successor of this thread's last product");
    m.def("set_attention", &set_attention, "the route's C attention (address; 0 = none)");
    m.def("attention", &attention, "KV write and paged attention, or None where attention.py must decide");
    m.def("set_rope", &set_rope, "the route's C rotary embedding (address; 0 = none)");
    m.def("rope", &rope, "q and k rotated, or None where rope.py must decide");
    m.def("silu_mul", &silu_mul, "silu(x[..., :d]) * x[..., d:], or None where silu_mul.py must decide");
}
