// The optimizer step loops (every optimizer of optimizers.h) over one range, for element-wise
// state: the vector and scalar paths of one range, and its epilogues (cpu/epilogues.h) after it. The param's
// fp32 value and the state are loaded and stored through their kinds (cpu/storage_traits.h:
// Master::load/store, S::load/store). Part of cpu/loops_impl.h.
// ---- the step loops ----------------------------------------------------------------------

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

template <typename T>
inline float grad_at(const UpdateRange<T>& r, int64_t i, float inv_scale) {
  const float g = static_cast<float>(r.grad[i]);
  if (r.write_grad) r.grad[i] = element_of<T>(g * inv_scale);
  return g;
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
  const bool stream = streams(r);
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

// The step over the whole vectors of [begin, end) (step_vectors' blocks).
template <class Opt, typename T, typename S, class Master, typename C>
FA_VECTOR_HELPER void step_block(const UpdateRange<T>& r, const C& c, int64_t begin, int64_t end, bool stream,
                                 bool read, bool keeps_state) {
  constexpr int K = Opt::kStates;
  for (int64_t i = begin; i < end; i += kStep<T>) {
    VecF p0, p1, g0, g1, s0[K], s1[K];
    if constexpr (Opt::kWritesOutput) {
      p0 = p1 = VecF(0.f);
    } else {
      Master::load(r, i, p0, p1);
    }
    load2(r.grad + i, g0, g1);
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      s0[k] = s1[k] = VecF(0.f);
      if (Opt::has_state(c, k) && read) S::load(r.state[k], i, s0[k], s1[k]);
    }
    Opt::update(p0, g0, s0, c);
    Opt::update(p1, g1, s1, c);
    if constexpr (Opt::kWritesOutput) {
      store2(r.output + i, p0, p1);  // rounded to nearest even, as torch's .bfloat16()
    } else {
      Master::store(r, i, p0, p1, stream);
    }
    if (!keeps_state) continue;
    U32 bits[4];
    const U32* random = vector_rounding_bits(r, i, bits);
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      if (!Opt::has_state(c, k)) continue;
      S::store(r.state[k], i, s0[k], s1[k], random && Opt::kStateInfo[k].high_bits ? random + 2 : random);
    }
  }
}

// The unscaled grads of [begin, end) (store_unscaled_grad), read again from cache after the step
// loop read them: a grad store the loop may take, behind a branch per vector, cost the bare fp32
// step (which never takes it) 2-6% in memory on a Xeon with AVX-512 (the loop against a plain
// one in one process, in turns, both ways round).
constexpr int64_t kGradBlock = 2048;  // elements: 8 KB of fp32 grads, in L1
template <typename T>
FA_VECTOR_HELPER void store_unscaled_grads(const UpdateRange<T>& r, int64_t begin, int64_t end, float inv_scale,
                                           const ExponentShift& shift) {
  for (int64_t i = begin; i < end; i += kStep<T>) {
    VecF g0, g1;
    load2(r.grad + i, g0, g1);
    store_unscaled_grad(r, i, g0, g1, inv_scale, shift);
  }
}

// One optimizer's step (ops/optimizer.h) over the whole vectors of [begin, end), the param's value
// held as Master says (cpu/storage_traits.h), in blocks of kGradBlock elements, each followed by
// its grads' writes. C is Opt::Coeffs, or a type derived from it that fixes its options at
// compile time (Opt::with_fixed_options).
template <class Opt, typename T, typename S, class Master, typename C>
FA_VECTOR_LOOP void step_vectors(const UpdateRange<T> r, const C c, int64_t begin, int64_t end, bool stream) {
  constexpr int K = Opt::kStates;
  static_assert(kGradBlock % kStep<T> == 0, "blocks of whole vectors");
  const ExponentShift shift = exponent_shift_of<T>(c.inv_scale, r.write_grad);
  const bool read = Opt::reads_states(c);
  bool keeps_state = false;
  for (int k = 0; k < K; ++k) keeps_state |= Opt::has_state(c, k);
  for (int64_t block = begin; block < end; block += kGradBlock) {
    const int64_t block_end = std::min(end, block + kGradBlock);
    step_block<Opt, T, S, Master>(r, c, block, block_end, stream, read, keeps_state);
    if (r.write_grad) store_unscaled_grads(r, block, block_end, c.inv_scale, shift);
  }
}

template <class Opt, typename T, typename S, typename C>
void step_range_with(const UpdateRange<T>& r, const C& c) {
  constexpr int K = Opt::kStates;
  update_range(
      r,
      [&](int64_t begin, int64_t end, bool stream) {
        with_master_kind(r, [&]<class Master>(Master) { step_vectors<Opt, T, S, Master>(r, c, begin, end, stream); });
      },
      [&](int64_t i) {
        const bool read = Opt::reads_states(c);
        float p = Opt::kWritesOutput ? 0.f : value_at(r, i), st[K];
        for (int k = 0; k < K; ++k) {
          st[k] = Opt::has_state(c, k) && read ? S::load1(r.state[k], i) : 0.f;
        }
        Opt::update(p, grad_at(r, i, c.inv_scale), st, c);
        if constexpr (Opt::kWritesOutput) {
          r.output[i] = element_of<c10::BFloat16>(p);
        } else {
          set_value_at(r, i, p);
        }
        const uint32_t bits = r.stochastic ? ops::rounding_bits(r.round_key, r.first + i) : 0u;
        for (int k = 0; k < K; ++k) {
          if (!Opt::has_state(c, k)) continue;
          S::store1(r.state[k], i, st[k], r.stochastic, Opt::kStateInfo[k].high_bits ? bits >> 16 : bits & 0xffffu);
        }
      });
}

// The elements [b, b + n) of r: its pointers advanced, but the states' (the caller's to place).
template <typename T>
UpdateRange<T> part_of(const UpdateRange<T>& r, int64_t b, int64_t n) {
  UpdateRange<T> part = r;
  part.param += b;
  part.grad += b;
  if (part.master) part.master = static_cast<char*>(part.master) + b * master_bytes(part.master_kind);
  if (part.output) part.output += b;
  part.epilogues = r.epilogues.from(b);  // (parts start on MX blocks)
  part.n = n;
  part.first = r.first + b;
  return part;
}

// The loop of the Loops table: `coeffs` points to an Opt::Coeffs. Where epilogues are asked for,
// the range steps in parts of kEpiloguePart elements, each followed by the epilogues over its
// params as written, from cache.
template <class Opt, typename T, typename S>
void step_range(const UpdateRange<T>& r, const void* coeffs) {
  const auto& coeffs_of = *static_cast<const typename Opt::Coeffs*>(coeffs);
  const auto step = [&](const UpdateRange<T>& part) {
    Opt::with_fixed_options(coeffs_of, [&](const auto& c) { step_range_with<Opt, T, S>(part, c); });
  };
  if (!r.epilogues.any()) return step(r);
  for (int64_t b = 0; b < r.n; b += kEpiloguePart) {
    UpdateRange<T> part = part_of(r, b, std::min(kEpiloguePart, r.n - b));
    for (void*& state : part.state) {
      if (state) state = static_cast<char*>(state) + b * S::kBytes;
    }
    step(part);
    run_epilogues(part.epilogues, part.param, part.n);
  }
}
