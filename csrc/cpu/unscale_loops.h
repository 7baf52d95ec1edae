// The loops of unscale_, non_finite_check_ and grad_norm_ (the overflow check and the norm),
// and the exact power-of-two scaling of bf16 grads that the step loops also use. Part of
// cpu/loops_impl.h.
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
    x[i] = element_of<T>(ops::unscale(static_cast<S>(x[i]), inv_scale, tail_nonfinite));
  }
  return ops::any_nan(nonfinite) || ops::any_nan(tail_nonfinite);
}
