#pragma once
// The optimizers of the step op: each one's descriptor (ops/optimizer.h) in one list. Adding an
// optimizer is its header and one name here; everything that runs a step is generic over this.
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ops/adadelta.h"
#include "ops/adagrad.h"
#include "ops/adam.h"
#include "ops/adamax.h"
#include "ops/ademamix.h"
#include "ops/lion.h"
#include "ops/muon.h"
#include "ops/nadam.h"
#include "ops/radam.h"
#include "ops/rmsprop.h"
#include "ops/rprop.h"
#include "ops/sgd.h"

namespace fused_amp {

namespace detail {
// The number of members of an aggregate H: the most initializers H{...} takes (C++17, as nvcc
// and the emulator compile it).
struct AnyMember {
  template <class T>
  constexpr operator T() const { return T{}; }
};
template <class H, class Seq, class = void>
struct TakesInitializers : std::false_type {};
template <class H, size_t... I>
struct TakesInitializers<H, std::index_sequence<I...>, std::void_t<decltype(H{(void(I), AnyMember{})...})>>
    : std::true_type {};
template <class H, size_t N = 0>
constexpr size_t member_count() {
  if constexpr (TakesInitializers<H, std::make_index_sequence<N + 1>>::value) return member_count<H, N + 1>();
  else return N;
}
}  // namespace detail

// Whether kHyperFields names every member of Hyper once: a member it misses would stay 0 in every
// step (ops::hyper_of), so OptimizerList refuses to compile that.
template <class Opt>
constexpr bool hyper_fields_complete() {
  using H = typename Opt::Hyper;
  using ops::HyperField, ops::kHyperCount;
  for (int a = 0; a < kHyperCount<Opt>; ++a) {
    for (int b = a + 1; b < kHyperCount<Opt>; ++b) {
      const HyperField<H>&fa = Opt::kHyperFields[a], &fb = Opt::kHyperFields[b];
      if ((fa.real && fa.real == fb.real) || (fa.flag && fa.flag == fb.flag)) return false;
    }
  }
  return static_cast<size_t>(kHyperCount<Opt>) == detail::member_count<H>();
}

template <class... Opts>
struct OptimizerList {
  static_assert((hyper_fields_complete<Opts>() && ...),
                "an optimizer's kHyperFields must name each member of its Hyper once (ops/optimizer.h)");
  static constexpr int size = sizeof...(Opts);
  // Calls f.template operator()<Opt>() for the optimizer named `name`; false when none is.
  template <class F>
  static bool find(const char* name, F&& f) {
    return ((std::strcmp(name, Opts::kName) == 0 ? (f.template operator()<Opts>(), true) : false) || ...);
  }
  // The index of the optimizer named `name` (what StepArgs carries: a step resolves the name
  // once), or -1.
  static int index_of(const char* name) {
    int i = 0, found = -1;
    ((std::strcmp(name, Opts::kName) == 0 ? found = i : 0, ++i), ...);
    return found;
  }
  // Calls f.template operator()<Opt>() for the optimizer at `index`; false when none is.
  template <class F>
  static bool at(int index, F&& f) {
    int i = 0;
    return ((i++ == index ? (f.template operator()<Opts>(), true) : false) || ...);
  }
  // Calls f.template operator()<Opt>() for each optimizer, in order.
  template <class F>
  static void for_each(F&& f) { (f.template operator()<Opts>(), ...); }
  // The index of Opt in the list.
  template <class Opt>
  static constexpr int index() {
    int i = 0, found = -1;
    ((std::is_same_v<Opt, Opts> ? found = i : 0, ++i), ...);
    return found;
  }
};

using Optimizers = OptimizerList<ops::Adam, ops::Sgd, ops::Lion, ops::Adagrad, ops::Rmsprop, ops::Adamax, ops::Radam,
                                 ops::Ademamix, ops::Nadam, ops::MuonMomentum, ops::Adadelta,
                                 ops::Rprop>;

}  // namespace fused_amp
