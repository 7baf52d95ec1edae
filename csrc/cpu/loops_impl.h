// Included once per instruction set, after CPU_CAPABILITY (and the matching target pragma) is
// set: at::vec then compiles Vectorized<float> for that instruction set.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "ops/common.h"

namespace fused_amp::ops {
// The vector spellings of ops/common.h, declared before the op templates are instantiated.
using VecF = at::vec::Vectorized<float>;
using VecD = at::vec::Vectorized<double>;
static inline VecF sqrt_(const VecF& x) { return x.sqrt(); }
static inline VecF max_(const VecF& a, const VecF& b) { return at::vec::maximum(a, b); }
static inline VecF fma_(const VecF& a, const VecF& b, const VecF& c) { return at::vec::fmadd(a, b, c); }
static inline VecD fma_(const VecD& a, const VecD& b, const VecD& c) { return at::vec::fmadd(a, b, c); }
static inline VecF abs_(const VecF& x) { return x.abs(); }
static inline VecD abs_(const VecD& x) { return x.abs(); }
// at::vec::maximum propagates NaN, as the norm's max must
static inline VecF nan_max_(const VecF& a, const VecF& b) { return at::vec::maximum(a, b); }
static inline VecD nan_max_(const VecD& a, const VecD& b) { return at::vec::maximum(a, b); }
// never given a NaN (ops/quantize.h): the plain instruction, without at::vec's NaN handling
static inline VecF unit_min_(const VecF& a, const VecF& b) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_min_ps(a, b);
#elif defined(CPU_CAPABILITY_AVX512)
  return _mm512_min_ps(a, b);
#else
  return at::vec::minimum(a, b);
#endif
}
static inline VecF code_max_(const VecF& a, const VecF& b) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_max_ps(a, b);
#elif defined(CPU_CAPABILITY_AVX512)
  return _mm512_max_ps(a, b);
#else
  return at::vec::maximum(a, b);
#endif
}
static inline VecF rint_(const VecF& x) { return x.round(); }  // to nearest, ties to even
static inline VecF copysign_(const VecF& magnitude, const VecF& sign) {
  return magnitude.abs() | (sign & VecF(-0.f));
}
static inline VecF positive_(const VecF& x) { return (x > VecF(0.f)) & VecF(1.f); }
static inline VecF where_top_(const VecF& code, float top, const VecF& exact, const VecF& value) {
  return VecF::blendv(value, exact, code == VecF(top));
}
static inline VecF nonfinite_probe(const VecF& x) { return x * VecF(0.f); }
static inline VecD nonfinite_probe(const VecD& x) { return x * VecD(0.0); }
template <typename V>
static inline bool any_nan(const V& x) {
  typename V::value_type lanes[V::size()];
  x.store(lanes);
  for (int i = 0; i < V::size(); ++i) {
    if (lanes[i] != lanes[i]) return true;
  }
  return false;
}
}  // namespace fused_amp::ops

// The op templates must come after the vector spellings above to see them.
#include "cpu/loops.h"
#include "ops/grad_norm.h"
#include "ops/quantize.h"
#include "ops/rounding.h"
#include "ops/unscale.h"

namespace fused_amp::cpu::CPU_CAPABILITY {
namespace {

// The vector loops are made of these helpers: a call per vector (GCC keeps some out of line
// otherwise, the more the more loops it compiles) costs more than the conversions it does.
#define FA_VECTOR_HELPER inline __attribute__((always_inline))

using at::vec::Vectorized;
using ops::VecF;
template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
using OpVec = Vectorized<opmath_t<T>>;
// Elements per loop iteration: two op-math vectors, which is one vector of a 16-bit type.
template <typename T>
constexpr int64_t kStep = 2 * OpVec<T>::size();

// The bits of float vectors as GCC vectors of as many 32-bit lanes: their operators always
// inline, where at::vec's int32 vectors do not (GCC 12 keeps their AVX-512 operators as calls).
constexpr int kLanes = VecF::size();
using U32 = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
using U16 = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
using I16 = int16_t __attribute__((vector_size(2 * kLanes * sizeof(int16_t))));  // the words of a step's elements
static_assert(sizeof(U32) == sizeof(VecF), "a float vector and its bits must have the same size");

FA_VECTOR_HELPER U32 bits_of(const VecF& x) {
  U32 bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
FA_VECTOR_HELPER VecF float_of(const U32& bits) {
  VecF x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
template <uint32_t... J>
constexpr U32 lane_index(std::integer_sequence<uint32_t, J...>) { return U32{J...}; }
constexpr U32 kLaneIndex = lane_index(std::make_integer_sequence<uint32_t, kLanes>{});  // 0, 1, 2, ...

// Loads 2 * kLanes 16-bit values, zero-extended to the lanes of (a, b).
FA_VECTOR_HELPER void load_low16(const c10::BFloat16* p, U32& a, U32& b) {
  U16 low_a, low_b;
  std::memcpy(&low_a, p, sizeof low_a);
  std::memcpy(&low_b, p + kLanes, sizeof low_b);
  a = __builtin_convertvector(low_a, U32);
  b = __builtin_convertvector(low_b, U32);
}

// x rounded to the nearest bf16, ties to even, in the low 16 bits of each lane; a NaN gives all
// ones. The same bits as at::vec's AVX2 and AVX-512 conversions, which GCC leaves as calls per
// vector in the larger loops.
FA_VECTOR_HELPER U32 nearest_bf16_of(const VecF& x) {
  const U32 bits = bits_of(x);
  return ((bits + 0x7fffu + ((bits >> 16) & 1u)) | bits_of(x.isnan())) >> 16;
}

#if defined(CPU_CAPABILITY_AVX2)
// bf16 on AVX2, where at::vec converts with a shift per lane and a pack across 128-bit lanes:
// unpacks and packs work within 128-bit lanes, so the quarters of 16 elements go in order
// (0, 2, 1, 3) first, and one unpack puts each element's word over another's.
// Lanes 0-7 in a, 8-15 in b: the word of `high` over the word of `low`.
FA_VECTOR_HELPER void interleave16(__m256i low, __m256i high, __m256i& a, __m256i& b) {
  low = _mm256_permute4x64_epi64(low, 0xd8);
  high = _mm256_permute4x64_epi64(high, 0xd8);
  a = _mm256_unpacklo_epi16(low, high);
  b = _mm256_unpackhi_epi16(low, high);
}
#endif

// The lanes of (a, b), each holding a 16-bit value, as 2 * kLanes words in element order.
FA_VECTOR_HELPER I16 words_of(const U32& a, const U32& b) {
  I16 out;
#if defined(CPU_CAPABILITY_AVX2)
  // a pack works within 128-bit lanes: its quarters go back in order (0, 2, 1, 3); the values fit
  // in 16 bits, so it does not saturate
  __m256i lanes[2];
  const U32 in[2] = {a, b};
  std::memcpy(lanes, in, sizeof lanes);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lanes[0], lanes[1]), 0xd8);
  std::memcpy(&out, &packed, sizeof out);
#else
  const U16 halves[2] = {__builtin_convertvector(a, U16), __builtin_convertvector(b, U16)};
  std::memcpy(&out, halves, sizeof out);
#endif
  return out;
}

// Stores the lanes of (a, b), each holding a 16-bit value, to p[0, 2 * kLanes).
FA_VECTOR_HELPER void store_words(c10::BFloat16* p, const U32& a, const U32& b) {
  const I16 words = words_of(a, b);
  std::memcpy(p, &words, sizeof words);
}

template <typename T>
FA_VECTOR_HELPER void load2(const T* p, OpVec<T>& a, OpVec<T>& b) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    a = OpVec<T>::loadu(p);
    b = OpVec<T>::loadu(p + OpVec<T>::size());
#if defined(CPU_CAPABILITY_AVX2)
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    __m256i ai, bi;
    interleave16(_mm256_setzero_si256(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), ai, bi);
    a = _mm256_castsi256_ps(ai);
    b = _mm256_castsi256_ps(bi);
#endif
  } else {
    std::tie(a, b) = at::vec::convert_to_float<T>(Vectorized<T>::loadu(p));
  }
}

template <typename T>
FA_VECTOR_HELPER void store2(T* p, const OpVec<T>& a, const OpVec<T>& b) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    a.store(p);
    b.store(p + OpVec<T>::size());
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    store_words(p, nearest_bf16_of(a), nearest_bf16_of(b));
  } else {
    at::vec::convert_from_float<T>(a, b).store(p);
  }
}

using ops::Bits;

// The exponent field of each dtype (ops/unscale.h).
template <typename T>
constexpr Bits<T> exponent_of() {
  if constexpr (std::is_same_v<T, c10::Half>) return ops::kHalfExponent;
  else if constexpr (std::is_same_v<T, c10::BFloat16>) return ops::kBFloat16Exponent;
  else if constexpr (std::is_same_v<T, float>) return ops::kFloatExponent;
  else return ops::kDoubleExponent;
}

// True when some element is inf or NaN; reads the bits only, so it runs at memory speed.
template <typename T>
bool check_range(const T* x, int64_t n) {
  using I = Bits<T>;
  using V = Vectorized<I>;
  const I* bits = reinterpret_cast<const I*>(x);
  const V exponent(exponent_of<T>());
  V found0(0), found1(0);
  int64_t i = 0;
  for (; i + 2 * V::size() <= n; i += 2 * V::size()) {
    found0 = found0 | ops::exponent_all_ones(V::loadu(bits + i), exponent);
    found1 = found1 | ops::exponent_all_ones(V::loadu(bits + i + V::size()), exponent);
  }
  I tail = 0;
  for (; i < n; ++i) tail = tail | ops::exponent_all_ones(bits[i], exponent_of<T>());
  I lanes[V::size()];
  (found0 | found1).store(lanes);
  for (int j = 0; j < V::size(); ++j) tail = tail | lanes[j];
  return tail != 0;
}

// The partial value of a norm kind over x[0, n) of unscaled elements (x * inv_scale): op-math
// vectors accumulate blocks of kNormBlock elements, whose lanes are then folded into a double in
// lane order. The result depends on the range alone, so a fixed split of the tensors into ranges
// gives the same bits for any thread count.
template <typename T, ops::NormKind kKind>
double norm_range(const T* x, int64_t n, float inv_scale) {
  using V = OpVec<T>;
  using S = opmath_t<T>;
  constexpr int64_t kNormBlock = 2048;
  const ops::NormKind kind = kKind;
  const S inv_s = static_cast<S>(inv_scale);
  const V inv(inv_s);
  double total = 0.0;
  for (int64_t begin = 0; begin < n; begin += kNormBlock) {
    const int64_t end = std::min(n, begin + kNormBlock);
    V acc0(S(0)), acc1(S(0));
    int64_t i = begin;
    for (; i + kStep<T> <= end; i += kStep<T>) {
      V a, b;
      load2(x + i, a, b);
      acc0 = ops::norm_accumulate<kKind>(acc0, a * inv);
      acc1 = ops::norm_accumulate<kKind>(acc1, b * inv);
    }
    S lanes[V::size()];
    ops::norm_combine(kind, acc0, acc1).store(lanes);
    for (int j = 0; j < V::size(); ++j) total = ops::norm_combine(kind, total, static_cast<double>(lanes[j]));
    S tail = S(0);
    for (; i < end; ++i) tail = ops::norm_accumulate<kKind>(tail, static_cast<S>(x[i]) * inv_s);
    total = ops::norm_combine(kind, total, static_cast<double>(tail));
  }
  return total;
}

// ---- 16-bit storage of fp32 values (ops/rounding.h), on vectors -------------------------------
FA_VECTOR_HELPER void load_master_of(const c10::BFloat16* param, const c10::BFloat16* remainder, VecF& a, VecF& b) {
#if defined(CPU_CAPABILITY_AVX2)
  // the param less the carry its rounding added (the remainder's top bit), over the remainder
  const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(remainder));
  const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(param));
  __m256i ai, bi;
  interleave16(r, _mm256_sub_epi16(p, _mm256_srli_epi16(r, 15)), ai, bi);
  a = _mm256_castsi256_ps(ai);
  b = _mm256_castsi256_ps(bi);
#else
  U32 p0, p1, r0, r1;
  load_low16(param, p0, p1);
  load_low16(remainder, r0, r1);
  auto join = [](const U32& p, const U32& r) {  // the remainder's top bit: the param rounded up
    return float_of(((p - (r >> 15)) << 16) | r);
  };
  a = join(p0, r0);
  b = join(p1, r1);
#endif
}

// Stores fp32 values that are bf16 values already (low halves zero) as bf16: their high halves,
// without the rounding of a conversion.
FA_VECTOR_HELPER void store_exact_bf16(c10::BFloat16* p, const VecF& a, const VecF& b) {
  store_words(p, bits_of(a) >> 16, bits_of(b) >> 16);
}

// ops::round_bits_to_bf16 on a vector: x rounded to a bf16 value by adding `addend` to its
// magnitude bits; a NaN keeps its high half, made quiet.
FA_VECTOR_HELPER VecF round_to_bf16(const VecF& x, const U32& addend) {
  const U32 bits = bits_of(x);
  return VecF::blendv(float_of((bits + addend) & 0xffff0000u), float_of((bits | 0x400000u) & 0xffff0000u), x.isnan());
}

FA_VECTOR_HELPER void store_master_as(c10::BFloat16* param, c10::BFloat16* remainder, const VecF& a, const VecF& b) {
#if defined(CPU_CAPABILITY_AVX2)
  if (_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)) == 0) {  // no NaN: split on 16-bit lanes
    // each 128-bit lane to the low words of its 4 elements, then their high words
    const __m256i by_half = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                             0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i sa = _mm256_shuffle_epi8(_mm256_castps_si256(a), by_half);
    const __m256i sb = _mm256_shuffle_epi8(_mm256_castps_si256(b), by_half);
    // quarters (a 0-3, b 0-3 | a 4-7, b 4-7) in order (0, 2, 1, 3): elements 0-15
    const __m256i low = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(sa, sb), 0xd8);
    const __m256i high = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(sa, sb), 0xd8);
    // to nearest, ties away from zero: the high half goes up when the low half is 0x8000 or more
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(param), _mm256_add_epi16(high, _mm256_srli_epi16(low, 15)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(remainder), low);
    return;
  }
#endif
  const U32 half_ulp = U32{} + 0x8000u;  // to nearest, ties away from zero (ops::param_bits_of_master)
  store_exact_bf16(param, round_to_bf16(a, half_ulp), round_to_bf16(b, half_ulp));
  store_words(remainder, bits_of(a) & 0xffffu, bits_of(b) & 0xffffu);
}

// ---- bf16 grads times a power of two ----------------------------------------------------------
// The scaler's 1/scale is a power of two, 2^k. A bf16 grad times it is then exact (so rounding
// it changes nothing) unless the product leaves the normal range, and the product's bits are the
// grad's with k added to the exponent field: one 16-bit add per element, where the general path
// converts, multiplies and rounds.
struct ExponentShift {
  bool exact = false;  // the multiplier is 2^k, and some bf16 values times it are normal
  int16_t add = 0;     // k in the exponent field
  int16_t above = 0;   // the magnitude bits of the values whose product is normal lie
  int16_t below = 0;   // strictly between these two
};

inline ExponentShift exponent_shift_of(float multiplier) {
  ExponentShift s;
  int e = 0;
  if (std::frexp(multiplier, &e) != 0.5f) return s;  // not a positive power of two, or not finite
  const int k = e - 1;
  const int lowest = std::max(1, 1 - k), highest = std::min(254, 254 - k);  // exponent fields
  if (lowest > highest) return s;
  s.exact = true;
  s.add = static_cast<int16_t>(k * 128);
  s.above = static_cast<int16_t>(lowest * 128 - 1);
  s.below = static_cast<int16_t>(highest * 128 + 128);
  return s;
}

// The shift of a loop that multiplies T values by `multiplier` in place (`write`): bf16 only.
template <typename T>
inline ExponentShift exponent_shift_of(float multiplier, bool write) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (write) return exponent_shift_of(multiplier);
  }
  return {};
}

// True when every lane of a comparison's result is set.
FA_VECTOR_HELPER bool all_lanes(const I16& mask) {
#if defined(CPU_CAPABILITY_AVX2)
  __m256i m;
  std::memcpy(&m, &mask, sizeof m);
  return _mm256_testc_si256(m, _mm256_set1_epi32(-1));
#elif defined(CPU_CAPABILITY_AVX512)
  __m512i m;
  std::memcpy(&m, &mask, sizeof m);
  return _mm512_movepi16_mask(m) == 0xffffffffu;
#else
  uint64_t words[sizeof(I16) / sizeof(uint64_t)];
  std::memcpy(words, &mask, sizeof words);
  uint64_t all = ~uint64_t{0};
  for (const uint64_t w : words) all &= w;
  return all == ~uint64_t{0};
#endif
}

// Multiplies the 2 * kLanes bf16 values at p by the shift's 2^k in place when every product is
// exact (zero or normal) and returns true; otherwise writes nothing and returns false.
FA_VECTOR_HELPER bool scale_exactly(c10::BFloat16* p, const ExponentShift& s) {
  I16 x;
  std::memcpy(&x, p, sizeof x);
  const I16 magnitude = x & 0x7fff;
  const I16 normal = (magnitude > s.above) & (magnitude < s.below);
  if (!all_lanes(normal | (magnitude == 0))) return false;
  x += normal & s.add;
  std::memcpy(p, &x, sizeof x);
  return true;
}

// x[0, n) times inv_scale in place (write), or only checked; true when some element is inf or NaN.
template <typename T>
bool unscale_range(T* x, int64_t n, opmath_t<T> inv_scale, bool write) {
  if (!write) return check_range(x, n);
  using V = OpVec<T>;
  using S = opmath_t<T>;
  const V inv(inv_scale);
  V nonfinite(S(0));
  const ExponentShift shift = exponent_shift_of<T>(static_cast<float>(inv_scale), true);
  int64_t i = 0;
  for (; i + kStep<T> <= n; i += kStep<T>) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (shift.exact && scale_exactly(x + i, shift)) continue;  // all finite
    }
    V a, b;
    load2(x + i, a, b);
    store2(x + i, ops::unscale(a, inv, nonfinite), ops::unscale(b, inv, nonfinite));
  }
  S tail_nonfinite = S(0);
  for (; i < n; ++i) {
    x[i] = static_cast<T>(ops::unscale(static_cast<S>(x[i]), inv_scale, tail_nonfinite));
  }
  return ops::any_nan(nonfinite) || ops::any_nan(tail_nonfinite);
}

// ops::rounding_bits of 2 * kLanes consecutive elements from `index` (lowbias32 on lanes).
FA_VECTOR_HELPER void rounding_bits2(uint32_t key, int64_t index, U32& a, U32& b) {
  auto mix = [](U32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
  };
  const U32 first = kLaneIndex + static_cast<uint32_t>(index);
  a = mix(key ^ first);
  b = mix(key ^ (first + kLanes));
}

// ---- the step loops ----------------------------------------------------------------------

// The fp32 value of the parameter: the master, or the param joined with its remainder, or the
// param itself.
template <typename T>
FA_VECTOR_HELPER void load_value(const UpdateRange<T>& r, int64_t i, VecF& a, VecF& b) {
  if (r.master) {
    load2(r.master + i, a, b);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (r.remainder) return load_master_of(r.param + i, r.remainder + i, a, b);
    load2(r.param + i, a, b);
  } else {
    load2(r.param + i, a, b);
  }
}

// Half params that have an fp32 master are written by the step but not read: AVX2/AVX-512
// builds store them with streaming stores, which skip reading in the lines they overwrite (2 of
// the 30 bytes per parameter an Adam step would move). These stores need the vector's
// alignment, so the elements before it take the scalar path.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <typename T>
constexpr bool kCanStream = !std::is_same_v<T, float>;
template <typename T>
FA_VECTOR_HELPER void stream_store2(T* p, const VecF& a, const VecF& b) {
#if defined(CPU_CAPABILITY_AVX512)
  using Words = __m512i;
#else
  using Words = __m256i;
#endif
  Words words;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const I16 bf16 = words_of(nearest_bf16_of(a), nearest_bf16_of(b));
    std::memcpy(&words, &bf16, sizeof words);
  } else {
    words = at::vec::convert_from_float<T>(a, b);
  }
#if defined(CPU_CAPABILITY_AVX512)
  _mm512_stream_si512(reinterpret_cast<Words*>(p), words);
#else
  _mm256_stream_si256(reinterpret_cast<Words*>(p), words);
#endif
}
inline void stream_fence() { _mm_sfence(); }
#else
template <typename T>
constexpr bool kCanStream = false;
template <typename T>
FA_VECTOR_HELPER void stream_store2(T*, const VecF&, const VecF&) {}
inline void stream_fence() {}
#endif

template <typename T>
FA_VECTOR_HELPER void store_value(const UpdateRange<T>& r, int64_t i, const VecF& a, const VecF& b, bool stream) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (r.remainder) return store_master_as(r.param + i, r.remainder + i, a, b);
  }
  if (r.master) store2(r.master + i, a, b);
  if constexpr (kCanStream<T>) {
    if (stream) return stream_store2(r.param + i, a, b);
  }
  store2(r.param + i, a, b);
}

// The grad as the GradScaler leaves it after a step: unscaled, in its own dtype.
template <typename T>
FA_VECTOR_HELPER void store_unscaled_grad(const UpdateRange<T>& r, int64_t i, const VecF& g0, const VecF& g1,
                                          float inv_scale, const ExponentShift& shift) {
  if (!r.write_grad) return;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (shift.exact && scale_exactly(r.grad + i, shift)) return;
  }
  store2(r.grad + i, g0 * VecF(inv_scale), g1 * VecF(inv_scale));
}

// A state vector pair to its storage: fp32 as it is, bf16 rounded to nearest even (torch's
// conversion) or, with `random` (16 random bits per lane), stochastically.
template <typename S>
FA_VECTOR_HELPER void store_state2(S* p, const VecF& a, const VecF& b, const U32* random) {
  if constexpr (std::is_same_v<S, c10::BFloat16>) {
    if (random) return store_exact_bf16(p, round_to_bf16(a, random[0]), round_to_bf16(b, random[1]));
  }
  store2(p, a, b);
}

template <typename T>
inline float grad_at(const UpdateRange<T>& r, int64_t i, float inv_scale) {
  const float g = static_cast<float>(r.grad[i]);
  if (r.write_grad) r.grad[i] = static_cast<T>(g * inv_scale);
  return g;
}

template <typename T>
inline float value_at(const UpdateRange<T>& r, int64_t i) {
  if (r.master) return r.master[i];
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (r.remainder) return ops::float_of(ops::master_of(r.param[i].x, r.remainder[i].x));
  }
  return static_cast<float>(r.param[i]);
}

template <typename T>
inline void set_value_at(const UpdateRange<T>& r, int64_t i, float v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (r.remainder) {
      r.param[i].x = ops::param_bits_of_master(ops::bits_of(v));
      r.remainder[i].x = ops::remainder_of_master(ops::bits_of(v));
      return;
    }
  }
  if (r.master) r.master[i] = v;
  r.param[i] = static_cast<T>(v);
}

template <typename S>
inline float state_at(const S* p, int64_t i) {
  return static_cast<float>(p[i]);
}

// One state element to its storage (see store_state2); `random16` is used only when stochastic.
template <typename S>
inline void set_state_at(S* p, int64_t i, float v, bool stochastic, uint32_t random16) {
  if constexpr (std::is_same_v<S, c10::BFloat16>) {
    if (stochastic) v = ops::stochastic_round_bf16(v, random16);
  }
  p[i] = static_cast<S>(v);
}

// The random bits of the vector at i, split for the two states: [0, 1] the low 16 bits of each
// lane, [2, 3] the high 16 (null when the range rounds to nearest).
template <typename T>
FA_VECTOR_HELPER const U32* vector_rounding_bits(const UpdateRange<T>& r, int64_t i, U32 (&bits)[4]) {
  if (!r.stochastic) return nullptr;
  rounding_bits2(r.round_key, r.first + i, bits[0], bits[1]);
  bits[2] = bits[0] >> 16;
  bits[3] = bits[1] >> 16;
  bits[0] &= 0xffffu;
  bits[1] &= 0xffffu;
  return bits;
}

// Runs vector_loop(begin, end, stream) over the whole vectors of the range and scalar_step(i)
// over the elements before the first aligned vector (when streaming) and after the last whole
// one. Both compute the same IEEE operations, so where an element falls does not change its
// result.
template <typename T, class VectorLoop, class ScalarStep>
void update_range(const UpdateRange<T>& r, VectorLoop&& vector_loop, ScalarStep&& scalar_step) {
  const bool stream = kCanStream<T> && r.master != nullptr && r.may_stream;
  int64_t i = 0;
  if (stream) {
    constexpr int64_t kBytes = kStep<T> * sizeof(T);
    const int64_t misaligned = reinterpret_cast<uintptr_t>(r.param) % kBytes;
    const int64_t head = misaligned ? (kBytes - misaligned) / static_cast<int64_t>(sizeof(T)) : 0;
    for (; i < std::min(head, r.n); ++i) scalar_step(i);
  }
  const int64_t vectors_end = i + (r.n - i) / kStep<T> * kStep<T>;
  if (vectors_end > i) vector_loop(i, vectors_end, stream);
  for (i = std::max(i, vectors_end); i < r.n; ++i) scalar_step(i);
  if (stream) stream_fence();  // order the streaming stores before the threads join
}

// The vector loops take the range and the coefficients by value, as their own copies: no store
// in the loop can alias those (vector stores may alias any memory that a pointer reaches), so
// pointers and coefficients stay in registers instead of being reloaded for every vector.
#define FA_VECTOR_LOOP __attribute__((noinline))

// The coefficients of the usual runs, with their options fixed at compile time (no amsgrad,
// beta1 >= 0.5, no weight decay or AdamW's): their loop has no branch on an option.
template <bool kDecoupledWeightDecay>
struct UsualAdamCoeffs : ops::AdamCoeffs {
  static constexpr bool has_weight_decay = kDecoupledWeightDecay;
  static constexpr bool decoupled_weight_decay = kDecoupledWeightDecay;
  static constexpr bool amsgrad = false;
  static constexpr bool lerp_from_start = true;
  explicit UsualAdamCoeffs(const ops::AdamCoeffs& c) : ops::AdamCoeffs(c) {}
};

// C: ops::AdamCoeffs, or UsualAdamCoeffs
template <typename T, typename S, typename C>
FA_VECTOR_LOOP void adam_vectors(const UpdateRange<T> r, const C c, int64_t begin, int64_t end, bool stream) {
  S* const m = static_cast<S*>(r.exp_avg);
  S* const v = static_cast<S*>(r.exp_avg_sq);
  S* const vmax = static_cast<S*>(r.aux);
  const ExponentShift shift = exponent_shift_of<T>(c.inv_scale, r.write_grad);
  for (int64_t i = begin; i < end; i += kStep<T>) {
    VecF p0, p1, g0, g1, m0, m1, v0, v1, vmax0(0.f), vmax1(0.f);
    load_value(r, i, p0, p1);
    load2(r.grad + i, g0, g1);
    load2(m + i, m0, m1);
    load2(v + i, v0, v1);
    if (c.amsgrad) load2(vmax + i, vmax0, vmax1);
    store_unscaled_grad(r, i, g0, g1, c.inv_scale, shift);
    ops::adam_update(p0, g0, m0, v0, vmax0, c);
    ops::adam_update(p1, g1, m1, v1, vmax1, c);
    store_value(r, i, p0, p1, stream);
    U32 bits[4];
    const U32* random = vector_rounding_bits(r, i, bits);
    store_state2(m + i, m0, m1, random);
    store_state2(v + i, v0, v1, random ? random + 2 : nullptr);
    if (c.amsgrad) store_state2(vmax + i, vmax0, vmax1, random ? random + 2 : nullptr);
  }
}

template <typename T, typename S, typename C>
void adam_range_with(const UpdateRange<T>& r, const C& c) {
  S* const m = static_cast<S*>(r.exp_avg);
  S* const v = static_cast<S*>(r.exp_avg_sq);
  S* const vmax = static_cast<S*>(r.aux);
  update_range(
      r, [&](int64_t begin, int64_t end, bool stream) { adam_vectors<T, S>(r, c, begin, end, stream); },
      [&](int64_t i) {
        float p = value_at(r, i), mi = state_at(m, i), vi = state_at(v, i);
        float vmaxi = c.amsgrad ? state_at(vmax, i) : 0.f;
        ops::adam_update(p, grad_at(r, i, c.inv_scale), mi, vi, vmaxi, c);
        set_value_at(r, i, p);
        const uint32_t bits = r.stochastic ? ops::rounding_bits(r.round_key, r.first + i) : 0u;
        set_state_at(m, i, mi, r.stochastic, bits & 0xffffu);
        set_state_at(v, i, vi, r.stochastic, bits >> 16);
        if (c.amsgrad) set_state_at(vmax, i, vmaxi, r.stochastic, bits >> 16);
      });
}

template <typename T, typename S>
void adam_range(const UpdateRange<T>& range, const ops::AdamCoeffs& c) {
  if (!c.amsgrad && c.lerp_from_start) {
    if (!c.has_weight_decay) return adam_range_with<T, S>(range, UsualAdamCoeffs<false>(c));
    if (c.decoupled_weight_decay) return adam_range_with<T, S>(range, UsualAdamCoeffs<true>(c));
  }
  adam_range_with<T, S>(range, c);
}

template <typename T, typename S>
FA_VECTOR_LOOP void sgd_vectors(const UpdateRange<T> r, const ops::SgdCoeffs c, int64_t begin, int64_t end,
                                bool stream) {
  S* const buf = static_cast<S*>(r.aux);
  const ExponentShift shift = exponent_shift_of<T>(c.inv_scale, r.write_grad);
  for (int64_t i = begin; i < end; i += kStep<T>) {
    VecF p0, p1, g0, g1, b0(0.f), b1(0.f);
    load_value(r, i, p0, p1);
    load2(r.grad + i, g0, g1);
    if (buf && !c.first_step) load2(buf + i, b0, b1);
    store_unscaled_grad(r, i, g0, g1, c.inv_scale, shift);
    ops::sgd_update(p0, g0, b0, c);
    ops::sgd_update(p1, g1, b1, c);
    store_value(r, i, p0, p1, stream);
    U32 bits[4];
    if (buf) store_state2(buf + i, b0, b1, vector_rounding_bits(r, i, bits));
  }
}

template <typename T, typename S>
void sgd_range(const UpdateRange<T>& r, const ops::SgdCoeffs& c) {
  S* const buf = static_cast<S*>(r.aux);
  update_range(
      r, [&](int64_t begin, int64_t end, bool stream) { sgd_vectors<T, S>(r, c, begin, end, stream); },
      [&](int64_t i) {
        float p = value_at(r, i), b = (buf && !c.first_step) ? state_at(buf, i) : 0.f;
        ops::sgd_update(p, grad_at(r, i, c.inv_scale), b, c);
        set_value_at(r, i, p);
        if (!buf) return;
        const uint32_t bits = r.stochastic ? ops::rounding_bits(r.round_key, r.first + i) : 0u;
        set_state_at(buf, i, b, r.stochastic, bits & 0xffffu);
      });
}

#include "cpu/quantized_state.h"

}  // namespace

const Loops& loops() {
  using BF16 = c10::BFloat16;
  static const Loops table{
      C10_STRINGIZE(CPU_CAPABILITY),
      unscale_range<float>,
      unscale_range<double>,
      unscale_range<c10::Half>,
      unscale_range<BF16>,
      {norm_range<float, ops::NormKind::Inf>, norm_range<float, ops::NormKind::L1>,
       norm_range<float, ops::NormKind::L2>},
      {norm_range<double, ops::NormKind::Inf>, norm_range<double, ops::NormKind::L1>,
       norm_range<double, ops::NormKind::L2>},
      {norm_range<c10::Half, ops::NormKind::Inf>, norm_range<c10::Half, ops::NormKind::L1>,
       norm_range<c10::Half, ops::NormKind::L2>},
      {norm_range<BF16, ops::NormKind::Inf>, norm_range<BF16, ops::NormKind::L1>,
       norm_range<BF16, ops::NormKind::L2>},
      {adam_range<float, float>, adam_range<float, BF16>, adam_range_q8<float>},
      {adam_range<c10::Half, float>, adam_range<c10::Half, BF16>, adam_range_q8<c10::Half>},
      {adam_range<BF16, float>, adam_range<BF16, BF16>, adam_range_q8<BF16>},
      {sgd_range<float, float>, sgd_range<float, BF16>, sgd_range_q8<float>},
      {sgd_range<c10::Half, float>, sgd_range<c10::Half, BF16>, sgd_range_q8<c10::Half>},
      {sgd_range<BF16, float>, sgd_range<BF16, BF16>, sgd_range_q8<BF16>},
  };
  return table;
}

}  // namespace fused_amp::cpu::CPU_CAPABILITY
