#pragma once
// The optimizers of the step op: each one's descriptor (ops/optimizer.h) in one list. Adding an
// optimizer is its header and one name here; everything that runs a step is generic over this.
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

template <class... Opts>
struct OptimizerList {
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
