// The storage kinds of storage_kinds.h as the CPU loops see them: each kind one struct that
// says how its elements load, store, round and align, on vectors (pairs of fp32 vectors from
// element i) and on one element (the scalar path). The step loops (cpu/step_loops.h) call only
// these; no branch on a kind stands outside this file. The kinds' bits are ops/rounding.h's.
// Two families:
// - masters, where the fp32 value of a param lives (UpdateRange::master_kind, a runtime value:
//   with_master_kind below picks the struct once per range, and the vector loop is compiled
//   per kind: a branch per vector cost AVX2's 24-bit masters 3-6% in tools/loop_bench.sh);
// - element-wise state (fp32, bf16), the loops' template argument S. Codes, blockwise, are
//   Codes<Q> in cpu/quantized_state.h: a seam around the fp32-state loop.
// Part of cpu/loops_impl.h, after cpu/vec_bits.h.


// Half params that have an fp32 master are written by the step but not read: AVX2/AVX-512
// builds store them with streaming stores, which skip reading in the lines they overwrite (2 of
// the 30 bytes per parameter an Adam step would move). These stores need the vector's
// alignment, so the elements before it take the scalar path (update_range).
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
#if defined(CPU_CAPABILITY_AVX512)
    if (converted_bf16(a, b, words)) return _mm512_stream_si512(reinterpret_cast<Words*>(p), words);
#endif
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

// ---- masters -------------------------------------------------------------------------------
// Each master kind of params of dtype T: load (the fp32 values of the vector pair at i), store
// (the values as the param and its master), value and set_value (one element), and kStreams
// (its param is written, not read: streaming stores may write it). kHolds<T>: the param dtypes the
// kind is defined for.

// MasterKind::None: the param is its own fp32 value (fp32 params, or half params with
// master_weights=False).
struct InPlace {
  template <typename T>
  static constexpr bool kHolds = true;
  static constexpr bool kStreams = false;
  template <typename T>
  FA_VECTOR_HELPER static void load(const UpdateRange<T>& r, int64_t i, VecF& a, VecF& b) {
    load2(r.param + i, a, b);
  }
  template <typename T>
  FA_VECTOR_HELPER static void store(const UpdateRange<T>& r, int64_t i, const VecF& a, const VecF& b, bool stream) {
    if constexpr (kCanStream<T>) {
      if (stream) return stream_store2(r.param + i, a, b);
    }
    store2(r.param + i, a, b);
  }
  template <typename T>
  static float value(const UpdateRange<T>& r, int64_t i) { return static_cast<float>(r.param[i]); }
  template <typename T>
  static void set_value(const UpdateRange<T>& r, int64_t i, float v) { r.param[i] = element_of<T>(v); }
};

// MasterKind::Fp32: an fp32 master; the param is its rounding to nearest even.
struct Fp32Master {
  template <typename T>
  static constexpr bool kHolds = !std::is_same_v<T, float>;
  static constexpr bool kStreams = true;
  template <typename T>
  FA_VECTOR_HELPER static void load(const UpdateRange<T>& r, int64_t i, VecF& a, VecF& b) {
    load2(master_at<float>(r, i), a, b);
  }
  template <typename T>
  FA_VECTOR_HELPER static void store(const UpdateRange<T>& r, int64_t i, const VecF& a, const VecF& b, bool stream) {
    store2(master_at<float>(r, i), a, b);
    InPlace::store(r, i, a, b, stream);
  }
  template <typename T>
  static float value(const UpdateRange<T>& r, int64_t i) { return *master_at<float>(r, i); }
  template <typename T>
  static void set_value(const UpdateRange<T>& r, int64_t i, float v) {
    *master_at<float>(r, i) = v;
    InPlace::set_value(r, i, v);
  }
};

// MasterKind::Remainder: an exact fp32 master as the bf16 param and its low 16 bits.
struct Remainder16 {
  template <typename T>
  static constexpr bool kHolds = std::is_same_v<T, c10::BFloat16>;
  static constexpr bool kStreams = false;
  using BF16 = c10::BFloat16;
  FA_VECTOR_HELPER static void load(const UpdateRange<BF16>& r, int64_t i, VecF& a, VecF& b) {
    load_master_of(r.param + i, master_at<BF16>(r, i), a, b);
  }
  FA_VECTOR_HELPER static void store(const UpdateRange<BF16>& r, int64_t i, const VecF& a, const VecF& b, bool) {
    store_master_as(r.param + i, master_at<BF16>(r, i), a, b);
  }
  static float value(const UpdateRange<BF16>& r, int64_t i) {
    return ops::float_of(ops::master_of(r.param[i].x, master_at<BF16>(r, i)->x));
  }
  static void set_value(const UpdateRange<BF16>& r, int64_t i, float v) {
    r.param[i].x = ops::param_bits_of_master(ops::bits_of(v));
    master_at<BF16>(r, i)->x = ops::remainder_of_master(ops::bits_of(v));
  }
};

// MasterKind::Remainder8: a 24-bit master as the bf16 param and a byte; the step's fp32 value
// rounds to 24 bits to nearest even, or stochastically (8 random bits per element, of
// ops::master_rounding_key). The param is rounded from the 24-bit value.
struct Remainder24 {
  template <typename T>
  static constexpr bool kHolds = std::is_same_v<T, c10::BFloat16>;
  static constexpr bool kStreams = false;
  using BF16 = c10::BFloat16;
  FA_VECTOR_HELPER static void load(const UpdateRange<BF16>& r, int64_t i, VecF& a, VecF& b) {
    load_master24_of(r.param + i, master_at<uint8_t>(r, i), a, b);
  }
  FA_VECTOR_HELPER static void store(const UpdateRange<BF16>& r, int64_t i, const VecF& a, const VecF& b, bool) {
    U32 add_a, add_b;
    if (r.stochastic) {
      rounding_bits2(ops::master_rounding_key(r.round_key), r.first + i, add_a, add_b);
      add_a &= 0xffu;
      add_b &= 0xffu;
    } else {
      add_a = ops::nearest_24_addend<U32>(bits_of(a));
      add_b = ops::nearest_24_addend<U32>(bits_of(b));
    }
    const U32 m_a = ops::round_bits_to_24<U32>(bits_of(a), add_a);
    const U32 m_b = ops::round_bits_to_24<U32>(bits_of(b), add_b);
    store_master24_as(r.param + i, master_at<uint8_t>(r, i), m_a, m_b);
  }
  static float value(const UpdateRange<BF16>& r, int64_t i) {
    return ops::float_of(ops::master24_of(r.param[i].x, *master_at<uint8_t>(r, i)));
  }
  static void set_value(const UpdateRange<BF16>& r, int64_t i, float v) {
    const uint32_t b = ops::bits_of(v);
    const uint32_t addend = r.stochastic
                                ? ops::rounding_bits(ops::master_rounding_key(r.round_key), r.first + i) & 0xffu
                                : ops::nearest_24_addend(b);
    const uint32_t m = ops::round_bits_to_24(b, addend);
    r.param[i].x = ops::param_bits_of_master(m);
    *master_at<uint8_t>(r, i) = ops::remainder8_of_master(m);
  }
};

// Calls f(Kind{}) with the struct of r's master kind (InPlace for a kind T's params cannot have:
// validation refuses those before any loop runs).
template <typename T, class F>
decltype(auto) with_master_kind(const UpdateRange<T>& r, F&& f) {
  switch (r.master_kind) {
    case MasterKind::Fp32:
      if constexpr (Fp32Master::kHolds<T>) return f(Fp32Master{});
      break;
    case MasterKind::Remainder:
      if constexpr (Remainder16::kHolds<T>) return f(Remainder16{});
      break;
    case MasterKind::Remainder8:
      if constexpr (Remainder24::kHolds<T>) return f(Remainder24{});
      break;
    default: break;
  }
  return f(InPlace{});
}

// One element's fp32 value, and its storage (the scalar path).
template <typename T>
inline float value_at(const UpdateRange<T>& r, int64_t i) {
  return with_master_kind(r, [&](auto kind) { return kind.value(r, i); });
}
template <typename T>
inline void set_value_at(const UpdateRange<T>& r, int64_t i, float v) {
  with_master_kind(r, [&](auto kind) { kind.set_value(r, i, v); });
}
// Whether r's params may take streaming stores: its kind writes them without reading, and
// nothing reads them back in the step (the epilogues read them from cache).
template <typename T>
bool streams(const UpdateRange<T>& r) {
  return kCanStream<T> && r.may_stream && !r.epilogues.any() &&
         with_master_kind(r, [](auto kind) { return decltype(kind)::kStreams; });
}

// ---- element-wise state ----------------------------------------------------------------------
// Each state kind: load/store (the vector pair at i; `random`, 16 random bits per lane, or null
// when the step rounds to nearest) and load1/store1 (one element; `random16` used only when
// `stochastic`). The state pointer is the range's r.state[k].

// StateKind::Fp32.
struct Fp32State {
  static constexpr int kBytes = state_storage(StateKind::Fp32).bits / 8;
  FA_VECTOR_HELPER static void load(const void* p, int64_t i, VecF& a, VecF& b) {
    load2(static_cast<const float*>(p) + i, a, b);
  }
  FA_VECTOR_HELPER static void store(void* p, int64_t i, const VecF& a, const VecF& b, const U32*) {
    store2(static_cast<float*>(p) + i, a, b);
  }
  static float load1(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  static void store1(void* p, int64_t i, float v, bool, uint32_t) { static_cast<float*>(p)[i] = v; }
};

// StateKind::BFloat16: rounded to nearest even (torch's conversion) or, stochastically, by
// adding the random bits to the low half (ops::round_bits_to_bf16).
struct BF16State {
  using BF16 = c10::BFloat16;
  static constexpr int kBytes = state_storage(StateKind::BFloat16).bits / 8;
  FA_VECTOR_HELPER static void load(const void* p, int64_t i, VecF& a, VecF& b) {
    load2(static_cast<const BF16*>(p) + i, a, b);
  }
  FA_VECTOR_HELPER static void store(void* p, int64_t i, const VecF& a, const VecF& b, const U32* random) {
    BF16* const at = static_cast<BF16*>(p) + i;
    if (random) return store_exact_bf16(at, round_to_bf16(a, random[0]), round_to_bf16(b, random[1]));
    store2(at, a, b);
  }
  static float load1(const void* p, int64_t i) { return static_cast<float>(static_cast<const BF16*>(p)[i]); }
  static void store1(void* p, int64_t i, float v, bool stochastic, uint32_t random16) {
    if (stochastic) v = ops::stochastic_round_bf16(v, random16);
    static_cast<BF16*>(p)[i] = element_of<BF16>(v);
  }
};
