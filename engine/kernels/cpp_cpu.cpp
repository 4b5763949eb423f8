// W4A16 GEMV on the CPU straight from the artifact's INT4 layout (engine/codec.py): codes [..., N, K/2]
// uint8, element 2i in the low nibble and 2i+1 in the high one, two's-complement 4-bit; scales
// [..., N, K/G] (BF16, FP16 or FP32). FP32 activations and accumulation. Also the dense GEMV (FP32, BF16
// or FP16 weights as stored) of the LM head and the projections at a decode step's few rows. Built at
// first use by engine/kernels/cpp_cpu.py with the machine's vector extensions; the loops are written so
// the compiler vectorises them, with AVX-512 intrinsics where the machine has them (AVX2 ones for the
// dense GEMV on machines without).
//
// x is deinterleaved per group first ([G/2 even elements, G/2 odd elements]), so a group's low nibbles
// meet one contiguous run of x and its high nibbles the next. Each row accumulates per lane, the group
// scale applied to each group's lanes, and sums its lanes once at the end.
//
// Also KDA's chunked prefill (kda_chunk), a whole (batch, head) sequence per task.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBytesPerTask = 16384;  // codes one parallel task reads at least
constexpr int64_t kTileRows = 16;  // dense weight rows that stay in L1 while every row of x passes them
// Rows of x from which an INT4 weight row is decoded once to FP32 and then read from L1 by every row
// (dense_rows), rather than its nibbles decoded again for each row by row_dot.
constexpr int64_t kDecodeOnceRows = 4;

#if defined(__AVX512F__)
// 16 codes (bytes) of one group -> their low and high nibbles as signed FP32 lanes, times x, summed. The
// nibble indexes a table of the 16 code values (vpermps reads an index's low 4 bits): no mask, no convert.
inline __m512 nibble_dot(const uint8_t* c, const float* x_low, const float* x_high) {
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  const __m512i u = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
  const __m512 low = _mm512_permutexvar_ps(u, codes);
  const __m512 high = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), codes);
  return _mm512_fmadd_ps(high, _mm512_loadu_ps(x_high), _mm512_mul_ps(low, _mm512_loadu_ps(x_low)));
}

template <int HALF, typename S>
inline float row_dot(const uint8_t* codes, const S* scales, const float* xs, int64_t groups) {
  static_assert(HALF % 16 == 0, "a group's half is whole vectors");
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  // even and odd groups: two FMA chains
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* c = codes + g * HALF;
    const float* x = xs + g * 2 * HALF;
    __m512 sum = nibble_dot(c, x, x + HALF);
    for (int j = 16; j < HALF; j += 16) sum = _mm512_add_ps(sum, nibble_dot(c + j, x + j, x + HALF + j));
    acc[g & 1] = _mm512_fmadd_ps(sum, _mm512_set1_ps(static_cast<float>(scales[g])), acc[g & 1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}
#else
template <int HALF, typename S>
inline float row_dot(const uint8_t* codes, const S* scales, const float* xs, int64_t groups) {
  float acc[HALF] = {0};
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* c = codes + g * HALF;
    const float* x = xs + g * 2 * HALF;
    const float scale = static_cast<float>(scales[g]);
#pragma omp simd
    for (int j = 0; j < HALF; ++j) {
      const int u = c[j] ^ 0x88;  // nibble ^ 8: the code + 8
      acc[j] += scale * (float((u & 15) - 8) * x[j] + float((u >> 4) - 8) * x[HALF + j]);
    }
  }
  float total = 0.f;
  for (int j = 0; j < HALF; ++j) total += acc[j];
  return total;
}
#endif

using RowDot = float (*)(const uint8_t*, const void*, const float*, int64_t);

template <int HALF, typename S>
float row_dot_erased(const uint8_t* codes, const void* scales, const float* xs, int64_t groups) {
  return row_dot<HALF, S>(codes, static_cast<const S*>(scales), xs, groups);
}

template <typename S>
RowDot dot_for_group(int64_t group) {
  switch (group) {
    case 32: return row_dot_erased<16, S>;
    case 64: return row_dot_erased<32, S>;
    case 128: return row_dot_erased<64, S>;
  }
  TORCH_CHECK(false, "cpp kernels take group sizes 32, 64 or 128, got ", group);
}

RowDot dot_for(const at::Tensor& scales, int64_t group) {
  switch (scales.scalar_type()) {
    case at::kBFloat16: return dot_for_group<c10::BFloat16>(group);
    case at::kHalf: return dot_for_group<c10::Half>(group);
    case at::kFloat: return dot_for_group<float>(group);
    default: TORCH_CHECK(false, "cpp scales must be BF16, FP16 or FP32, got ", scales.scalar_type());
  }
}

// x [..., K] (any float dtype) -> FP32 [rows, K] deinterleaved per group (a loop: x is small, ATen's
// reshape-transpose-copy cost more than the copy itself).
at::Tensor split_groups(const at::Tensor& x, int64_t group) {
  const int64_t k = x.size(-1);
  TORCH_CHECK(group > 0 && k % group == 0, "K=", k, " is not a multiple of the group size ", group);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor split = at::empty({xf.numel() / k, k}, xf.options());
  const float* src = xf.data_ptr<float>();
  float* dst = split.data_ptr<float>();
  const int64_t half = group / 2;
  for (int64_t start = 0; start < xf.numel(); start += group) {
    for (int64_t j = 0; j < half; ++j) {
      dst[start + j] = src[start + 2 * j];
      dst[start + half + j] = src[start + 2 * j + 1];
    }
  }
  return split;
}

void check_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t k, int64_t group, int64_t lead) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && scales.is_contiguous(),
              "cpp weights must be contiguous uint8 codes and scales");
  TORCH_CHECK(codes.dim() == lead + 2 && scales.dim() == lead + 2, "cpp weight has the wrong rank");
  TORCH_CHECK(codes.size(-1) * 2 == k && scales.size(-1) * group == k && scales.size(-2) == codes.size(-2),
              "cpp weight [", codes.sizes(), "] with scales [", scales.sizes(), "] does not take K=", k,
              " in groups of ", group);
}

int64_t grain(int64_t row_bytes) { return std::max<int64_t>(1, kBytesPerTask / std::max<int64_t>(1, row_bytes)); }

// Route ids [B, S] as int64 values, each checked against the bank's size.
at::Tensor checked_routes(const at::Tensor& route_ids, int64_t experts) {
  TORCH_CHECK(route_ids.dim() == 2, "route_ids must be [B, S]");
  at::Tensor ids = route_ids.to(at::kLong).contiguous();
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < experts, "route id ", p[i], " outside a bank of ", experts, " experts");
  }
  return ids;
}

at::Tensor w4a16_mm_decoded(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t group);

// y[M, N] = x[M, K] @ W^T; each weight row is read once for all M rows of x (from kDecodeOnceRows rows on,
// decoded once: w4a16_mm_decoded).
at::Tensor w4a16_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t group) {
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  const int64_t m = x.size(0), k = x.size(1), n = codes.size(0);
  check_weight(codes, scales, k, group, 0);
  if (m >= kDecodeOnceRows) return w4a16_mm_decoded(x, codes, scales, group);
  const at::Tensor xs = split_groups(x, group);
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  const RowDot dot = dot_for(scales, group);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const char* s = static_cast<const char*>(scales.data_ptr());
  const int64_t s_row = scales.size(1) * scales.element_size(), groups = k / group;
  const float* xp = xs.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, n, grain(k / 2), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t i = 0; i < m; ++i) {
        y[i * n + row] = dot(c + row * (k / 2), s + row * s_row, xp + i * k, groups);
      }
    }
  });
  return out;
}

#if defined(__AVX512F__)
// 16 weights (FP32, BF16 or FP16) as FP32 lanes.
template <typename W>
inline __m512 load_weights(const W* w) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_loadu_ps(w);
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    if constexpr (std::is_same_v<W, c10::BFloat16>) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));  // BF16: FP32's top half
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// 8 weights (FP32, BF16 or FP16) as FP32 lanes: the AVX2 machines' form of the loop below.
template <typename W>
inline __m256 load_weights8(const W* w) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm256_loadu_ps(w);
  } else {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    if constexpr (std::is_same_v<W, c10::BFloat16>) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      return _mm256_cvtph_ps(bits);
    }
  }
}

inline float reduce_add8(__m256 v) {
  const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}
#endif

// One weight row (FP32, BF16 or FP16) dotted with MR FP32 rows of x, y[i * ldy] = w . x[i]. Each weight
// vector is loaded and converted once for the MR rows; two accumulators per row of x (even and odd
// blocks) make 2 * MR FMA chains. The weight row is read in one sequential pass: interleaving several
// weight rows slowed the stream from memory 1.8x.
template <int MR, typename W>
inline void dense_row(const W* w, const float* x, int64_t k, float* y, int64_t ldy) {
  int64_t j = 0;
  float total[MR] = {};
#if defined(__AVX512F__)
  __m512 acc[MR][2];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (; j + 32 <= k; j += 32) {
    const __m512 w0 = load_weights(w + j), w1 = load_weights(w + j + 16);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      acc[i][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i * k + j), acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i * k + j + 16), acc[i][1]);
    }
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) total[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 acc[MR][2];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (; j + 16 <= k; j += 16) {
    const __m256 w0 = load_weights8(w + j), w1 = load_weights8(w + j + 8);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * k + j), acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i * k + j + 8), acc[i][1]);
    }
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) total[i] = reduce_add8(_mm256_add_ps(acc[i][0], acc[i][1]));
#endif
  for (; j < k; ++j) {
    const float wj = static_cast<float>(w[j]);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) total[i] += wj * x[i * k + j];
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) y[i * ldy] = total[i];
}

#if defined(__AVX512BF16__)
// dense_row for BF16 weights and BF16 x: VDPBF16PS multiplies 32 pairs exactly and adds them into 16
// FP32 lanes (twice the FMAs of the FP32 path per instruction, no conversion); the tail of K is a masked
// load (zeros beyond K).
template <int MR>
inline void dense_row(const c10::BFloat16* w, const c10::BFloat16* x, int64_t k, float* y, int64_t ldy) {
  __m512 acc[MR][2];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 64 <= k; j += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + j);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + j + 32);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, (__m512bh)_mm512_loadu_si512(x + i * k + j));
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, (__m512bh)_mm512_loadu_si512(x + i * k + j + 32));
    }
  }
  for (; j < k; j += 32) {
    const __mmask32 mask = k - j >= 32 ? ~__mmask32(0) : (__mmask32(1) << (k - j)) - 1;
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i)
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], wv, (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * k + j));
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) y[i * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}
#endif

// Weight rows [first, last) against all m rows of x [m, k] (FP32, or BF16 beside BF16 weights), in
// tiles of kTileRows weight rows that stay in L1 while each block of up to four rows of x passes them.
template <typename W, typename X>
void dense_rows(const W* w, const X* x, int64_t m, int64_t k, int64_t n, float* y, int64_t first, int64_t last) {
  for (int64_t begin = first; begin < last; begin += kTileRows) {
    const int64_t end = std::min(last, begin + kTileRows);
    for (int64_t i = 0; i < m; i += 4) {
      const X* xi = x + i * k;
      float* yi = y + i * n;
      for (int64_t r = begin; r < end; ++r) {
        switch (std::min<int64_t>(4, m - i)) {
          case 1: dense_row<1>(w + r * k, xi, k, yi + r, n); break;
          case 2: dense_row<2>(w + r * k, xi, k, yi + r, n); break;
          case 3: dense_row<3>(w + r * k, xi, k, yi + r, n); break;
          default: dense_row<4>(w + r * k, xi, k, yi + r, n);
        }
      }
    }
  }
}

// y[M, N] = x[M, K] @ W^T for a FP32, BF16 or FP16 weight, FP32 sums. BF16 x against BF16 weights
// multiplies BF16 pairs where the CPU has AVX512-BF16 (exact products, as the FP32 path's); any other x is
// FP32.
at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.is_contiguous() && x.size(1) == weight.size(1),
              "dense_mm takes x [M, K] and a contiguous weight [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  float* y = out.data_ptr<float>();
  auto run = [&](const auto* w, const auto* xp) {
    const int64_t row_bytes = k * static_cast<int64_t>(sizeof(*w));
    at::parallel_for(0, n, grain(row_bytes), [&](int64_t begin, int64_t end) { dense_rows(w, xp, m, k, n, y, begin, end); });
  };
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16) {
    const at::Tensor xb = x.contiguous();
    run(weight.data_ptr<c10::BFloat16>(), xb.data_ptr<c10::BFloat16>());
    return out;
  }
#endif
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  if (weight.scalar_type() == at::kBFloat16) {
    run(weight.data_ptr<c10::BFloat16>(), xf.data_ptr<float>());
  } else if (weight.scalar_type() == at::kFloat) {
    run(weight.data_ptr<float>(), xf.data_ptr<float>());
  } else {
    TORCH_CHECK(weight.scalar_type() == at::kHalf, "dense_mm weights must be FP32, BF16 or FP16, got ",
                weight.scalar_type());
    run(weight.data_ptr<c10::Half>(), xf.data_ptr<float>());
  }
  return out;
}

// The routes [B, S] sorted by expert (a stable counting sort; the ids are host memory, nothing syncs): expert
// e's routes are order[start[e] .. start[e + 1]), `chosen` the experts with any, `source` the row of x each
// sorted route reads (x [B, K], or [B, S, K] per route).
struct RouteOrder {
  std::vector<int64_t> start, order, chosen;
  at::Tensor source;
};

RouteOrder sort_routes(const at::Tensor& ids, int64_t experts, bool per_slot) {
  const int64_t slots = ids.size(1), routes = ids.numel();
  const int64_t* route = ids.data_ptr<int64_t>();
  RouteOrder sorted{std::vector<int64_t>(experts + 1, 0), std::vector<int64_t>(routes), {}, at::empty({routes}, ids.options())};
  std::vector<int64_t>& start = sorted.start;
  for (int64_t r = 0; r < routes; ++r) ++start[route[r] + 1];
  for (int64_t e = 0; e < experts; ++e) start[e + 1] += start[e];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < routes; ++r) sorted.order[fill[route[r]]++] = r;
  for (int64_t e = 0; e < experts; ++e) {
    if (start[e + 1] > start[e]) sorted.chosen.push_back(e);
  }
  int64_t* src = sorted.source.data_ptr<int64_t>();
  for (int64_t j = 0; j < routes; ++j) src[j] = per_slot ? sorted.order[j] : sorted.order[j] / slots;
  return sorted;
}

// The experts the routes choose, counted without sorting them (the per-route path needs no order).
int64_t distinct_experts(const at::Tensor& ids, int64_t experts) {
  std::vector<char> seen(experts, 0);
  const int64_t* route = ids.data_ptr<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < ids.numel(); ++r) count += !std::exchange(seen[route[r]], 1);
  return count;
}

// Every (chosen expert, weight row) pair of `sorted` over torch's threads, each task's share as runs of
// one expert's weight rows: run(e, first, last) for rows [first, last) of expert e, whose routes are
// sorted.start[e] .. sorted.start[e + 1].
template <typename Run>
void for_each_expert_run(const RouteOrder& sorted, int64_t n, int64_t grain_size, const Run& run) {
  const int64_t items = static_cast<int64_t>(sorted.chosen.size()) * n;
  at::parallel_for(0, items, grain_size, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end;) {
      const int64_t e = sorted.chosen[item / n], first = item % n, last = std::min(n, first + end - item);
      run(e, first, last);
      item += last - first;
    }
  });
}

// This thread's buffer for kTileRows decoded weight rows of K values (reused across calls).
float* tile_buffer(int64_t k) {
  thread_local std::vector<float> tile;
  tile.resize(kTileRows * k);
  return tile.data();
}

void check_routed_x(const at::Tensor& x, int64_t batch, int64_t slots) {
  TORCH_CHECK((x.dim() == 2 && x.size(0) == batch) || (x.dim() == 3 && x.size(0) == batch && x.size(1) == slots),
              "x must be [B, K] or [B, S, K] for route_ids [B, S]");
}

// Outputs in expert order [R, N] back to [B, S, N]; with `up`, silu(gate) * up.
at::Tensor unsort_routes(const RouteOrder& sorted, const at::Tensor& gate_y, const at::Tensor* up_y, int64_t batch,
                         int64_t slots) {
  const int64_t n = gate_y.size(1);
  at::Tensor out = at::empty({batch, slots, n}, gate_y.options());
  float* y = out.data_ptr<float>();
  const float* gy = gate_y.data_ptr<float>();
  const float* uy = up_y != nullptr ? up_y->data_ptr<float>() : nullptr;
  at::parallel_for(0, batch * slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      float* dst = y + sorted.order[j] * n;
      const float* a = gy + j * n;
      if (uy == nullptr) {
        std::copy(a, a + n, dst);
        continue;
      }
      const float* b = uy + j * n;
      for (int64_t c = 0; c < n; ++c) dst[c] = a[c] / (1.f + std::exp(-a[c])) * b[c];
    }
  });
  return out;
}

// One INT4 weight row as FP32 in its natural order: byte j of a group holds elements 2j (low nibble) and
// 2j + 1 (high), each a two's-complement code, times the group's scale (split_groups' pairing).
template <typename S>
void decode_row(const uint8_t* codes, const void* scales, int64_t k, int64_t group, float* out) {
  const S* sc = static_cast<const S*>(scales);
  const int64_t half = group / 2;
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    const float scale = static_cast<float>(sc[g0 / group]);
    const uint8_t* c = codes + g0 / 2;
    float* o = out + g0;
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const int u = c[j] ^ 0x88;  // nibble ^ 8: the code + 8
      o[2 * j] = float((u & 15) - 8) * scale;
      o[2 * j + 1] = float((u >> 4) - 8) * scale;
    }
  }
}

using RowDecode = void (*)(const uint8_t*, const void*, int64_t, int64_t, float*);

RowDecode decode_for(const at::Tensor& scales) {
  switch (scales.scalar_type()) {
    case at::kBFloat16: return decode_row<c10::BFloat16>;
    case at::kHalf: return decode_row<c10::Half>;
    case at::kFloat: return decode_row<float>;
    default: TORCH_CHECK(false, "cpp scales must be BF16, FP16 or FP32, got ", scales.scalar_type());
  }
}

// Weight rows [first, last) of one INT4 matrix (codes [N, K/2], scales [N, K/group] of row stride s_row
// bytes) against m FP32 rows of x [m, K] in natural order: y[i * ldy + r] for r in [first, last), each
// tile of kTileRows weight rows decoded once into this thread's tile_buffer.
void decoded_rows(const uint8_t* codes, const char* scales, int64_t s_row, RowDecode decode, int64_t group,
                  const float* x, int64_t m, int64_t k, float* y, int64_t ldy, int64_t first, int64_t last) {
  float* tile = tile_buffer(k);
  for (int64_t begin = first; begin < last; begin += kTileRows) {
    const int64_t end = std::min(last, begin + kTileRows);
    for (int64_t r = begin; r < end; ++r) decode(codes + r * (k / 2), scales + r * s_row, k, group, tile + (r - begin) * k);
    dense_rows(tile, x, m, k, ldy, y + begin, 0, end - begin);
  }
}

// w4a16_mm for several rows of x: tiles of weight rows decoded once (decoded_rows).
at::Tensor w4a16_mm_decoded(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t group) {
  const int64_t m = x.size(0), k = x.size(1), n = codes.size(0);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  const RowDecode decode = decode_for(scales);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const char* s = static_cast<const char*>(scales.data_ptr());
  const int64_t s_row = scales.size(1) * scales.element_size();
  const float* xp = xf.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, n, std::max(kTileRows, grain(k / 2)), [&](int64_t begin, int64_t end) {
    decoded_rows(c, s, s_row, decode, group, xp, m, k, y, n, begin, end);
  });
  return out;
}

// `grouped` where experts repeat among the routes (a batch, or a prompt's tokens): the routes sorted by
// expert, each chosen expert's weight rows decoded once for all the routes that chose it.
at::Tensor grouped_by_expert(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& gate_scales,
                             const c10::optional<at::Tensor>& up, const c10::optional<at::Tensor>& up_scales,
                             const at::Tensor& ids, const RouteOrder& sorted, int64_t group) {
  const int64_t k = x.size(-1), n = gate.size(1), batch = ids.size(0), slots = ids.size(1), routes = ids.numel();
  const bool swiglu = up.has_value();
  const at::Tensor xs = x.reshape({-1, k}).index_select(0, sorted.source).to(at::kFloat).contiguous();
  const at::TensorOptions fp32 = x.options().dtype(at::kFloat);
  at::Tensor gate_y = at::empty({routes, n}, fp32), up_y = swiglu ? at::empty({routes, n}, fp32) : gate_y;
  const RowDecode decode = decode_for(gate_scales);
  const int64_t e_codes = n * (k / 2), s_row = gate_scales.size(2) * gate_scales.element_size(), e_scales = n * s_row;
  const uint8_t* g = gate.data_ptr<uint8_t>();
  const uint8_t* u = swiglu ? up->data_ptr<uint8_t>() : nullptr;
  const char* gs = static_cast<const char*>(gate_scales.data_ptr());
  const char* us = swiglu ? static_cast<const char*>(up_scales->data_ptr()) : nullptr;
  const float* xp = xs.data_ptr<float>();
  float* gy = gate_y.data_ptr<float>();
  float* uy = up_y.data_ptr<float>();
  const std::vector<int64_t>& start = sorted.start;
  for_each_expert_run(sorted, n, std::max(kTileRows, grain(k / 2 * (swiglu ? 2 : 1))), [&](int64_t e, int64_t first,
                                                                                          int64_t last) {
    const int64_t rows = start[e + 1] - start[e], at = start[e];
    decoded_rows(g + e * e_codes, gs + e * e_scales, s_row, decode, group, xp + at * k, rows, k, gy + at * n, n, first,
                 last);
    if (swiglu)
      decoded_rows(u + e * e_codes, us + e * e_scales, s_row, decode, group, xp + at * k, rows, k, uy + at * n, n,
                   first, last);
  });
  return unsort_routes(sorted, gate_y, swiglu ? &up_y : nullptr, batch, slots);
}

// out[b, s, n] = x[b(, s)] @ bank[route_ids[b, s]][n]^T over a dense bank [E, N, K] (FP32, BF16 or
// FP16, as stored); swiglu: silu(gate) * up over two banks. The routes are sorted by expert first (the ids
// are in host memory: no device sync), so each chosen expert's weight rows are read once for all the
// routes that chose it: a batch reads the union of its experts, not batch * top-k of them. FP32 sums; x
// as dense_mm takes it (BF16 beside BF16 weights where the CPU has AVX512-BF16, else FP32).
at::Tensor dense_grouped(const at::Tensor& x, const at::Tensor& gate, const c10::optional<at::Tensor>& up,
                         const at::Tensor& route_ids) {
  TORCH_CHECK(gate.dim() == 3 && gate.is_contiguous(), "dense_grouped takes a contiguous bank [E, N, K]");
  const int64_t k = x.size(-1), experts = gate.size(0), n = gate.size(1);
  TORCH_CHECK(gate.size(2) == k, "the bank's K=", gate.size(2), " does not match x's ", k);
  const bool swiglu = up.has_value();
  if (swiglu) {
    TORCH_CHECK(up->sizes() == gate.sizes() && up->scalar_type() == gate.scalar_type() && up->is_contiguous(),
                "gate and up banks differ in shape, dtype or layout");
  }
  const at::Tensor ids = checked_routes(route_ids, experts);
  const int64_t batch = ids.size(0), slots = ids.size(1), routes = batch * slots;
  check_routed_x(x, batch, slots);
  const RouteOrder sorted = sort_routes(ids, experts, x.dim() == 3);
  const std::vector<int64_t>& start = sorted.start;
#if defined(__AVX512BF16__)
  const bool bf16_pairs = x.scalar_type() == at::kBFloat16 && gate.scalar_type() == at::kBFloat16;
#else
  const bool bf16_pairs = false;
#endif
  const at::ScalarType x_type = bf16_pairs ? at::kBFloat16 : at::kFloat;
  const at::Tensor xs = x.reshape({-1, k}).index_select(0, sorted.source).to(x_type).contiguous();  // [R, K] by expert
  const at::TensorOptions fp32 = x.options().dtype(at::kFloat);
  at::Tensor gate_y = at::empty({routes, n}, fp32), up_y = swiglu ? at::empty({routes, n}, fp32) : gate_y;
  float* gy = gate_y.data_ptr<float>();
  float* uy = up_y.data_ptr<float>();
  auto run = [&](const auto* g, const auto* u, const auto* xp) {
    const int64_t row_bytes = k * static_cast<int64_t>(sizeof(*g)) * (swiglu ? 2 : 1);
    for_each_expert_run(sorted, n, grain(row_bytes), [&](int64_t e, int64_t first, int64_t last) {
      const int64_t rows = start[e + 1] - start[e], at = start[e];
      dense_rows(g + e * n * k, xp + at * k, rows, k, n, gy + at * n, first, last);
      if (u != nullptr) dense_rows(u + e * n * k, xp + at * k, rows, k, n, uy + at * n, first, last);
    });
  };
  auto banks = [&](auto tag, const auto* xp) {
    using W = decltype(tag);
    run(gate.data_ptr<W>(), swiglu ? up->data_ptr<W>() : static_cast<const W*>(nullptr), xp);
  };
#if defined(__AVX512BF16__)
  if (bf16_pairs) {
    banks(c10::BFloat16{}, xs.data_ptr<c10::BFloat16>());
  } else
#endif
  if (gate.scalar_type() == at::kBFloat16) {
    banks(c10::BFloat16{}, xs.data_ptr<float>());
  } else if (gate.scalar_type() == at::kFloat) {
    banks(float{}, xs.data_ptr<float>());
  } else {
    TORCH_CHECK(gate.scalar_type() == at::kHalf, "dense_grouped banks must be FP32, BF16 or FP16, got ",
                gate.scalar_type());
    banks(c10::Half{}, xs.data_ptr<float>());
  }
  return unsort_routes(sorted, gate_y, swiglu ? &up_y : nullptr, batch, slots);
}

// out[b, s, n] = x[b(, s)] @ bank[route_ids[b, s]][n]^T; swiglu: silu(gate) * up over two banks.
at::Tensor grouped(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& gate_scales,
                   const c10::optional<at::Tensor>& up, const c10::optional<at::Tensor>& up_scales,
                   const at::Tensor& route_ids, int64_t group) {
  const int64_t k = x.size(-1), experts = gate.size(0), n = gate.size(1);
  check_weight(gate, gate_scales, k, group, 1);
  const bool swiglu = up.has_value();
  if (swiglu) {
    check_weight(*up, *up_scales, k, group, 1);
    TORCH_CHECK(up->sizes() == gate.sizes() && up_scales->scalar_type() == gate_scales.scalar_type(),
                "gate and up banks differ in shape or scale dtype");
  }
  const at::Tensor ids = checked_routes(route_ids, experts);
  const int64_t batch = ids.size(0), slots = ids.size(1);
  const bool per_slot = x.dim() == 3;
  check_routed_x(x, batch, slots);
  // Decoding an expert's rows once pays when its routes average kDecodeOnceRows or more.
  if (ids.numel() >= kDecodeOnceRows * distinct_experts(ids, experts))
    return grouped_by_expert(x, gate, gate_scales, up, up_scales, ids, sort_routes(ids, experts, per_slot), group);
  const at::Tensor xs = split_groups(x, group);
  at::Tensor out = at::empty({batch, slots, n}, x.options().dtype(at::kFloat));
  const RowDot dot = dot_for(gate_scales, group);
  const int64_t groups = k / group, row_bytes = k / 2, s_row = gate_scales.size(2) * gate_scales.element_size();
  const uint8_t* g = gate.data_ptr<uint8_t>();
  const uint8_t* u = swiglu ? up->data_ptr<uint8_t>() : nullptr;
  const char* gs = static_cast<const char*>(gate_scales.data_ptr());
  const char* us = swiglu ? static_cast<const char*>(up_scales->data_ptr()) : nullptr;
  const int64_t* route = ids.data_ptr<int64_t>();
  const float* xp = xs.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, batch * slots * n, grain(swiglu ? 2 * row_bytes : row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t route_index = item / n, row = item % n;
      const int64_t w = route[route_index] * n + row;
      const float* xrow = xp + (per_slot ? route_index : route_index / slots) * k;
      const float a = dot(g + w * row_bytes, gs + w * s_row, xrow, groups);
      if (!swiglu) {
        y[item] = a;
        continue;
      }
      const float b = dot(u + w * row_bytes, us + w * s_row, xrow, groups);
      y[item] = a / (1.f + std::exp(-a)) * b;
    }
  });
  return out;
}

at::Tensor w4a16_grouped(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                         const at::Tensor& route_ids, int64_t group) {
  return grouped(x, codes, scales, c10::nullopt, c10::nullopt, route_ids, group);
}

at::Tensor w4a16_grouped_swiglu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& gate_scales,
                                const at::Tensor& up, const at::Tensor& up_scales, const at::Tensor& route_ids,
                                int64_t group) {
  TORCH_CHECK(x.dim() == 2, "the gate/up projection takes x as [B, K]");
  return grouped(x, gate, gate_scales, up, up_scales, route_ids, group);
}

#if defined(__AVX512F__)
// e^x for x <= 0 down to about -87 (callers clamp to the KDA floor first): 2^n * e^r with n = round(x log2 e),
// r = x - n ln 2 (ln 2 in two parts), e^r by Cephes' expf polynomial; about 1 ulp.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
#endif

// One (t, s) pair of a block: sum_d k_sd e^clamp(g_td - g_sd) times k_td (*a) and times q_td (*m).
inline void pair_scores(const float* qt, const float* kt, const float* gt, const float* ks, const float* gs,
                        int64_t d_k, float lo, float* a, float* m) {
  int64_t d = 0;
  float sum_a = 0.f, sum_m = 0.f;
#if defined(__AVX512F__)
  __m512 acc_a = _mm512_setzero_ps(), acc_m = _mm512_setzero_ps();
  const __m512 lowest = _mm512_set1_ps(lo), zero = _mm512_setzero_ps();
  for (; d + 16 <= d_k; d += 16) {
    const __m512 diff = _mm512_sub_ps(_mm512_loadu_ps(gt + d), _mm512_loadu_ps(gs + d));
    const __m512 decayed = _mm512_mul_ps(_mm512_loadu_ps(ks + d),
                                         exp_nonpositive(_mm512_max_ps(_mm512_min_ps(diff, zero), lowest)));
    acc_a = _mm512_fmadd_ps(decayed, _mm512_loadu_ps(kt + d), acc_a);
    acc_m = _mm512_fmadd_ps(decayed, _mm512_loadu_ps(qt + d), acc_m);
  }
  sum_a = _mm512_reduce_add_ps(acc_a);
  sum_m = _mm512_reduce_add_ps(acc_m);
#endif
  for (; d < d_k; ++d) {
    const float decayed = ks[d] * std::exp(std::max(std::min(gt[d] - gs[d], 0.f), lo));
    sum_a += decayed * kt[d];
    sum_m += decayed * qt[d];
  }
  *a = sum_a;
  *m = sum_m;
}

// e^clamp(x, lo, 0) elementwise, n values: the decays of KDA's chunked form, every exponent <= 0.
inline void exp_clamped(const float* x, float lo, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 lowest = _mm512_set1_ps(lo), zero = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_max_ps(_mm512_min_ps(_mm512_loadu_ps(x + i), zero), lowest);
    _mm512_storeu_ps(out + i, exp_nonpositive(v));
  }
#endif
  for (; i < n; ++i) out[i] = std::exp(std::max(std::min(x[i], 0.f), lo));
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

#if defined(__AVX512F__)
// R rows of out[:, o0:o0 + 64] (+)= x[R, n_in] w[n_in, o0:o0 + 64]: 4R accumulators in registers, each row of
// w loaded once for the R rows.
template <int R>
inline void rows_times_tile(const float* x, int64_t ldx, const float* w, int64_t n_in, int64_t ldw, float* out,
                            int64_t ldo, bool accumulate) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = accumulate ? _mm512_loadu_ps(out + r * ldo + 16 * j) : _mm512_setzero_ps();
  for (int64_t i = 0; i < n_in; ++i) {
    const float* wi = w + i * ldw;
    const __m512 w0 = _mm512_loadu_ps(wi), w1 = _mm512_loadu_ps(wi + 16), w2 = _mm512_loadu_ps(wi + 32),
                 w3 = _mm512_loadu_ps(wi + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * ldx + i]);
      acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xr, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xr, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + r * ldo + 16 * j, acc[r][j]);
}
#endif

// out[r, :] (+)= x[r, :n_in] w[:n_in, :] for r < rows; w [n_in, n_out] contiguous, x and out of row strides
// ldx and ldo. The small matrix products of one KDA chunk (64 x 128 by 128 x 128 and smaller).
void rows_times(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t n_in, int64_t n_out, float* out,
                int64_t ldo, bool accumulate) {
#if defined(__AVX512F__)
  if (n_out % 64 == 0) {
    for (int64_t o = 0; o < n_out; o += 64) {
      int64_t r = 0;
      for (; r + 4 <= rows; r += 4)
        rows_times_tile<4>(x + r * ldx, ldx, w + o, n_in, n_out, out + r * ldo + o, ldo, accumulate);
      for (; r < rows; ++r) rows_times_tile<1>(x + r * ldx, ldx, w + o, n_in, n_out, out + r * ldo + o, ldo, accumulate);
    }
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * ldo;
    if (!accumulate) std::fill(o, o + n_out, 0.f);
    for (int64_t i = 0; i < n_in; ++i) {
      const float xi = x[r * ldx + i];
      const float* wi = w + i * n_out;
#pragma omp simd
      for (int64_t j = 0; j < n_out; ++j) o[j] += xi * wi[j];
    }
  }
}

// KDA's chunked prefill for one (batch, head) sequence of q, k, v, g [T, D] (token stride `ld`), beta (stride
// `ld_beta`), and its FP32 state s [d_k, d_v], updated in place: engine/model/kda.py, `kda_chunked`, whose
// torch form is the reference and whose docstring derives the algebra. Per chunk of `chunk` tokens:
// gamma = cumsum(g); the scores A (strictly lower) and M (lower) inside blocks of `block` tokens pair by pair,
// between a block and the tokens after it through the block's last token b, e^(gamma_t - gamma_b) and
// e^(gamma_b - gamma_s) (every exponent <= 0, clamped at `lo`); then U by forward substitution from
// beta (V - (K e^gamma) S), O = (Q e^gamma) S + M U and S = e^gamma_end S + (K e^(gamma_end - gamma))^T U.
struct KdaScratch {
  std::vector<float> q, k, v, gamma, decay, a, m, u, kt, tmp;
  KdaScratch(int64_t c, int64_t dk, int64_t dv)
      : q(c * dk), k(c * dk), v(c * dv), gamma(c * dk), decay(c * dk), a(c * c), m(c * c), u(c * dv), kt(dk * c),
        tmp(c * dk) {}
};

void kda_sequence(const float* qp, const float* kp, const float* vp, const float* gp, const float* bp, int64_t ld,
                  int64_t ld_beta, float* op, float* s, int64_t tokens, int64_t dk, int64_t dv, int64_t chunk,
                  int64_t block, float lo, KdaScratch& w) {
  for (int64_t c0 = 0; c0 < tokens; c0 += chunk) {
    const int64_t n = std::min(chunk, tokens - c0);
    float *q = w.q.data(), *k = w.k.data(), *v = w.v.data(), *gam = w.gamma.data(), *dec = w.decay.data();
    float *a = w.a.data(), *m = w.m.data(), *u = w.u.data(), *kt = w.kt.data(), *tmp = w.tmp.data();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = (c0 + t) * ld;
      std::copy(qp + row, qp + row + dk, q + t * dk);
      std::copy(kp + row, kp + row + dk, k + t * dk);
      std::copy(vp + row, vp + row + dv, v + t * dv);
      const float* g = gp + row;
      float* gt = gam + t * dk;
      const float* prev = t ? gam + (t - 1) * dk : nullptr;
      for (int64_t d = 0; d < dk; ++d) gt[d] = (prev ? prev[d] : 0.f) + g[d];
    }
    std::fill(a, a + n * n, 0.f);
    std::fill(m, m + n * n, 0.f);
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      const int64_t b1 = std::min(n, b0 + block);
      for (int64_t t = b0; t < b1; ++t)
        for (int64_t s2 = b0; s2 <= t; ++s2) {
          float score_a, score_m;
          pair_scores(q + t * dk, k + t * dk, gam + t * dk, k + s2 * dk, gam + s2 * dk, dk, lo, &score_a, &score_m);
          if (s2 < t) a[t * n + s2] = score_a;
          m[t * n + s2] = score_m;
        }
      if (b1 == n) break;
      const float* boundary = gam + (b1 - 1) * dk;
      // The block's keys decayed to its last token: tmp[s] = k_s e^(gamma_b - gamma_s).
      for (int64_t s2 = b0; s2 < b1; ++s2) {
        float* row = tmp + (s2 - b0) * dk;
        for (int64_t d = 0; d < dk; ++d) row[d] = boundary[d] - gam[s2 * dk + d];
        exp_clamped(row, lo, dk, row);
        for (int64_t d = 0; d < dk; ++d) row[d] *= k[s2 * dk + d];
      }
      for (int64_t t = b1; t < n; ++t) {  // each later token decayed from the boundary: e^(gamma_t - gamma_b)
        float* e = dec + t * dk;
        for (int64_t d = 0; d < dk; ++d) e[d] = gam[t * dk + d] - boundary[d];
        exp_clamped(e, lo, dk, e);
        float* kd = kt;  // scratch rows: k_t e and q_t e
        float* qd = kt + dk;
        for (int64_t d = 0; d < dk; ++d) {
          kd[d] = k[t * dk + d] * e[d];
          qd[d] = q[t * dk + d] * e[d];
        }
        for (int64_t s2 = b0; s2 < b1; ++s2) {
          const float* ks = tmp + (s2 - b0) * dk;
          a[t * n + s2] = dot_f32(kd, ks, dk);
          m[t * n + s2] = dot_f32(qd, ks, dk);
        }
      }
    }
    // e^gamma_t (reading the entering state), k e^gamma and q e^gamma in place of k and q.
    exp_clamped(gam, lo, n * dk, dec);
    const float* end = gam + (n - 1) * dk;
    // U = beta (V - (K e^gamma) S), then forward substitution of (I + diag(beta) A).
    for (int64_t i = 0; i < n * dk; ++i) tmp[i] = k[i] * dec[i];
    rows_times(tmp, dk, n, s, dk, dv, u, dv, false);
    for (int64_t t = 0; t < n; ++t) {
      const float beta = bp[(c0 + t) * ld_beta];
      float* ut = u + t * dv;
      const float* vt = v + t * dv;
      for (int64_t j = 0; j < dv; ++j) ut[j] = beta * (vt[j] - ut[j]);
      if (t == 0) continue;
      float* row = kt;  // -beta A[t, :t] as the row that multiplies U[:t]
      for (int64_t s2 = 0; s2 < t; ++s2) row[s2] = -beta * a[t * n + s2];
      rows_times(row, t, 1, u, t, dv, ut, dv, true);
    }
    // O = (Q e^gamma) S + M U.
    for (int64_t i = 0; i < n * dk; ++i) tmp[i] = q[i] * dec[i];
    float* o = v;  // v is consumed: O is formed in its place, then written out
    rows_times(tmp, dk, n, s, dk, dv, o, dv, false);
    rows_times(m, n, n, u, n, dv, o, dv, true);
    for (int64_t t = 0; t < n; ++t) std::copy(o + t * dv, o + (t + 1) * dv, op + (c0 + t) * ld);
    // S = e^gamma_end S + (K e^(gamma_end - gamma))^T U, the keys transposed to rows of d.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < dk; ++d) tmp[t * dk + d] = end[d] - gam[t * dk + d];
    exp_clamped(tmp, lo, n * dk, tmp);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < dk; ++d) kt[d * n + t] = k[t * dk + d] * tmp[t * dk + d];
    exp_clamped(end, lo, dk, tmp);
    for (int64_t d = 0; d < dk; ++d) {
      float* row = s + d * dv;
      const float e = tmp[d];
      for (int64_t j = 0; j < dv; ++j) row[j] *= e;
    }
    rows_times(kt, n, dk, u, n, dv, s, dv, true);
  }
}

// q, k, g [B, T, H, d_k], v [B, T, H, d_v] FP32 (normalised and scaled as the model hands them), beta [B, T, H],
// state [B, H, d_k, d_v] FP32 (updated in place) -> o [B, T, H, d_v]. One task per (batch, head).
at::Tensor kda_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                     const at::Tensor& beta, at::Tensor state, int64_t chunk, int64_t block, double floor) {
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == g.sizes(), "q, k, g must be [B, T, H, d_k]");
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "v must be [B, T, H, d_v]");
  TORCH_CHECK(beta.dim() == 3 && beta.size(0) == q.size(0) && beta.size(1) == q.size(1) && beta.size(2) == q.size(2),
              "beta must be [B, T, H]");
  TORCH_CHECK(state.dim() == 4 && state.size(0) == q.size(0) && state.size(1) == q.size(2) &&
                  state.size(2) == q.size(3) && state.size(3) == v.size(3),
              "state must be [B, H, d_k, d_v]");
  for (const at::Tensor& t : {q, k, v, g, beta, state})
    TORCH_CHECK(t.scalar_type() == at::kFloat, "kda_chunk takes FP32 tensors");
  TORCH_CHECK(state.is_contiguous(), "the state must be contiguous (it is updated in place)");
  TORCH_CHECK(chunk > 0 && block > 0, "chunk and block must be positive");
  const int64_t batch = q.size(0), tokens = q.size(1), heads = q.size(2), dk = q.size(3), dv = v.size(3);
  TORCH_CHECK(dk == dv, "kda_chunk takes d_k == d_v (the layout of every KDA preset)");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), gc = g.contiguous();
  const at::Tensor bc = beta.contiguous();
  at::Tensor out = at::empty_like(vc);
  const int64_t ld = heads * dk, ld_beta = heads;
  const float *qp = qc.data_ptr<float>(), *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  const float *gp = gc.data_ptr<float>(), *bp = bc.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = state.data_ptr<float>();
  const float lo = static_cast<float>(floor);
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    KdaScratch scratch(chunk, dk, dv);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / heads, h = item % heads, first = b * tokens * ld + h * dk;
      kda_sequence(qp + first, kp + first, vp + first, gp + first, bp + b * tokens * heads + h, ld, ld_beta,
                   op + first, sp + item * dk * dv, tokens, dk, dv, chunk, block, lo, scratch);
    }
  });
  return out;
}

}  // namespace

// Denormal FP32 inputs and results taken as zero (MXCSR's DAZ and FTZ bits) on the calling thread and on
// each thread of its OpenMP team: a range of one index per thread puts one index on each.
void flush_denormals() {
#if defined(__x86_64__) || defined(_M_X64)
  const auto flush = [] { _mm_setcsr(_mm_getcsr() | 0x8040); };
  flush();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) { flush(); });
#endif
}

TORCH_LIBRARY(kimi_cpp_cpu, m) {
  m.def("flush_denormals() -> ()", &flush_denormals);
  m.def("mm(Tensor x, Tensor codes, Tensor scales, int group) -> Tensor");
  m.def("dense_mm(Tensor x, Tensor weight) -> Tensor");
  m.def("dense_grouped(Tensor x, Tensor gate, Tensor? up, Tensor route_ids) -> Tensor");
  m.def("kda_chunk(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) state, int chunk, int block, float floor) -> Tensor");
  m.def("grouped(Tensor x, Tensor codes, Tensor scales, Tensor route_ids, int group) -> Tensor");
  m.def(
      "grouped_swiglu(Tensor x, Tensor gate, Tensor gate_scales, Tensor up, Tensor up_scales, "
      "Tensor route_ids, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(kimi_cpp_cpu, CPU, m) {
  m.impl("mm", &w4a16_mm);
  m.impl("dense_mm", &dense_mm);
  m.impl("dense_grouped", &dense_grouped);
  m.impl("kda_chunk", &kda_chunk);
  m.impl("grouped", &w4a16_grouped);
  m.impl("grouped_swiglu", &w4a16_grouped_swiglu);
}
