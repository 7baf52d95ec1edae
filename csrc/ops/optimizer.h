#pragma once
// What an elementwise optimizer is to the rest of the code: a descriptor struct in its own
// header (ops/adam.h, ...), listed once in optimizers.h. The step op, its validation, the CPU
// loops of every instruction set and storage kind, the CUDA kernel and the Python wrapper are
// generic over it. A descriptor `Opt` (deriving from ops::Elementwise for the defaults) has
//   kName                      the name the step op takes ("adam")
//   kStates, kStateInfo[k]     its per-element states: op list and state key, 8-bit map, rounding bits
//   Hyper, kHyperFields[k]     its hyperparameters: a struct, and each member of it as
//       FA_HYPER(member) (named by the member itself), in the order of the op's `hyper` list;
//       hyper_of<Opt>(list) fills the struct from that list
//   unsigned state_mask(const Hyper&)           which states the step keeps (bit k: state k)
//   bool steps_required(const Hyper&)           whether the step counts must be given (else optional)
//   Coeffs coeffs(const Hyper&, double lr, const TensorStep&, float grad_mult)
//       one tensor's coefficients from its step count before this step (and its scalar state),
//       the grads multiplied by `grad_mult` (1/loss scale times the clip coefficient; Coeffs
//       keeps it as inv_scale)
//   kScalarKey, kScalarInitial, advance(const Hyper&, const TensorStep&)   a per-tensor scalar
//       state (NAdam's mu_product; default none): its state key, its first value (default 1), and
//       its value after the step
//   void update(T& param, T grad, T (&state)[kStates], const C& c)    the math of one element
//   bool has_state(const C&, int k), bool reads_states(const C&)      (defaults: every state, read)
//   void with_fixed_options(const Coeffs&, F&& f)  f(c) or f(a type fixing c's options at compile
//       time, for the CPU loops; default f(c))
//   kWritesOutput              (default false) the optimizer writes no param or master: update()
//       starts from 0 and its result goes to the op's `outputs`, bf16 tensors shaped like the
//       params (Muon's momentum pass, whose result is Newton-Schulz's input)
#include "ops/common.h"

namespace fused_amp::ops {

constexpr int kMaxStates = 3;

struct StateInfo {
  const char* name;  // the op's list of this state ("exp_avgs")
  const char* key;   // its key in the optimizer's state of a param ("exp_avg")
  bool is_signed;    // the 8-bit map: signed (moments) or unsigned (second moments, sums)
  bool high_bits;    // bf16 stochastic rounding takes the high 16 random bits of the element (else low)
};

// What a tensor's coefficients depend on besides the hyperparameters: its step count before this
// step, and its scalar state (1 for an optimizer that keeps none).
struct TensorStep {
  float step;
  float scalar;
};

// One hyperparameter: its name (the member's own, FA_HYPER stringizes it, so that a name and
// the member it sets cannot disagree) and the member of the descriptor's Hyper it sets: a
// double, or a bool (set by a nonzero value).
template <class H>
struct HyperField {
  const char* name;
  double H::*real = nullptr;
  bool H::*flag = nullptr;
  constexpr HyperField(const char* n, double H::*m) : name(n), real(m) {}
  constexpr HyperField(const char* n, bool H::*m) : name(n), flag(m) {}
};
#define FA_HYPER(member) ::fused_amp::ops::HyperField<Hyper>(#member, &Hyper::member)

template <class Opt>
constexpr int kHyperCount = static_cast<int>(sizeof(Opt::kHyperFields) / sizeof(Opt::kHyperFields[0]));

// A descriptor's Hyper from the op's list (host side: the kernels take Coeffs).
template <class Opt>
typename Opt::Hyper hyper_of(const double* values) {
  typename Opt::Hyper h{};
  for (int k = 0; k < kHyperCount<Opt>; ++k) {
    const HyperField<typename Opt::Hyper>& f = Opt::kHyperFields[k];
    if (f.real) h.*f.real = values[k];
    else h.*f.flag = values[k] != 0;
  }
  return h;
}

struct Elementwise {
  static constexpr const char* kScalarKey = nullptr;
  static constexpr double kScalarInitial = 1.0;
  static constexpr bool kWritesOutput = false;
  template <class H>
  FA_HD float advance(const H&, const TensorStep& s) { return s.scalar; }
  template <class C>
  FA_HD bool has_state(const C&, int) { return true; }
  template <class C>
  FA_HD bool reads_states(const C&) { return true; }
  template <class C, class F>
  static void with_fixed_options(const C& c, F&& f) { f(c); }
};

}  // namespace fused_amp::ops
