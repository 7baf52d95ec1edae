#pragma once
// The CUDA execution model on the CPU, for the kernels compiled with FUSED_AMP_HOST_SIM
// (cuda/compat.cuh maps CUDA's names here). A launch runs its blocks one after another; in a
// block every CUDA thread is a fiber (emulator/fiber.h), so that
// - __syncthreads() is a real barrier: a thread stops there until every thread of the block has
//   arrived at the same __syncthreads;
// - a warp exchange (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync) stops a lane until
//   every lane its mask names has arrived at the same call, then hands each lane what CUDA
//   defines for it.
// Between those points the threads run in the order of the schedule (in order, reversed, or
// seeded random, which also switches threads at every shared-memory access), and so do the blocks
// of a launch. What compute-sanitizer's synccheck finds is an error here: a barrier that some
// threads of the block never reach (they exited, or wait at another __syncthreads or exchange), a
// lane that calls an exchange its mask leaves out, a mask naming a lane that never arrives or
// that the block does not have, a lane reading from a lane outside the mask. The races and
// uninitialised reads of shared memory are checked by emulator/shared.h. An error stops the
// launch and is thrown to the host as emu::Error, with the threads and source lines involved.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulator/fiber.h"

struct FaDim3 {
  unsigned x = 0, y = 0, z = 0;
};
// CUDA's built-in variables: threadIdx is set to the running thread's before it resumes.
inline FaDim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

namespace fused_amp::emu {

// Where in the source a thread is (a barrier, an exchange).
struct Site {
  const char* file;
  int line;
};
inline std::string to_string(const Site& s) { return std::string(s.file) + ":" + std::to_string(s.line); }
inline bool operator==(const Site& a, const Site& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// What the tests see of a finding: the first line names its kind (race, barrier, warp, ...).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "0-31, 64, 96-127": a list of thread indices, for the reports.
inline std::string ranges(const std::vector<unsigned>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return out;
}

// "0x0000ffff": a warp mask, for the reports.
inline std::string hex(unsigned mask) {
  char out[16];
  std::snprintf(out, sizeof out, "0x%08x", mask);
  return out;
}

enum class Schedule : int { InOrder = 0, Reversed = 1, Random = 2 };
struct Settings {
  Schedule schedule = Schedule::InOrder;
  uint64_t seed = 0;
  uint64_t launches = 0;  // since the settings were set: each launch draws its own random orders
};
inline Settings settings;  // set by the tests between launches

enum class WarpOp : int { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All };
inline const char* name_of(WarpOp op) {
  static const char* const names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                      "__ballot_sync", "__any_sync", "__all_sync"};
  return names[static_cast<int>(op)];
}

// One CUDA thread of the running block.
struct Thread {
  enum class State { Ready, AtBarrier, InExchange, Exited };
  Fiber fiber;
  State state = State::Ready;
  Site site{"", 0};  // where it waits
  // its part in a warp exchange
  WarpOp op = WarpOp::ShflIdx;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = warpSize;
};

// A __shared__ variable of the running block (emulator/shared.h): storage and its shadow.
struct SharedVariable {
  virtual ~SharedVariable() = default;
  Site site{"", 0};
};

class Block {
 public:
  static inline Block* current = nullptr;  // the block being run

  // Runs fn(arg) as each of `threads` threads of block `index`, in the schedule's order (its
  // random orders drawn from the launch's seed).
  static void run(unsigned index, unsigned threads, uint64_t launch_seed, void (*fn)(const void*), const void* arg);

  unsigned barriers_passed() const { return epoch_; }
  unsigned running() const { return running_; }
  std::string where() const { return "thread " + std::to_string(running_) + " of block " + std::to_string(index_); }
  // The block's __shared__ variable declared at `site`, or null before its first thread gets there.
  SharedVariable* shared_at(Site site) const {
    for (const auto& v : shared_) {
      if (v->site == site) return v.get();
    }
    return nullptr;
  }
  SharedVariable* add_shared(std::unique_ptr<SharedVariable> v) { return shared_.emplace_back(std::move(v)).get(); }

  // ---- called by the running thread ----
  void syncthreads(Site site) {
    Thread& t = threads_[running_];
    t.state = Thread::State::AtBarrier;
    t.site = site;
    t.fiber.suspend();
  }
  uint64_t exchange(Site site, WarpOp op, unsigned mask, uint64_t value, int arg, int width);
  // Under the random schedule, lets other threads run here half of the time.
  void maybe_yield() {
    if (settings.schedule == Schedule::Random && rng_() % 2) threads_[running_].fiber.suspend();
  }

 private:
  static void entry();
  void schedule();
  void complete_barrier();
  bool try_complete_exchange(unsigned warp0, const Thread& caller);
  [[noreturn]] void stalled() const;
  std::string state_of(unsigned tid) const;

  unsigned index_ = 0, running_ = 0, epoch_ = 0;
  std::vector<Thread> threads_;
  std::vector<std::unique_ptr<SharedVariable>> shared_;
  void (*fn_)(const void*) = nullptr;
  const void* arg_ = nullptr;
  std::string failure_;  // the first error a thread threw
  std::mt19937_64 rng_;
};

// Device code's way to report a finding: it ends the running thread and then the launch.
[[noreturn]] inline void fail(const std::string& what) { throw Error(what + " (" + Block::current->where() + ")"); }

// The order in which the block's ready threads (or a launch's blocks) are taken.
inline std::vector<unsigned> schedule_order(unsigned n, std::mt19937_64& rng) {
  std::vector<unsigned> v(n);
  for (unsigned i = 0; i < n; ++i) v[i] = i;
  if (settings.schedule == Schedule::Reversed) std::reverse(v.begin(), v.end());
  if (settings.schedule == Schedule::Random) std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// The fibers' stacks, kept from block to block (256 KB of address space each; pages are
// committed as they are touched).
inline Stack& stack(unsigned i) {
  static std::vector<std::unique_ptr<Stack>> pool;
  while (pool.size() <= i) pool.push_back(std::make_unique<Stack>());
  return *pool[i];
}

inline void Block::run(unsigned index, unsigned threads, uint64_t launch_seed, void (*fn)(const void*),
                       const void* arg) {
  Block b;
  b.index_ = index;
  b.fn_ = fn;
  b.arg_ = arg;
  b.rng_.seed(launch_seed * 0x9e3779b97f4a7c15ull + index);
  b.threads_.resize(threads);
  for (unsigned i = 0; i < threads; ++i) b.threads_[i].fiber.start(stack(i), &Block::entry);
  struct Current {
    Block* prev;
    ~Current() { Block::current = prev; }
  } restore{current};
  current = &b;
  b.schedule();
}

inline void Block::entry() {
  Block& b = *current;
  Thread& t = b.threads_[b.running_];
  t.fiber.arrived();
  try {
    b.fn_(b.arg_);
  } catch (const std::exception& e) {
    if (b.failure_.empty()) b.failure_ = e.what();
  }
  t.state = Thread::State::Exited;
  t.fiber.finish();
}

inline void Block::schedule() {
  const unsigned n = static_cast<unsigned>(threads_.size());
  for (;;) {
    bool ran = false;
    for (unsigned i : schedule_order(n, rng_)) {
      if (threads_[i].state != Thread::State::Ready) continue;
      running_ = i;
      threadIdx = {i, 0, 0};
      threads_[i].fiber.resume();
      ran = true;
      if (!failure_.empty()) throw Error(failure_);
    }
    if (ran) continue;
    bool all_exited = true, exchange = false;
    for (const Thread& t : threads_) {
      all_exited = all_exited && t.state == Thread::State::Exited;
      exchange = exchange || t.state == Thread::State::InExchange;
    }
    if (all_exited) return;
    if (exchange) stalled();
    complete_barrier();
  }
}

// Every thread that has not exited waits at a __syncthreads: it completes when all of them wait
// at the same one and none has exited (CUDA leaves a barrier that some threads skip undefined).
inline void Block::complete_barrier() {
  std::vector<unsigned> exited;
  std::vector<std::pair<Site, std::vector<unsigned>>> sites;
  for (unsigned i = 0; i < threads_.size(); ++i) {
    const Thread& t = threads_[i];
    if (t.state == Thread::State::Exited) {
      exited.push_back(i);
      continue;
    }
    auto at = std::find_if(sites.begin(), sites.end(), [&](const auto& s) { return s.first == t.site; });
    if (at == sites.end()) at = sites.insert(sites.end(), {t.site, {}});
    at->second.push_back(i);
  }
  const std::string block = "block " + std::to_string(index_);
  if (!exited.empty()) {
    throw Error("barrier: __syncthreads at " + to_string(sites[0].first) + " reached by threads " +
                ranges(sites[0].second) + " of " + block + ", never by threads " + ranges(exited) +
                " (they exited)");
  }
  if (sites.size() > 1) {
    std::string list;
    for (const auto& s : sites) list += "\n  " + to_string(s.first) + ": threads " + ranges(s.second);
    throw Error("barrier: the threads of " + block + " wait at different __syncthreads (divergent):" + list);
  }
  ++epoch_;
  for (Thread& t : threads_) t.state = Thread::State::Ready;
}

inline std::string Block::state_of(unsigned tid) const {
  const Thread& t = threads_[tid];
  switch (t.state) {
    case Thread::State::Exited: return "exited";
    case Thread::State::AtBarrier: return "waits at __syncthreads " + to_string(t.site);
    case Thread::State::InExchange: return std::string("waits at ") + name_of(t.op) + " " + to_string(t.site);
    default: return "runs";
  }
}

// No thread can run, and some wait in a warp exchange that will never complete.
inline void Block::stalled() const {
  for (unsigned i = 0; i < threads_.size(); ++i) {
    const Thread& t = threads_[i];
    if (t.state != Thread::State::InExchange) continue;
    const unsigned warp0 = i - i % warpSize;
    std::string missing;
    for (unsigned j = 0; j < warpSize; ++j) {
      const Thread& o = threads_[warp0 + j];
      if (!(t.mask >> j & 1u) || (o.state == Thread::State::InExchange && o.site == t.site)) continue;
      missing += "\n  lane " + std::to_string(j) + " (thread " + std::to_string(warp0 + j) + ") " + state_of(warp0 + j);
    }
    throw Error(std::string("warp: ") + name_of(t.op) + " at " + to_string(t.site) + " with mask " + hex(t.mask) +
                " in block " + std::to_string(index_) + " waits for lanes that never arrive:" + missing);
  }
  throw Error("emulator: no thread can run");
}

inline uint64_t Block::exchange(Site site, WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  const unsigned lane = running_ % warpSize, warp0 = running_ - lane;
  if (!(mask >> lane & 1u)) {
    fail(std::string("warp: lane ") + std::to_string(lane) + " calls " + name_of(op) + " at " + to_string(site) +
         " with mask " + hex(mask) + ", which leaves it out");
  }
  if (width <= 0 || width > warpSize || (width & (width - 1))) {
    fail(std::string("warp: ") + name_of(op) + " at " + to_string(site) + ": width " + std::to_string(width) +
         " is not a power of 2 up to 32");
  }
  for (unsigned j = 0; j < warpSize; ++j) {
    if ((mask >> j & 1u) && warp0 + j >= threads_.size()) {
      fail(std::string("warp: ") + name_of(op) + " at " + to_string(site) + ": mask " + hex(mask) + " names lane " +
           std::to_string(j) + ", which a block of " + std::to_string(threads_.size()) + " threads does not have");
    }
  }
  Thread& t = threads_[running_];
  t.state = Thread::State::InExchange;
  t.site = site;
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  if (!try_complete_exchange(warp0, t)) t.fiber.suspend();
  return t.result;
}

// The lane whose value lane j receives in a shuffle (CUDA's definitions; a lane past its group
// of `width` lanes reads its own value).
inline unsigned source_lane(WarpOp op, unsigned j, int arg, int width) {
  const unsigned w = static_cast<unsigned>(width), group = j & ~(w - 1);
  switch (op) {
    case WarpOp::ShflIdx: return group + (static_cast<unsigned>(arg) & (w - 1));
    case WarpOp::ShflUp: return (j & (w - 1)) >= static_cast<unsigned>(arg) ? j - arg : j;
    case WarpOp::ShflDown: return (j & (w - 1)) + arg < w ? j + arg : j;
    default: {  // xor: later groups are out of reach
      const unsigned s = j ^ static_cast<unsigned>(arg);
      return s < warpSize && (s & ~(w - 1)) <= group ? s : j;
    }
  }
}

// Completes the exchange when every lane of the caller's mask has arrived at the same call.
inline bool Block::try_complete_exchange(unsigned warp0, const Thread& caller) {
  const unsigned mask = caller.mask;
  for (unsigned j = 0; j < warpSize; ++j) {
    if (!(mask >> j & 1u)) continue;
    const Thread& o = threads_[warp0 + j];
    if (o.state != Thread::State::InExchange || !(o.site == caller.site) || o.op != caller.op || o.mask != mask) {
      return false;
    }
  }
  uint64_t votes = 0;
  for (unsigned j = 0; j < warpSize; ++j) {
    if ((mask >> j & 1u) && threads_[warp0 + j].value) votes |= 1ull << j;
  }
  for (unsigned j = 0; j < warpSize; ++j) {
    if (!(mask >> j & 1u)) continue;
    Thread& o = threads_[warp0 + j];
    switch (o.op) {
      case WarpOp::Ballot: o.result = votes; break;
      case WarpOp::Any: o.result = votes != 0; break;
      case WarpOp::All: o.result = votes == mask; break;
      default: {
        const unsigned src = source_lane(o.op, j, o.arg, o.width);
        if (!(mask >> src & 1u)) {
          fail(std::string("warp: lane ") + std::to_string(j) + " reads lane " + std::to_string(src) + " in " +
               name_of(o.op) + " at " + to_string(o.site) + ", which the mask " + hex(mask) + " leaves out");
        }
        o.result = threads_[warp0 + src].value;
      }
    }
  }
  for (unsigned j = 0; j < warpSize; ++j) {
    if (mask >> j & 1u) threads_[warp0 + j].state = Thread::State::Ready;
  }
  return true;
}

// ---- the CUDA names (cuda/compat.cuh maps them here) ----

template <class K>
void launch(unsigned grid, unsigned block, const K& kernel_call) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  const uint64_t seed = settings.seed * 0x2545f4914f6cdd1dull + settings.launches++;
  std::mt19937_64 rng(seed);
  for (unsigned b : schedule_order(grid, rng)) {
    blockIdx = {b, 0, 0};
    Block::run(b, block, seed, [](const void* k) { (*static_cast<const K*>(k))(); }, &kernel_call);
  }
}

inline void syncthreads(Site site) { Block::current->syncthreads(site); }

template <class T>
T exchange(Site site, WarpOp op, unsigned mask, T var, int arg, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffled value is at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = Block::current->exchange(site, op, mask, bits, arg, width);
  std::memcpy(&var, &bits, sizeof(T));
  return var;
}
inline unsigned vote(Site site, WarpOp op, unsigned mask, int predicate) {
  return static_cast<unsigned>(Block::current->exchange(site, op, mask, predicate != 0, 0, warpSize));
}

}  // namespace fused_amp::emu
