// Nanoseconds per element of the CPU Adam loop on bf16 params, one thread, no Python: the loop of
// one instruction set (LOOPS_FILE, e.g. cpu/loops_avx2.cpp) on n elements in each memory mode,
// with the grads left unscaled as GradScaler's steps leave them; and on fp32 params with no
// scaler (the offload engines' bare step). A small n keeps the data in
// cache, a large one in memory: equal times mean the loop, not memory, sets the pace.
// Build and run with tools/loop_bench.sh.
#include LOOPS_FILE

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <unistd.h>

namespace {

using fused_amp::cpu::UpdateRange;
using BF16 = c10::BFloat16;
using fused_amp::MasterKind;
using fused_amp::StateKind;

struct Mode {
  const char* name;
  MasterKind master;  // fp32 masters, the remainder or 24-bit masters (storage_kinds.h)
  StateKind state;    // fp32, bf16, 8- or 4-bit codes
  bool stochastic;        // bf16 state and 24-bit masters round stochastically
  bool stochastic_codes;  // so do 8-bit codes
};

// ns per element of `run(r)` for r in [0, reps) over n elements: the median of 7 batches.
template <class Run>
double median_ns_per_element(int64_t n, int reps, Run&& run) {
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) run(r);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    batches.push_back(took.count() / reps / n * 1e9);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

double ns_per_element(const Mode& mode, int64_t n, int reps) {
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<BF16> param(n), grad(n), remainder(n), state16(2 * n);
  std::vector<float> master(n), state32(2 * n, 0.f);
  std::vector<uint8_t> state8(2 * n, 0), remainder8(n, 0);
  const int64_t block = std::max(fused_amp::state_storage(mode.state).block, 1);
  const int64_t blocks = (n + block - 1) / block;
  std::vector<float> absmax(2 * blocks, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = normal(gen);
    param[i] = master[i];
    remainder[i].x = 0;
    grad[i] = 1024.f * normal(gen);
    state16[i] = state16[n + i] = 0.f;
  }
  const bool quantized = fused_amp::is_quantized(mode.state);
  void* state = mode.state == StateKind::BFloat16 ? static_cast<void*>(state16.data())
                : quantized                       ? static_cast<void*>(state8.data())
                                                  : static_cast<void*>(state32.data());
  const int64_t state_bytes = n * fused_amp::state_storage(mode.state).bits / 8;
  void* masters = mode.master == MasterKind::Remainder ? static_cast<void*>(remainder.data())
                  : mode.master == MasterKind::Remainder8 ? static_cast<void*>(remainder8.data())
                                                          : static_cast<void*>(master.data());
  const UpdateRange<BF16> range{param.data(), grad.data(), mode.master, masters,
                                {state, static_cast<char*>(state) + state_bytes, nullptr},
                                quantized ? absmax.data() : nullptr, quantized ? blocks : 0, n, 0, 12345u,
                                mode.stochastic, mode.stochastic_codes, true};
  const fused_amp::ops::AdamHyper hyper{0.9, 0.999, 1e-8, 0.0, false, false, false};
  // 1/scale alternates between 2^-10 and 2^10, so that the grads left unscaled stay where they were
  const fused_amp::ops::AdamCoeffs down = fused_amp::ops::adam_coeffs(hyper, 1e-3, 10.0, 1.f / 1024.f);
  const fused_amp::ops::AdamCoeffs up = fused_amp::ops::adam_coeffs(hyper, 1e-3, 10.0, 1024.f);
  using fused_amp::Optimizers;
  const auto step = fused_amp::cpu::CPU_CAPABILITY::loops().step[Optimizers::index<fused_amp::ops::Adam>()]
                        .on_bfloat16[static_cast<int>(mode.state)];
  return median_ns_per_element(n, reps, [&](int r) { step(range, r % 2 ? &up : &down); });
}

// The offload engines' bare step: fp32 params, no master, fp32 state, no scaler (grads read only).
double ns_per_element_fp32(int64_t n, int reps) {
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> param(n), grad(n), state(2 * n, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    param[i] = normal(gen);
    grad[i] = 1e-3f * normal(gen);
  }
  const UpdateRange<float> range{param.data(), grad.data(), MasterKind::None, nullptr,
                                 {state.data(), state.data() + n, nullptr}, nullptr, 0, n, 0, 12345u,
                                 false, false, false};
  const fused_amp::ops::AdamHyper hyper{0.9, 0.999, 1e-8, 0.0, false, false, false};
  const fused_amp::ops::AdamCoeffs coeffs = fused_amp::ops::adam_coeffs(hyper, 1e-3, 10.0, 1.f);
  using fused_amp::Optimizers;
  const auto step = fused_amp::cpu::CPU_CAPABILITY::loops().step[Optimizers::index<fused_amp::ops::Adam>()]
                        .on_float[static_cast<int>(StateKind::Fp32)];
  return median_ns_per_element(n, reps, [&](int) { step(range, &coeffs); });
}

// The parts of the 8-bit state's cost, ns per element of one state in cache (8,192 elements of
// Adam-like moments): codes to fp32 values, a quant block's absmax, values to codes (the absmax
// included) to nearest and stochastically (given the random bits), and the random bits (one
// hash per element for all its states), for the signed map (exp_avg) and the unsigned one (exp_avg_sq).
void quantization_parts() {
  namespace loops = fused_amp::cpu::CPU_CAPABILITY;
  constexpr int64_t n = 8192, block = fused_amp::ops::kQuantBlock;
  constexpr int reps = 4000;
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> m(n), v(n), out(n), absmax(n / block);
  std::vector<uint8_t> codes(n);
  for (int64_t i = 0; i < n; ++i) {
    m[i] = 1e-3f * normal(gen);
    v[i] = m[i] * m[i] * 10.f;
  }
  auto time = [&](auto&& body) {
    return median_ns_per_element(n, reps, [&](int) {
      for (int64_t q = 0; q < n; q += block) body(q);
    });
  };
  std::printf("\n8-bit state, its parts: ns per element of one state (8,192 elements, in cache)\n");
  std::printf("%-24s %14s %14s\n", "part", "signed (m)", "unsigned (v)");
  volatile float sink = 0.f;
  const double absmax_ns = time([&](int64_t q) { sink = loops::block_absmax(m.data() + q, block); });
  std::printf("%-24s %14.3f %14s\n", "block absmax", absmax_ns, "(same)");
  std::vector<uint32_t> random(n);
  loops::fill_rounding_bits(12345u, 0, n, random.data());
  auto quantize = [&](const std::vector<float>& x, auto is_signed, bool stochastic) {
    return time([&](int64_t q) {
      loops::Codes<fused_amp::ops::Quant8>{}.quantize(x.data() + q, block, codes.data() + q, &absmax[q / block],
                              stochastic ? random.data() + q : nullptr, decltype(is_signed)::value);
    });
  };
  const double quantize_m = quantize(m, std::true_type{}, false);
  const double quantize_v = quantize(v, std::false_type{}, false);
  const double stochastic_m = quantize(m, std::true_type{}, true);
  const double stochastic_v = quantize(v, std::false_type{}, true);
  const double bits_ns = time([&](int64_t q) { loops::fill_rounding_bits(12345u, q, block, random.data() + q); });
  const double dequantize_m = time([&](int64_t q) { loops::Codes<fused_amp::ops::Quant8>{}.dequantize(codes.data() + q, absmax[q / block], block, true, out.data() + q); });
  const double dequantize_v = time([&](int64_t q) { loops::Codes<fused_amp::ops::Quant8>{}.dequantize(codes.data() + q, absmax[q / block], block, false, out.data() + q); });
  std::printf("%-24s %14.3f %14.3f\n", "quantize (with absmax)", quantize_m, quantize_v);
  std::printf("%-24s %14.3f %14.3f\n", "quantize, stochastic", stochastic_m, stochastic_v);
  std::printf("%-24s %14.3f %14s\n", "random bits (both)", bits_ns, "(same)");
  std::printf("%-24s %14.3f %14.3f\n", "dequantize", dequantize_m, dequantize_v);
}

// Elements "in memory": 4M, or past 4x the last-level cache where it is larger (a Xeon's 480 MB
// L3 holds 4M elements of every mode).
int64_t memory_elements() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<int64_t>(4 << 20, l3 > 0 ? l3 / 4 / 8192 * 8192 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  // a mode's name: time that mode alone ("8-bit parts": the parts of the 8-bit state's cost)
  const char* only = argc > 1 ? argv[1] : nullptr;
  constexpr MasterKind kFp32 = MasterKind::Fp32, k16 = MasterKind::Remainder, k24 = MasterKind::Remainder8;
  const Mode modes[] = {{"fp32 masters", kFp32, StateKind::Fp32, false, false},
                        {"remainder", k16, StateKind::Fp32, false, false},
                        {"bf16 state", kFp32, StateKind::BFloat16, false, false},
                        {"bf16 state, stochastic", kFp32, StateKind::BFloat16, true, false},
                        {"remainder + bf16 state", k16, StateKind::BFloat16, false, false},
                        {"8-bit state", kFp32, StateKind::Codes8, false, false},
                        {"8-bit, stochastic", kFp32, StateKind::Codes8, true, true},
                        {"remainder + 8-bit state", k16, StateKind::Codes8, false, false},
                        {"24-bit masters", k24, StateKind::Fp32, true, false},
                        {"24-bit, nearest", k24, StateKind::Fp32, false, false},
                        {"24-bit + 8-bit state", k24, StateKind::Codes8, true, false},
                        {"4-bit state", kFp32, StateKind::Codes4, false, false},
                        {"24-bit + 4-bit state", k24, StateKind::Codes4, true, false}};
  std::printf("%s loops, one thread: ns per element, median of 7 batches\n",
              fused_amp::cpu::CPU_CAPABILITY::loops().isa);
  const int64_t n_memory = memory_elements();
  char memory_label[32];
  std::snprintf(memory_label, sizeof memory_label, "%lldM (memory)", static_cast<long long>(n_memory >> 20));
  std::printf("%-24s %14s %14s\n", "mode", "8,192 (cache)", memory_label);
  for (const Mode& mode : modes) {
    if (only && std::strcmp(only, mode.name) != 0) continue;
    std::printf("%-24s %14.3f %14.3f\n", mode.name, ns_per_element(mode, 8192, 2000),
                ns_per_element(mode, n_memory, 6));
  }
  if (!only || std::strcmp(only, "fp32 params, bare") == 0) {
    std::printf("%-24s %14.3f %14.3f\n", "fp32 params, bare", ns_per_element_fp32(8192, 2000),
                ns_per_element_fp32(n_memory, 6));
  }
  if (!only || std::strcmp(only, "8-bit parts") == 0) quantization_parts();
  return 0;
}
