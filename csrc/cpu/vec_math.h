// The vector spellings of ops/common.h and ops/quantize.h (Vectorized<float>, and <double> where
// the norm needs it), declared before the op templates are instantiated. Part of
// cpu/loops_impl.h (included once per instruction set).
namespace fused_amp::ops {
// The vector spellings of ops/common.h, declared before the op templates are instantiated.
using VecF = at::vec::Vectorized<float>;
using VecD = at::vec::Vectorized<double>;
static inline VecF sqrt_(const VecF& x) { return x.sqrt(); }
static inline VecF max_(const VecF& a, const VecF& b) { return at::vec::maximum(a, b); }
static inline VecF fma_(const VecF& a, const VecF& b, const VecF& c) { return at::vec::fmadd(a, b, c); }
static inline VecD fma_(const VecD& a, const VecD& b, const VecD& c) { return at::vec::fmadd(a, b, c); }
static inline VecF abs_(const VecF& x) { return x.abs(); }
// The selects of the compute-bound loops: AVX-512 compares write a mask register, which its
// blend takes; at::vec's masks are vectors (a compare, then blendv), which costs two more
// instructions per select there (vpmovm2d, then vpcmpeqd back to a mask).
#if defined(CPU_CAPABILITY_AVX512)
using LaneMask = __mmask16;
static inline VecF select_(LaneMask where, const VecF& a, const VecF& b) { return _mm512_mask_blend_ps(where, b, a); }
static inline LaneMask equal_(const VecF& a, const VecF& b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
static inline LaneMask greater_(const VecF& a, const VecF& b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline LaneMask not_finite_(const VecF& x) { return _mm512_fpclass_ps_mask(x, 0x99); }  // NaN or ±inf
#else
using LaneMask = VecF;
static inline VecF select_(const LaneMask& where, const VecF& a, const VecF& b) { return VecF::blendv(b, a, where); }
static inline LaneMask equal_(const VecF& a, const VecF& b) { return a == b; }
static inline LaneMask greater_(const VecF& a, const VecF& b) { return a > b; }
static inline LaneMask not_finite_(const VecF& x) { return (x - x).isnan(); }
#endif
// ops/common.h's div_by_: quotients that are not finite keep q
static inline VecF div_by_(const VecF& x, KnownDivisor k) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  const VecF q = x * VecF(k.r);
  return select_(not_finite_(q), q, fma_(fma_(q, VecF(-k.d), x), VecF(k.r), q));
#else
  return x / VecF(k.d);
#endif
}
// torch.sign: -1, 0 or 1; NaN stays NaN
static inline VecF sign_(const VecF& x) {
  const VecF s = ((x > VecF(0.f)) & VecF(1.f)) - ((x < VecF(0.f)) & VecF(1.f));
  return VecF::blendv(s, x, x.isnan());
}
static inline VecD abs_(const VecD& x) { return x.abs(); }
static inline VecF where_positive_(const VecF& x, const VecF& a, const VecF& b) {
  return select_(greater_(x, VecF(0.f)), a, b);
}
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
static inline VecF floor_(const VecF& x) { return x.floor(); }
static inline VecF copysign_(const VecF& magnitude, const VecF& sign) {
  return magnitude.abs() | (sign & VecF(-0.f));
}
#if defined(CPU_CAPABILITY_AVX512)
static inline VecF positive_(const VecF& x) { return _mm512_maskz_mov_ps(greater_(x, VecF(0.f)), VecF(1.f)); }
#else
static inline VecF positive_(const VecF& x) { return (x > VecF(0.f)) & VecF(1.f); }
#endif
static inline VecF where_top_(const VecF& code, float top, const VecF& exact, const VecF& value) {
  return select_(equal_(code, VecF(top)), exact, value);
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
