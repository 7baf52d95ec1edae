// The step's epilogues (loops.h's Epilogues): what it writes besides the params, each computed
// from the params as written, read back from cache part by part (step_range: kEpiloguePart
// elements), so that the step loops themselves name none of them and every epilogue composes
// with every optimizer and storage kind. Each epilogue is one struct: asked (its pointers are
// set) and run (over n params written, from the range's part's first). Part of
// cpu/loops_impl.h, after cpu/vec_bits.h.

// Params with epilogues step in parts of this many elements, each read back right after it is
// written, from cache (4-8 KB of params).
constexpr int64_t kEpiloguePart = 2048;
static_assert(kEpiloguePart % ops::kMxBlock == 0, "an MX copy's parts start on its blocks");

// amax: the largest ops::magnitude_bits so far of the values, lane by lane (an MX block's).
FA_VECTOR_HELPER void max_magnitude(U32& amax, const U32& bits) {
  const U32 m = bits & 0x7fffffffu;
  amax = m > amax ? m : amax;
}
FA_VECTOR_HELPER uint32_t max_lane(const U32& v) {
  uint32_t m = 0;
  for (int j = 0; j < kLanes; ++j) m = std::max(m, v[j]);
  return m;
}

// The range's amax into its param's slot: other threads max theirs into it at the same time.
inline void max_into(uint32_t* slot, uint32_t amax) {
  uint32_t seen = __atomic_load_n(slot, __ATOMIC_RELAXED);
  while (amax > seen && !__atomic_compare_exchange_n(slot, &seen, amax, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// The e4m3 codes (ops/float8.h) of the lanes of x (two vectors) times `scale`, to `out`.
FA_VECTOR_HELPER void cast_float8_lanes(const VecF (&x)[2], uint8_t* out, float scale) {
  U32 codes[2];
  for (int h = 0; h < 2; ++h) {
    const U32 b = bits_of(x[h] * VecF(scale));
    const U32 mag = ops::e4m3_magnitude<U32>(b);
    codes[h] = ops::e4m3_code<U32>(b, mag, bits_of(float_of(mag) + VecF(ops::kE4m3SubnormalBias)));
  }
  store_bytes(out, codes[0], codes[1]);
}

// The e4m3 codes of n params times `scale`.
template <typename T>
void cast_float8(const T* param, uint8_t* out, int64_t n, float scale) {
  int64_t i = 0;
  for (; i + kStep<T> <= n; i += kStep<T>) {
    VecF x[2];
    load2(param + i, x[0], x[1]);
    cast_float8_lanes(x, out + i, scale);
  }
  for (; i < n; ++i) out[i] = ops::e4m3_of_scaled(static_cast<float>(param[i]), scale);
}

// MX copies: each block of ops::kMxBlock params as written, cast by its e8m0 scale
// (ops/float8.h), which goes to `scales`; n is whole blocks.
template <typename T>
void cast_mx(const T* param, uint8_t* out, uint8_t* scales, int64_t n) {
  constexpr int kSteps = static_cast<int>(ops::kMxBlock / kStep<T>);  // (loaded once: 1 on AVX-512, 2 on AVX2)
  static_assert(ops::kMxBlock % kStep<T> == 0, "a block is whole vector steps");
  for (int64_t b = 0; b < n; b += ops::kMxBlock) {
    VecF x[kSteps][2];
    U32 amax{};
    for (int s = 0; s < kSteps; ++s) {
      load2(param + b + s * kStep<T>, x[s][0], x[s][1]);
      max_magnitude(amax, bits_of(x[s][0]));
      max_magnitude(amax, bits_of(x[s][1]));
    }
    const uint32_t code = ops::e8m0_of_amax(max_lane(amax));
    scales[b / ops::kMxBlock] = static_cast<uint8_t>(code);
    for (int s = 0; s < kSteps; ++s) cast_float8_lanes(x[s], out + b + s * kStep<T>, ops::mx_cast_factor(code));
  }
}

// The weight amax (fp8 scaling), maxed into the param's slot: the params' inf-norm (a NaN param
// makes it NaN, as torch's amax is; its bits order above inf's).
struct WeightAmax {
  static bool asked(const Epilogues& e) { return e.amax_bits; }
  template <typename T>
  static void run(const Epilogues& e, const T* param, int64_t n) {
    const float amax = static_cast<float>(norm_range<T, ops::NormKind::Inf>(param, n, 1.f));
    max_into(e.amax_bits, ops::magnitude_bits(amax));
  }
};

// An fp8 copy with a per-tensor scale.
struct Float8Copy {
  static bool asked(const Epilogues& e) { return e.float8 && !e.mx_scales; }
  template <typename T>
  static void run(const Epilogues& e, const T* param, int64_t n) { cast_float8(param, e.float8, n, e.float8_scale); }
};

// An MX copy (MXFP8): each block cast by its e8m0 scale.
struct MxCopy {
  static bool asked(const Epilogues& e) { return e.mx_scales; }
  template <typename T>
  static void run(const Epilogues& e, const T* param, int64_t n) { cast_mx(param, e.float8, e.mx_scales, n); }
};

// Every epilogue asked for, over n params as written.
template <typename T>
void run_epilogues(const Epilogues& e, const T* param, int64_t n) {
  const auto run = [&]<class Epilogue>(Epilogue) {
    if (Epilogue::asked(e)) Epilogue::run(e, param, n);
  };
  run(WeightAmax{});
  run(Float8Copy{});
  run(MxCopy{});
}
