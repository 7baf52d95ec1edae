// 8-bit blockwise state on the CPU (ops/quantize.h), a storage kind around the fp32-state step
// loops: each block of a range is dequantized into stack buffers, stepped by the fp32-state loop
// exactly as fp32 state would be (so, from the same dequantized state, the masters are bitwise
// those of the fp32-state step), and quantized again with the block's new absmax. Part of
// cpu/loops_impl.h (included once per instruction set, after the step loops).

// A state's codes as a vector of floats and back, with the ISA's widening and narrowing
// instructions (GCC's vector conversions between 8- and 32-bit lanes go lane by lane).
using F32 = float __attribute__((vector_size(kLanes * sizeof(float))));
using I32 = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using I8 = int8_t __attribute__((vector_size(kLanes)));

template <bool kSigned>
FA_VECTOR_HELPER VecF load_codes(const uint8_t* p) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
#elif defined(CPU_CAPABILITY_AVX512)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(kSigned ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
#else
  F32 f;
  if constexpr (kSigned) {
    I8 c;
    std::memcpy(&c, p, sizeof c);
    f = __builtin_convertvector(c, F32);
  } else {
    U8 c;
    std::memcpy(&c, p, sizeof c);
    f = __builtin_convertvector(c, F32);
  }
  VecF x;
  std::memcpy(&x, &f, sizeof x);
  return x;
#endif
}

// The codes are integral already, so the conversion to int32 is exact; narrowing them to bytes
// needs the ISA's packs (GCC narrows a vector conversion lane by lane).
template <bool kSigned>
FA_VECTOR_HELPER void store_codes(uint8_t* p, const VecF& code) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m256i whole = _mm256_cvttps_epi32(code);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(whole), _mm256_extracti128_si256(whole, 1));
  // codes fit the saturating packs: [-127, 127] signed, [0, 255] unsigned
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), kSigned ? _mm_packs_epi16(words, words) : _mm_packus_epi16(words, words));
#elif defined(CPU_CAPABILITY_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(code)));  // low bytes
#else
  F32 f;
  std::memcpy(&f, &code, sizeof f);
  const I32 whole = __builtin_convertvector(f, I32);
  if constexpr (kSigned) {
    const I8 c = __builtin_convertvector(whole, I8);
    std::memcpy(p, &c, sizeof c);
  } else {
    const U8 c = __builtin_convertvector(whole, U8);
    std::memcpy(p, &c, sizeof c);
  }
#endif
}

// Two vectors of codes at once: on AVX2 one 256-bit pack of both, in place of two 128-bit packs.
template <bool kSigned>
FA_VECTOR_HELPER void store_codes2(uint8_t* p, const VecF& a, const VecF& b) {
#if defined(CPU_CAPABILITY_AVX2)
  // the pack works within 128-bit lanes: its words come as a0-3 b0-3 | a4-7 b4-7, put back in order
  const __m256i words = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(_mm256_cvttps_epi32(a), _mm256_cvttps_epi32(b)), 0xd8);
  const __m128i low = _mm256_castsi256_si128(words), high = _mm256_extracti128_si256(words, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), kSigned ? _mm_packs_epi16(low, high) : _mm_packus_epi16(low, high));
#else
  store_codes<kSigned>(p, a);
  store_codes<kSigned>(p + kLanes, b);
#endif
}

inline float code_value(const uint8_t* p, int64_t i, bool is_signed) {
  return is_signed ? static_cast<float>(static_cast<int8_t>(p[i])) : static_cast<float>(p[i]);
}

// The n (<= kQuantBlock) values of one block, from its codes and absmax.
template <bool kSigned>
void dequantize_block(const uint8_t* codes, float absmax, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF c = load_codes<kSigned>(codes + i);
    (kSigned ? ops::dequantize_signed(c, absmax) : ops::dequantize_unsigned(c, absmax)).store(out + i);
  }
  for (; i < n; ++i) {
    const float c = code_value(codes, i, kSigned);
    out[i] = kSigned ? ops::dequantize_signed(c, absmax) : ops::dequantize_unsigned(c, absmax);
  }
}

// The largest |x| of a block, NaN when some x is NaN. The bits of |x| order as their values do,
// NaNs above inf, so one integer max per vector finds both (no compare-and-blend chain).
inline float block_absmax(const float* x, int64_t n) {
  constexpr uint32_t kMagnitude = 0x7fffffffu, kInf = 0x7f800000u;
  uint32_t top = 0;
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#if defined(CPU_CAPABILITY_AVX2)
  using Bits = __m256i;
  const auto magnitude_bits = [](const float* p) { return _mm256_castps_si256(VecF::loadu(p).abs()); };
  const auto max_bits = [](Bits a, Bits b) { return _mm256_max_epu32(a, b); };
  Bits acc0 = _mm256_setzero_si256(), acc1 = acc0;
#else
  using Bits = __m512i;
  const auto magnitude_bits = [](const float* p) { return _mm512_castps_si512(VecF::loadu(p).abs()); };
  const auto max_bits = [](Bits a, Bits b) { return _mm512_max_epu32(a, b); };
  Bits acc0 = _mm512_setzero_si512(), acc1 = acc0;
#endif
  // two accumulators: with one, the max's latency rather than its throughput would set the pace
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = max_bits(acc0, magnitude_bits(x + i));
    acc1 = max_bits(acc1, magnitude_bits(x + i + kLanes));
  }
  uint32_t lanes[kLanes];
  const Bits both = max_bits(acc0, acc1);
  std::memcpy(lanes, &both, sizeof lanes);
  for (const uint32_t a : lanes) top = std::max(top, a);
#endif
  for (; i < n; ++i) top = std::max(top, c10::bit_cast<uint32_t>(x[i]) & kMagnitude);
  return top > kInf ? std::numeric_limits<float>::quiet_NaN() : c10::bit_cast<float>(top);
}

// ops::rounding_bits of the n elements from `index` of a tensor: computed once per element for
// all of its states (each takes its half, ops::code_random15).
inline void fill_rounding_bits(uint32_t key, int64_t index, int64_t n, uint32_t* out) {
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    U32 a, b;
    rounding_bits2(key, index + i, a, b);
    std::memcpy(out + i, &a, sizeof a);
    std::memcpy(out + i + kLanes, &b, sizeof b);
  }
  for (; i < n; ++i) out[i] = ops::rounding_bits(key, index + i);
}

// ops::code_random15 of the random bits of the element at i (V = float) or of the kLanes
// elements from i (V = VecF), as floats.
template <bool kSigned, typename V>
FA_VECTOR_HELPER V code_random(const uint32_t* random, int64_t i) {
  if constexpr (std::is_same_v<V, float>) {
    return static_cast<float>(ops::code_random15(random[i], kSigned));
  } else {
    U32 bits;
    std::memcpy(&bits, random + i, sizeof bits);
    const F32 f = __builtin_convertvector(__builtin_convertvector(ops::code_random15(bits, kSigned), I32), F32);
    VecF x;
    std::memcpy(&x, &f, sizeof x);
    return x;
  }
}

// The codes of a block of n values, given 1 / absmax: rounded to nearest, or stochastically
// with the elements' random bits.
template <bool kSigned, bool kStochastic>
void code_block(const float* x, int64_t n, float inv, const uint32_t* random, uint8_t* codes) {
  const auto code_of = [inv, random](const auto& v, int64_t i) {
    if constexpr (kStochastic) {
      const auto r = code_random<kSigned, std::decay_t<decltype(v)>>(random, i);
      return kSigned ? ops::quantize_signed_stochastic(v, inv, r) : ops::quantize_unsigned_stochastic(v, inv, r);
    } else {
      return kSigned ? ops::quantize_signed(v, inv) : ops::quantize_unsigned(v, inv);
    }
  };
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    store_codes2<kSigned>(codes + i, code_of(VecF::loadu(x + i), i), code_of(VecF::loadu(x + i + kLanes), i + kLanes));
  }
  if (i + kLanes <= n) {
    store_codes<kSigned>(codes + i, code_of(VecF::loadu(x + i), i));
    i += kLanes;
  }
  for (; i < n; ++i) codes[i] = static_cast<uint8_t>(static_cast<int>(code_of(x[i], i)));  // modulo 256: an int8 code's bits
}

// Codes and absmax of a block of n values; with `random` (the elements' ops::rounding_bits) the
// codes round stochastically.
template <bool kSigned>
void quantize_block(const float* x, int64_t n, uint8_t* codes, float* absmax_out, const uint32_t* random) {
  const float absmax = block_absmax(x, n);
  *absmax_out = ops::stored_absmax(absmax);
  if (!ops::codes_block(absmax)) {
    std::memset(codes, 0, n);
    return;
  }
  const float inv = 1.f / absmax;
  if (random) return code_block<kSigned, true>(x, n, inv, random, codes);
  code_block<kSigned, false>(x, n, inv, nullptr, codes);
}

// One quantized state of a range: its codes, its absmax per block (from the range's first
// block), whether its map is the signed one, and the range's state that holds it.
struct QuantizedState {
  uint8_t* codes;
  float* absmax;
  bool is_signed;
  int slot;
};

// Quant blocks stepped per call of the fp32-state loop: its buffers (3 states of 4 blocks, 12 KB,
// and 4 KB of random bits)
// stay in L1, and the call's fixed cost is spread over 1,024 elements.
constexpr int64_t kBlocksPerStep = 4;
constexpr int64_t kStepElements = kBlocksPerStep * ops::kQuantBlock;

// The blocks of state s in its elements [b, b + n) to fp32 values, and back.
inline void dequantize_blocks(const QuantizedState& s, int64_t b, int64_t n, float* out) {
  const auto block = s.is_signed ? dequantize_block<true> : dequantize_block<false>;
  for (int64_t q = 0; q < n; q += ops::kQuantBlock) {
    block(s.codes + b + q, s.absmax[(b + q) / ops::kQuantBlock], std::min(ops::kQuantBlock, n - q), out + q);
  }
}

// With `random` (the random bits of elements [b, b + n)) the codes round stochastically.
inline void quantize_blocks(const QuantizedState& s, int64_t b, int64_t n, const float* x, const uint32_t* random) {
  const auto block = s.is_signed ? quantize_block<true> : quantize_block<false>;
  for (int64_t q = 0; q < n; q += ops::kQuantBlock) {
    block(x + q, std::min(ops::kQuantBlock, n - q), s.codes + b + q, s.absmax + (b + q) / ops::kQuantBlock,
          random ? random + q : nullptr);
  }
}

// Runs `fp32_step(sub)` over r in parts of kStepElements, where sub is the part of r with its
// quantized states (the `count` of `states`) replaced by fp32 buffers holding their dequantized
// values. r.first is a multiple of kQuantBlock: cpu_ops.cpp gives each block to one range.
template <typename T, class Fp32Step>
void quantized_blocks(const UpdateRange<T>& r, const QuantizedState* states, int count, Fp32Step&& fp32_step) {
  alignas(64) float buffers[ops::kMaxStates][kStepElements];
  alignas(64) uint32_t random[kStepElements];  // stochastic codes: the random bits of the part's elements
  for (int64_t b = 0; b < r.n; b += kStepElements) {
    const int64_t n = std::min<int64_t>(kStepElements, r.n - b);
    UpdateRange<T> sub = part_of(r, b, n);
    sub.may_stream = false;
    for (int k = 0; k < count; ++k) {
      dequantize_blocks(states[k], b, n, buffers[k]);
      sub.state[states[k].slot] = buffers[k];
    }
    fp32_step(sub);
    if (r.stochastic_codes && count > 0) fill_rounding_bits(r.round_key, r.first + b, n, random);
    for (int k = 0; k < count; ++k) quantize_blocks(states[k], b, n, buffers[k], r.stochastic_codes ? random : nullptr);
  }
}

// The quantized state of r's state[slot], with its absmax row.
template <typename T>
QuantizedState quantized_state(const UpdateRange<T>& r, int slot, int row, bool is_signed) {
  return {static_cast<uint8_t*>(r.state[slot]), r.absmax + row * r.absmax_row_stride + r.first / ops::kQuantBlock,
          is_signed, slot};
}

// An optimizer's step over 8-bit state: the states it keeps take the absmax rows 0, 1, ... in
// state order, each with its descriptor's map.
template <class Opt, typename T>
void step_range_q8(const UpdateRange<T>& r, const void* coeffs) {
  const auto& c = *static_cast<const typename Opt::Coeffs*>(coeffs);
  QuantizedState states[Opt::kStates];
  int count = 0;
  for (int k = 0; k < Opt::kStates; ++k) {
    if (Opt::has_state(c, k)) states[count] = quantized_state(r, k, count, Opt::kStateInfo[k].is_signed), ++count;
  }
  quantized_blocks(r, states, count, [&](const UpdateRange<T>& sub) { step_range<Opt, T, float>(sub, coeffs); });
}
