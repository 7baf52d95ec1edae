// Blockwise codes on the CPU, 8-bit (ops/quantize.h) and 4-bit (ops/quantize4.h): storage kinds
// around the fp32-state step loops. Each block of a range is dequantized into stack buffers,
// stepped by the fp32-state loop exactly as fp32 state would be (so, from the same dequantized
// state, the masters are bitwise those of the fp32-state step), and quantized again with the
// block's new absmax. A code kind (Codes<Q> below, for each math Q of storage_kinds.h's
// CodeKindList) says how its blocks are read and written; the rest is one seam. Part of
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

// The n (<= kQuantBlock) values of one block, from its codes and absmax.
template <bool kSigned>
void dequantize_block(const uint8_t* codes, float absmax, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF c = load_codes<kSigned>(codes + i);
    (kSigned ? ops::dequantize_signed(c, absmax) : ops::dequantize_unsigned(c, absmax)).store(out + i);
  }
  for (; i < n; ++i) out[i] = ops::Quant8::value(codes[i], absmax, kSigned);
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

// A code kind's blocks on the CPU (dequantize, quantize), for the math Q of storage_kinds.h's
// CodeKindList: each kind's own vector code.
template <class Q>
struct Codes;

// 8-bit codes: a byte per element, the closed-form maps of ops/quantize.h, rounded to nearest or
// stochastically.
template <>
struct Codes<ops::Quant8> {
  void dequantize(const uint8_t* codes, float absmax, int64_t n, bool is_signed, float* out) const {
    (is_signed ? dequantize_block<true> : dequantize_block<false>)(codes, absmax, n, out);
  }
  void quantize(const float* x, int64_t n, uint8_t* codes, float* absmax, const uint32_t* random,
                bool is_signed) const {
    (is_signed ? quantize_block<true> : quantize_block<false>)(x, n, codes, absmax, random);
  }
};

// 4-bit codes: two to a byte, torchao's maps (ops/quantize4.h), rounded to nearest. A block's
// entries times its absmax are computed once per block, so each element is a table read, as on
// the CUDA side (the same products); a value's code counts the midpoints it reaches, in lanes.
template <>
struct Codes<ops::Quant4> {
  struct alignas(64) Map {
    float entry[16];
    float mid[16];  // the midpoints of neighbouring entries, +inf beyond the last
  };
  Map maps[2];  // unsigned, signed: built once per range, not per block
  Codes() {
    for (int s = 0; s < 2; ++s) {
      for (uint32_t c = 0; c < 16; ++c) maps[s].entry[c] = ops::map4_entry(c, s == 1);
      for (uint32_t c = 0; c < 15; ++c) maps[s].mid[c] = ops::map4_mid(c, s == 1);
      maps[s].mid[15] = std::numeric_limits<float>::infinity();
    }
  }
  const Map& map(bool is_signed) const { return maps[is_signed]; }

  void dequantize(const uint8_t* codes, float absmax, int64_t n, bool is_signed, float* out) const {
    alignas(64) float value[16];
    for (int c = 0; c < 16; ++c) value[c] = map(is_signed).entry[c] * absmax;  // (Quant4::value's products)
    int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    // each byte's two halves, in element order, widened to lane indices into the 16 values
    const auto indices = [](__m128i bytes) {
      const __m128i low4 = _mm_set1_epi8(15);
      return _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), _mm_and_si128(bytes, low4));
    };
#if defined(CPU_CAPABILITY_AVX512)
    const __m512 table = _mm512_load_ps(value);
    for (; i + 16 <= n; i += 16) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
      _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(indices(bytes)), table));
    }
#else
    const __m256 low = _mm256_load_ps(value), high = _mm256_load_ps(value + 8);
    for (; i + 8 <= n; i += 8) {
      int32_t four;
      std::memcpy(&four, codes + i / 2, sizeof four);
      const __m256i index = _mm256_cvtepu8_epi32(indices(_mm_cvtsi32_si128(four)));
      // index bit 3 picks the high eight: moved to the sign bit, blendv's selector
      const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(index, 28));
      _mm256_storeu_ps(out + i, _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, index),
                                                 _mm256_permutevar8x32_ps(high, index), pick));
    }
#endif
#endif
    for (; i < n; ++i) out[i] = ops::Quant4::value(ops::nibble_of(codes[i / 2], i), absmax, is_signed);
  }

  void quantize(const float* x, int64_t n, uint8_t* codes, float* absmax_out, const uint32_t*, bool is_signed) const {
    const float absmax = block_absmax(x, n);
    *absmax_out = ops::Quant4::stored(absmax);
    if (!ops::Quant4::coded(absmax)) {  // every element the zero code
      const uint32_t zero = ops::Quant4::zero_code(is_signed);
      std::memset(codes, ops::byte_of(zero, zero), n / 2);
      if (n % 2) codes[n / 2] = ops::byte_of(zero, 0u);
      return;
    }
    alignas(64) int32_t code[ops::Quant4::kBlock];
    int64_t i = 0;
    const Map& m = map(is_signed);
    const float inv = 1.f / absmax;
#if defined(CPU_CAPABILITY_AVX512)
    const __m512 mids = _mm512_load_ps(m.mid);
#endif
    for (; i + kLanes <= n; i += kLanes) {
      F32 unit;
      std::memcpy(&unit, x + i, sizeof unit);
      unit *= inv;
      I32 c{};
      if (is_signed) {
#if defined(CPU_CAPABILITY_AVX512)
        // the midpoints reached, by a branch-free binary search: 4 table reads of the sorted
        // midpoints instead of 15 compares
        const __m512 u = _mm512_loadu_ps(x + i) * _mm512_set1_ps(inv);
        __m512i found = _mm512_setzero_si512();
        for (int step = 8; step > 0; step /= 2) {
          const __m512 mid = _mm512_permutexvar_ps(_mm512_add_epi32(found, _mm512_set1_epi32(step - 1)), mids);
          found = _mm512_mask_add_epi32(found, _mm512_cmp_ps_mask(u, mid, _CMP_GE_OQ), found,
                                        _mm512_set1_epi32(step));
        }
        std::memcpy(&c, &found, sizeof c);
#else
#pragma GCC unroll 15
        for (int j = 0; j < 15; ++j) c -= unit >= m.mid[j];  // (a true lane compares as -1)
#endif
      } else {
        c = ops::unsigned4_code_of_whole(__builtin_convertvector(unit * 32.f, I32));
      }
      std::memcpy(code + i, &c, sizeof c);
    }
    for (; i < n; ++i) code[i] = static_cast<int32_t>(ops::Quant4::code(x[i], inv, is_signed, nullptr));
    i = 0;
#if defined(CPU_CAPABILITY_AVX512)
    // 16 codes to bytes, each pair of bytes (even, odd) to one: even << 4 | odd
    for (; i + 16 <= n; i += 16) {
      const __m128i bytes = _mm512_cvtepi32_epi8(_mm512_load_si512(code + i));
      const __m128i pairs = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0xff)), 4),
                                         _mm_srli_epi16(bytes, 8));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i / 2), _mm_packus_epi16(pairs, pairs));
    }
#endif
    for (; i + 1 < n; i += 2) codes[i / 2] = ops::byte_of(code[i], code[i + 1]);
    if (i < n) codes[i / 2] = ops::byte_of(code[i], 0u);
  }
};

// One quantized state of a range: its codes and its absmax per block (from the range's first
// block), whether its map is the signed one, and the range's state that holds it.
struct QuantizedState {
  uint8_t* codes;
  float* absmax;
  bool is_signed;
  int slot;
};

// Elements stepped per call of the fp32-state loop: its buffers (3 states of 1,024 elements, 12
// KB, and 4 KB of random bits) stay in L1, and the call's fixed cost is spread over 1,024
// elements (4 blocks of 8-bit codes, 8 of 4-bit).
constexpr int64_t kStepElements = 1024;

// The blocks of state s in its elements [b, b + n) to fp32 values, and back.
template <class Q>
void dequantize_blocks(const Codes<Q>& kind, const QuantizedState& s, int64_t b, int64_t n, float* out) {
  for (int64_t q = 0; q < n; q += Q::kBlock) {
    kind.dequantize(s.codes + (b + q) * Q::kBits / 8, s.absmax[(b + q) / Q::kBlock], std::min(Q::kBlock, n - q),
                    s.is_signed, out + q);
  }
}

// With `random` (the random bits of elements [b, b + n)) 8-bit codes round stochastically.
template <class Q>
void quantize_blocks(const Codes<Q>& kind, const QuantizedState& s, int64_t b, int64_t n, const float* x,
                     const uint32_t* random) {
  for (int64_t q = 0; q < n; q += Q::kBlock) {
    kind.quantize(x + q, std::min(Q::kBlock, n - q), s.codes + (b + q) * Q::kBits / 8, s.absmax + (b + q) / Q::kBlock,
                  random ? random + q : nullptr, s.is_signed);
  }
}

// Runs `fp32_step(sub)` over r in parts of kStepElements, where sub is the part of r with its
// quantized states (the `count` of `states`) replaced by fp32 buffers holding their dequantized
// values. r.first is a multiple of Q::kBlock: cpu_ops.cpp gives each block to one range.
template <class Q, typename T, class Fp32Step>
void quantized_blocks(const UpdateRange<T>& r, const QuantizedState* states, int count, Fp32Step&& fp32_step) {
  alignas(64) float buffers[ops::kMaxStates][kStepElements];
  alignas(64) uint32_t random[kStepElements];  // stochastic codes: the random bits of the part's elements
  static_assert(kStepElements % Q::kBlock == 0, "parts of whole blocks");
  const bool stochastic = r.stochastic_codes && count > 0 && Q::kStochastic;
  const Codes<Q> kind;
  for (int64_t b = 0; b < r.n; b += kStepElements) {
    const int64_t n = std::min<int64_t>(kStepElements, r.n - b);
    UpdateRange<T> sub = part_of(r, b, n);
    sub.may_stream = false;
    for (int k = 0; k < count; ++k) {
      dequantize_blocks(kind, states[k], b, n, buffers[k]);
      sub.state[states[k].slot] = buffers[k];
    }
    fp32_step(sub);
    if (stochastic) fill_rounding_bits(r.round_key, r.first + b, n, random);
    for (int k = 0; k < count; ++k) quantize_blocks(kind, states[k], b, n, buffers[k], stochastic ? random : nullptr);
  }
}

// An optimizer's step over codes: the states it keeps take the absmax rows 0, 1, ... in state
// order, each with its descriptor's map.
template <class Opt, typename T, class Q>
void step_range_codes(const UpdateRange<T>& r, const void* coeffs) {
  const auto& c = *static_cast<const typename Opt::Coeffs*>(coeffs);
  QuantizedState states[Opt::kStates];
  int count = 0;
  for (int k = 0; k < Opt::kStates; ++k) {
    if (!Opt::has_state(c, k)) continue;
    states[count] = {static_cast<uint8_t*>(r.state[k]), r.absmax + count * r.absmax_row_stride + r.first / Q::kBlock,
                     Opt::kStateInfo[k].is_signed, k};
    ++count;
  }
  quantized_blocks<Q>(r, states, count, [&](const UpdateRange<T>& sub) { step_range<Opt, T, Fp32State>(sub, coeffs); });
}
