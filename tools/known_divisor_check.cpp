// Checks ops::div_by_ (a division by a divisor known ahead, as a multiply and two FMAs)
// against the division it replaces, bit for bit, in the vector build of one instruction set
// (LOOPS_FILE) and on the scalar path:
// - every divisor sqrt(1 - beta2^t) that Adam's bias correction takes in fp32 over the first
//   STEPS steps for the usual beta2, against every dividend of one binade, [1, 2): scaling
//   the dividend by a power of two scales the quotient exactly, so one binade stands for all
//   dividends whose quotient and remainder stay normal;
// - random divisors in [2^-27, 1], and the hardest ones (mantissas of all ones, next to powers
//   of two), the same way;
// - for a few divisors, every fp32 dividend that a square root gives: +0, [2^-75, 2^64], inf and
//   the NaNs.
// Build and run with tools/known_divisor_check.sh [ISA] [STEPS] [RANDOM_DIVISORS]; two threads;
// prints the number of mismatches (0 expected).
#include LOOPS_FILE

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

namespace {

using fused_amp::ops::bits_of;
using fused_amp::ops::float_of;
using fused_amp::ops::VecF;
constexpr int kLanes = VecF::size();

// The dividends [first, last] (as bits, step 1), divided by d both ways; returns the mismatches
// (NaNs compare by bits too: the division keeps the dividend's payload) and prints the first 5.
int64_t mismatches(float d, uint32_t first, uint32_t last) {
  const fused_amp::ops::KnownDivisor k = fused_amp::ops::known_divisor(d);
  int64_t bad = 0;
  alignas(64) float x[kLanes], fast[kLanes];
  for (uint64_t b = first; b <= last; b += kLanes) {
    for (int j = 0; j < kLanes; ++j) x[j] = float_of(static_cast<uint32_t>(std::min<uint64_t>(b + j, last)));
    fused_amp::ops::div_by_(VecF::loadu(x), k).store(fast);
    for (int j = 0; j < kLanes; ++j) {
      const uint32_t want = bits_of(x[j] / d);
      if (bits_of(fast[j]) != want || bits_of(fused_amp::ops::div_by_(x[j], k)) != want) {
        if (bad < 5) std::printf("  d=%a x=%a: %a, want %a\n", d, x[j], fast[j], float_of(want));
        ++bad;
      }
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int randoms = argc > 2 ? std::atoi(argv[2]) : 1000;
  const uint32_t binade_first = bits_of(1.f), binade_last = bits_of(2.f) - 1;
  std::vector<float> divisors;
  for (double beta2 : {0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999}) {
    float last = 0.f;
    for (int t = 1; t <= steps && last != 1.f; ++t) {
      const float d = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
      if (d != last) divisors.push_back(d);
      last = d;
    }
  }
  const size_t adam = divisors.size();
  std::mt19937 gen(0);
  for (int i = 0; i < randoms; ++i) {
    const float m = float_of(bits_of(1.f) | (gen() & 0x7fffffu));  // [1, 2)
    divisors.push_back(std::ldexp(m, -1 - static_cast<int>(gen() % 27)));
  }
  for (int e = 0; e >= -27; --e) {
    divisors.push_back(std::nextafter(std::ldexp(1.f, e), 0.f));  // all ones
    divisors.push_back(std::ldexp(1.f, e));
    divisors.push_back(std::nextafter(std::ldexp(1.f, e), 2.f));
  }
  divisors.push_back(0.f);  // (beta2 = 1: torch refuses it; the quotient is q, inf or NaN, as x / 0)
  int64_t bad_of[2] = {0, 0};
  std::thread other([&] {
    for (size_t i = 1; i < divisors.size(); i += 2) {
      bad_of[1] += mismatches(divisors[i], binade_first, binade_last);
    }
  });
  for (size_t i = 0; i < divisors.size(); i += 2) bad_of[0] += mismatches(divisors[i], binade_first, binade_last);
  other.join();
  const int64_t bad = bad_of[0] + bad_of[1];
  std::printf("divisors: %zu (%zu of Adam's bias corrections), dividends of [1, 2) each: mismatches %lld\n",
              divisors.size(), adam, static_cast<long long>(bad));
  int64_t all_bad = 0;
  const float whole[] = {1.f, std::nextafter(1.f, 0.f), 0.5f, 0.7071068f, 0.03162278f, std::ldexp(1.f, -27)};
  for (float d : whole) {
    all_bad += mismatches(d, bits_of(std::ldexp(1.f, -75)), bits_of(std::ldexp(1.f, 64)));
    all_bad += mismatches(d, bits_of(INFINITY), 0x7fffffffu);
    all_bad += mismatches(d, 0u, 0u);  // +0
  }
  std::printf("6 divisors, every dividend in [2^-75, 2^64], +0, inf and the NaNs: mismatches %lld\n",
              static_cast<long long>(all_bad));
  return bad + all_bad == 0 ? 0 : 1;
}
