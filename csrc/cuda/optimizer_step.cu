// The step of every optimizer of optimizers.h (its math: ops/<name>.h) for every param dtype,
// master kind and state kind (cuda/storage_traits.h), and the step counts' increment after it.
#include "cuda/step.cuh"
#include "optimizers.h"

namespace fused_amp::cuda {

namespace {

// Whether the optimizer keeps a per-tensor scalar state (its list follows the step count's).
template <class Opt>
constexpr int kScalars = Opt::kScalarKey != nullptr;

template <class Opt, typename param_t, class Master, typename state_t>
struct StepFunctor {
  static constexpr int K = Opt::kStates;
  static constexpr int kLists = step_lists(K, kScalars<Opt>);
  static constexpr int kAmaxList = amax_list(K, kScalars<Opt>, kCodes<state_t>);
  static constexpr int kFloat8List = float8_list(K, kScalars<Opt>, kCodes<state_t>);
  typename Opt::Hyper h;
  StepScalars s;
  StateSpec<K> spec;  // the lists of the states kept, their maps and rounding bits (from the host)

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const float* const step_ptr = static_cast<const float*>(meta.ptr[step_list(K)][t]);
    const float step = step_ptr ? *step_ptr : 0.f;  // (SGD without momentum may count none)
    const float scalar = kScalars<Opt> ? *static_cast<const float*>(meta.ptr[step_list(K) + 1][t]) : 1.f;
    const typename Opt::Coeffs c = Opt::coeffs(h, lr_of(s), {step, scalar}, grad_mult_of(s));
    auto pa = param_access<param_t, Master>(meta, t, start, s.write_grads && c.inv_scale != 1.f, kAmaxList,
                                            kFloat8List);
    const StepRounding rounding = rounding_of(s, step + 1.f, start);
    StateSpec<K> kept = spec;
    kept.read = Opt::reads_states(c);
    const auto states = step_states<state_t, K>(meta, t, start, kept, kLists);
    for_each_step_ilp(n, pa.aligned(), states, rounding, [&](const IlpIndex& ix, float (&st)[K][kILP]) {
      float p[kILP], g[kILP];
      pa.load(p, g, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) {
        float e[K];
#pragma unroll
        for (int k = 0; k < K; ++k) e[k] = st[k][j];
        Opt::update(p[j], g[j], e, c);
#pragma unroll
        for (int k = 0; k < K; ++k) st[k][j] = e[k];
      }
      pa.store(p, ix, rounding);
    });
    pa.epilogues.finish();
  }
};

// The launches of one optimizer for one group of params (dispatch_param picks the kind).
template <class Opt>
struct OptimizerLaunch {
  const std::vector<TensorPtrs>& tensors;
  typename Opt::Hyper h;
  const StepScalars& s;
  StateSpec<Opt::kStates> spec;
  cudaStream_t stream;
  template <typename param_t, class Master, typename state_t>
  void run() const {
    using Functor = StepFunctor<Opt, param_t, std::conditional_t<Opt::kWritesOutput, Output, Master>, state_t>;
    static_assert(Functor::kFloat8List + 3 <= kMaxLists,
                  "every list of the optimizer (absmaxes, amax, fp8 copy, scale, inverse) fits TensorPtrs");
    // (every list: a delayed scale's inverse is written by InverseFunctor, an MX copy's scales here)
    apply_step<Functor::kFloat8List + 3, state_t>(tensors, Functor{h, s, spec}, stream);
  }
};

// After a group's update: each tensor's scalar state to its value after the step (lists: step,
// scalar), unless found_inf says overflow. Runs before the step counts' increment.
template <class Opt>
struct AdvanceFunctor {
  typename Opt::Hyper h;
  const float* found_inf;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t, int64_t) const {
    if (threadIdx.x != 0 || (found_inf && *found_inf != 0.f)) return;
    float* const scalar = static_cast<float*>(meta.ptr[1][t]);
    *scalar = Opt::advance(h, {*static_cast<const float*>(meta.ptr[0][t]), *scalar});
  }
};

// After a group's update: each fp8 copy's dequantization scale (lists: scale, inverse), 1 / scale,
// unless found_inf says overflow; once per tensor, empty ones too (MX copies have none).
struct InverseFunctor {
  const float* found_inf;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t, int64_t) const {
    if (threadIdx.x != 0 || (found_inf && *found_inf != 0.f)) return;
    *static_cast<float*>(meta.ptr[1][t]) = 1.f / *static_cast<const float*>(meta.ptr[0][t]);
  }
};

struct IncrementStepFunctor {
  const float* found_inf;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t, int64_t) const {
    if (threadIdx.x != 0 || (found_inf && *found_inf != 0.f)) return;
    *static_cast<float*>(meta.ptr[0][t]) += 1.f;
  }
};

}  // namespace

void step(int optimizer, const StepKind& kind, const std::vector<TensorPtrs>& tensors, const double* hyper,
          const StepScalars& s, cudaStream_t stream) {
  const bool known = Optimizers::at(optimizer, [&]<class Opt>() {
    const typename Opt::Hyper h = ops::hyper_of<Opt>(hyper);
    StateSpec<Opt::kStates> spec{};
    for (int k = 0; k < Opt::kStates; ++k) {
      spec.list[k] = Opt::state_mask(h) >> k & 1u ? kFirstState + k : -1;
      spec.is_signed[k] = Opt::kStateInfo[k].is_signed;
      spec.high_bits[k] = Opt::kStateInfo[k].high_bits;
    }
    const OptimizerLaunch<Opt> launch{tensors, h, s, spec, stream};
    with_state_kind(kind.state, ParamDispatch<OptimizerLaunch<Opt>>{kind, launch});
    if constexpr (kScalars<Opt> != 0) {
      std::vector<TensorPtrs> scalars(tensors.size());
      for (size_t i = 0; i < tensors.size(); ++i) {
        scalars[i] = TensorPtrs{{tensors[i].p[step_list(Opt::kStates)], tensors[i].p[step_list(Opt::kStates) + 1]}, 1};
      }
      multi_tensor_apply<2>(scalars, AdvanceFunctor<Opt>{h, s.found_inf}, stream);
    }
    const int inverse = float8_list(Opt::kStates, kScalars<Opt>, is_quantized(kind.state)) + 2;
    std::vector<TensorPtrs> inverses;
    for (const TensorPtrs& t : tensors) {
      if (t.p[inverse - 1] && t.p[inverse]) inverses.push_back(TensorPtrs{{t.p[inverse - 1], t.p[inverse]}, 1});
    }
    if (!inverses.empty()) multi_tensor_apply<2>(inverses, InverseFunctor{s.found_inf}, stream);
  });
  if (!known) throw std::invalid_argument("fused_amp: no optimizer at index " + std::to_string(optimizer));
}

void increment_steps(const std::vector<TensorPtrs>& steps, const float* found_inf,
                     cudaStream_t stream) {
  multi_tensor_apply<1>(steps, IncrementStepFunctor{found_inf}, stream);
}

}  // namespace fused_amp::cuda
