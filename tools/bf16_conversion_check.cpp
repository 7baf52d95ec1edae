// The AVX-512 loops' bf16 store by AVX512-BF16's conversion (cpu/vec_bits.h's converted_bf16)
// against the integer rounding it stands in for (nearest_bf16_of), bit for bit, over all 2^32
// fp32 inputs, with MXCSR's DAZ off and on (torch.set_flush_denormal sets it): every vector the
// conversion takes must give the same words; those holding a NaN or a subnormal it must refuse.
// Build and run with tools/with_loops.sh bf16_conversion_check (about 20 s on 2 cores).
#include LOOPS_FILE

#include <cstdio>

#include <xmmintrin.h>

int main() {
#if defined(CPU_CAPABILITY_AVX512)
  namespace loops = fused_amp::cpu::CPU_CAPABILITY;
  if (!fused_amp::cpu::bf16_conversion) {
    std::printf("no AVX512-BF16 conversion here (the CPU lacks it, or FUSED_AMP_CPU_BF16=0): nothing to check\n");
    return 0;
  }
  int failed = 0;
  for (const bool daz : {false, true}) {
    _mm_setcsr(daz ? _mm_getcsr() | 0x0040u : _mm_getcsr() & ~0x0040u);
    uint64_t converted = 0, refused = 0, mismatched = 0;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (uint64_t first = 0; first < (uint64_t{1} << 32); first += 32) {  // 32 consecutive inputs
      const __m512i low = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(first)), lane);
      const loops::VecF a = _mm512_castsi512_ps(low);
      const loops::VecF b = _mm512_castsi512_ps(_mm512_add_epi32(low, _mm512_set1_epi32(16)));
      __m512i words;
      if (!loops::converted_bf16(a, b, words)) {
        ++refused;
        continue;
      }
      const loops::I16 expected = loops::words_of(loops::nearest_bf16_of(a), loops::nearest_bf16_of(b));
      __m512i want;
      std::memcpy(&want, &expected, sizeof want);
      converted += 32;
      mismatched += __builtin_popcount(_mm512_cmpneq_epi16_mask(words, want));
    }
    std::printf("DAZ %s: %llu inputs converted, %llu vectors of 32 refused, %llu mismatches\n", daz ? "on " : "off",
                static_cast<unsigned long long>(converted), static_cast<unsigned long long>(refused),
                static_cast<unsigned long long>(mismatched));
    failed |= mismatched != 0;
  }
  return failed;
#else
  std::printf("the AVX-512 loops alone have the conversion: nothing to check with these\n");
  return 0;
#endif
}
