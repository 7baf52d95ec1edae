// Vectors as bits: the GCC vector types of the loops, 16-bit words, loads and stores of every
// dtype as pairs of fp32 vectors, bf16 storage of fp32 values (the remainder's split and join,
// rounding to bf16), and the random bits of stochastic rounding. Part of cpu/loops_impl.h.
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
using U8 = uint8_t __attribute__((vector_size(kLanes)));
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
#if defined(CPU_CAPABILITY_AVX512)
  // one widening load per vector (GCC widens the generic form below in halves, and inserts)
  const __m512i wide[2] = {_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                           _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kLanes)))};
  std::memcpy(&a, &wide[0], sizeof a);
  std::memcpy(&b, &wide[1], sizeof b);
#else
  U16 low_a, low_b;
  std::memcpy(&low_a, p, sizeof low_a);
  std::memcpy(&low_b, p + kLanes, sizeof low_b);
  a = __builtin_convertvector(low_a, U32);
  b = __builtin_convertvector(low_b, U32);
#endif
}

// A NaN's bf16 bits as torch's conversion on this instruction set writes them, tails included:
// all ones from its AVX2 and AVX-512 vectors, c10's 0x7fc0 from its portable code.
#if defined(CPU_CAPABILITY_DEFAULT)
constexpr uint32_t kNanBf16 = 0x7fc0u;
#else
constexpr uint32_t kNanBf16 = 0xffffu;
#endif

// fp32 bits rounded to the nearest bf16, ties to even, in the low 16 bits; where `nan` is all
// ones (a NaN), kNanBf16. W = uint32_t (one element) or U32 (a vector's lanes), as ops/rounding.h
// spells its roundings: the scalar tails and the vectors compute the same bits from one spelling.
template <class W>
FA_VECTOR_HELPER W nearest_bf16_bits(W bits, W nan) {
  const W rounded = bits + 0x7fffu + ((bits >> 16) & 1u);  // (a tie goes to the even high half)
#if defined(CPU_CAPABILITY_DEFAULT)
  return ((rounded >> 16) & ~nan) | (nan & kNanBf16);
#else
  return (rounded | nan) >> 16;  // (a NaN: all ones, kNanBf16)
#endif
}

// x rounded to the nearest bf16 in the low 16 bits of each lane: the same bits as at::vec's
// conversions, which GCC leaves as calls per vector in the larger loops.
FA_VECTOR_HELPER U32 nearest_bf16_of(const VecF& x) { return nearest_bf16_bits<U32>(bits_of(x), bits_of(x.isnan())); }

// One element as T, as the vector stores write it (a NaN as bf16 is kNanBf16, where
// c10::BFloat16's scalar conversion gives 0x7fc0 on every instruction set).
template <typename T, typename S>
inline T element_of(S v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    static_assert(std::is_same_v<S, float>, "bf16 from its op math, fp32");
    const uint32_t bits = nearest_bf16_bits<uint32_t>(c10::bit_cast<uint32_t>(v), v != v ? ~0u : 0u);
    return c10::BFloat16(static_cast<uint16_t>(bits), c10::BFloat16::from_bits());
  } else {
    return static_cast<T>(v);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// (a, b) as 32 bf16 words by AVX512-BF16's one conversion, in place of nearest_bf16_of's six
// operations and two narrowings per vector, where it rounds as that does: in every lane but NaNs
// (it keeps their payload) and subnormals (it flushes them to zero), as a check of all 2^32
// inputs found. Those are told apart by their bits: the class test (vfpclassps) follows MXCSR's
// DAZ, which torch.set_flush_denormal sets. False, with `words` unset, when a lane is one of them.
FA_VECTOR_HELPER bool converted_bf16(const VecF& a, const VecF& b, __m512i& words) {
  const auto unlike = [](const __m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __mmask16 no_exponent = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000));
    return static_cast<__mmask16>(_mm512_mask_test_epi32_mask(no_exponent, bits, _mm512_set1_epi32(0x007fffff)) |
                                  _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q));
  };
  if (!bf16_conversion || (unlike(a) | unlike(b))) return false;
  words = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a's lanes first
  return true;
}
#endif

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
#elif defined(CPU_CAPABILITY_AVX512)
  // joined in registers: GCC joins the two halves below through the stack, and the 64-byte load
  // after two 32-byte stores misses store forwarding (an Adam step with bf16 state took 1.8x
  // its AVX2 time on a Xeon)
  __m512i lanes[2];
  const U32 in[2] = {a, b};
  std::memcpy(lanes, in, sizeof lanes);
  const __m512i joined =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lanes[0])), _mm512_cvtepi32_epi16(lanes[1]), 1);
  std::memcpy(&out, &joined, sizeof out);
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

// Stores the lanes of (a, b), each holding a value below 256, to p[0, 2 * kLanes) as bytes.
FA_VECTOR_HELPER void store_bytes(uint8_t* p, const U32& a, const U32& b) {
  const I16 words = words_of(a, b);
#if defined(CPU_CAPABILITY_AVX2)
  __m256i w;
  std::memcpy(&w, &words, sizeof w);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
#elif defined(CPU_CAPABILITY_AVX512)
  __m512i w;
  std::memcpy(&w, &words, sizeof w);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi16_epi8(w));
#else
  using Bytes = uint8_t __attribute__((vector_size(2 * kLanes)));
  const Bytes bytes = __builtin_convertvector(words, Bytes);
  std::memcpy(p, &bytes, sizeof bytes);
#endif
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
#elif defined(CPU_CAPABILITY_AVX512)
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // (a bf16 value is the top half of its fp32)
    U32 low, high;
    load_low16(p, low, high);
    a = float_of(low << 16);
    b = float_of(high << 16);
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
#if defined(CPU_CAPABILITY_AVX512)
    __m512i words;
    if (converted_bf16(a, b, words)) return _mm512_storeu_si512(p, words);
#endif
    store_words(p, nearest_bf16_of(a), nearest_bf16_of(b));
  } else {
    at::vec::convert_from_float<T>(a, b).store(p);
  }
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
  a = float_of(ops::master_of<U32>(p0, r0));
  b = float_of(ops::master_of<U32>(p1, r1));
#endif
}

// Stores fp32 values that are bf16 values already (low halves zero) as bf16: their high halves,
// without the rounding of a conversion.
FA_VECTOR_HELPER void store_exact_bf16(c10::BFloat16* p, const VecF& a, const VecF& b) {
  store_words(p, bits_of(a) >> 16, bits_of(b) >> 16);
}

// x rounded to a bf16 value by adding `addend` to its magnitude bits (ops::round_bits_to_bf16).
FA_VECTOR_HELPER VecF round_to_bf16(const VecF& x, const U32& addend) {
  return float_of(ops::round_bits_to_bf16<U32>(bits_of(x), addend));
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
  store_words(param, ops::param_bits_of_master<U32>(bits_of(a)), ops::param_bits_of_master<U32>(bits_of(b)));
  store_words(remainder, bits_of(a) & 0xffffu, bits_of(b) & 0xffffu);
}

// ---- 24-bit masters: a bf16 param and a byte (ops/rounding.h), on vectors ---------------------
using U8 = uint8_t __attribute__((vector_size(kLanes)));

// Loads 2 * kLanes bytes, zero-extended to the lanes of (a, b). (GCC 12 converts byte vectors
// one lane at a time on AVX2 and AVX-512: the intrinsics there.)
FA_VECTOR_HELPER void load_bytes(const uint8_t* p, U32& a, U32& b) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kLanes)));
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
#elif defined(CPU_CAPABILITY_AVX512)
  const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kLanes)));
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
#else
  U8 lo, hi;
  std::memcpy(&lo, p, sizeof lo);
  std::memcpy(&hi, p + kLanes, sizeof hi);
  a = __builtin_convertvector(lo, U32);
  b = __builtin_convertvector(hi, U32);
#endif
}

// Stores byte 1 (bits 8-15) of each lane of (a, b) to p[0, 2 * kLanes).
FA_VECTOR_HELPER void store_second_bytes(uint8_t* p, const U32& a, const U32& b) {
#if defined(CPU_CAPABILITY_AVX2)
  // each 128-bit lane's 4 bytes to its first word, then the two lanes' words side by side
  const __m256i pick = _mm256_setr_epi8(1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i words = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  __m256i va, vb;
  std::memcpy(&va, &a, sizeof va);
  std::memcpy(&vb, &b, sizeof vb);
  const __m256i sa = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(va, pick), words);
  const __m256i sb = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(vb, pick), words);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_unpacklo_epi64(_mm256_castsi256_si128(sa), _mm256_castsi256_si128(sb)));
#else
  const U8 bytes[2] = {__builtin_convertvector(a >> 8, U8), __builtin_convertvector(b >> 8, U8)};
  std::memcpy(p, bytes, sizeof bytes);
#endif
}

FA_VECTOR_HELPER void load_master24_of(const c10::BFloat16* param, const uint8_t* remainder8, VecF& a, VecF& b) {
  U32 p0, p1, r0, r1;
  load_low16(param, p0, p1);
  load_bytes(remainder8, r0, r1);
  a = float_of(ops::master24_of<U32>(p0, r0));
  b = float_of(ops::master24_of<U32>(p1, r1));
}

// Stores 24-bit masters (their bits in the lanes of a, b) as bf16 params and bytes.
FA_VECTOR_HELPER void store_master24_as(c10::BFloat16* param, uint8_t* remainder8, const U32& a, const U32& b) {
  store_words(param, ops::param_bits_of_master<U32>(a), ops::param_bits_of_master<U32>(b));
  store_second_bytes(remainder8, a, b);
}

// ops::rounding_bits of 2 * kLanes consecutive elements from `index` (lowbias32 on lanes).
FA_VECTOR_HELPER void rounding_bits2(uint32_t key, int64_t index, U32& a, U32& b) {
  const U32 first = kLaneIndex + static_cast<uint32_t>(index);
  a = ops::mix32<U32>(key ^ first);
  b = ops::mix32<U32>(key ^ (first + kLanes));
}
