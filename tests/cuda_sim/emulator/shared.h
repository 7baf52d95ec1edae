#pragma once
// __shared__ memory in the emulator (emulator/block.h): storage per block, and on every access the
// checks of compute-sanitizer's racecheck and initcheck, and a bounds check:
// - a race: an element written by one thread and read or written by another, or read by one and
//   then written by another, between the same two barriers of the block (no __syncthreads orders
//   them); reported with both threads and both source lines;
// - an element read before any thread of the block wrote it (CUDA leaves shared memory
//   uninitialised at the start of a block);
// - an index past an extent of the declared array.
// A kernel declares FA_SHARED(name, T[n]...) (cuda/compat.cuh) and indexes it as an array; here
// the name is a view whose elements are read and written through proxies that do the checks.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "emulator/block.h"

namespace fused_amp::emu {

// "file:line" of a code address, by addr2line over the object that holds it (read only when a
// finding is reported).
inline std::string source_of(const void* pc) {
  Dl_info info{};
  if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "?";
  char cmd[1024];
  const auto offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
  std::snprintf(cmd, sizeof cmd, "addr2line -i -e '%s' 0x%lx 2>/dev/null", info.dli_fname, static_cast<unsigned long>(offset));
  std::string out, line;
  if (FILE* p = popen(cmd, "r")) {
    char buf[512];
    // the innermost frame is this header's proxy; the kernel's line is the one it is inlined into
    while (std::fgets(buf, sizeof buf, p)) {
      line = buf;
      if (!line.empty() && line.back() == '\n') line.pop_back();
      line = line.substr(0, line.find(" (discriminator"));
      if (line.find("emulator/shared.h") == std::string::npos && out.empty()) out = line;
    }
    pclose(p);
  }
  return out.empty() ? "?" : out;
}

// What the checks remember of one element: its last write and the reads since the last barrier.
struct Access {
  static constexpr unsigned kNone = ~0u;
  unsigned epoch = kNone;  // barriers passed when it happened; kNone: never (a write: not written)
  unsigned thread = 0;
  const void* pc = nullptr;
};
struct Shadow {
  Access write, read, other_read;  // other_read: a reader other than `read`'s, in the same epoch
};

template <class E>
struct SharedArray : SharedVariable {
  std::string name;
  std::vector<size_t> extents;
  std::vector<E> data;
  std::vector<Shadow> shadow;

  std::string element(size_t flat) const {
    std::string idx;
    for (size_t k = extents.size(); k-- > 0;) {
      idx = "[" + std::to_string(flat % extents[k]) + "]" + idx;
      flat /= extents[k];
    }
    return name + idx + " (declared at " + to_string(site) + ")";
  }
  [[noreturn]] void race(const char* kind, size_t i, const Access& first, const char* first_what, const void* pc,
                         const char* what) const {
    fail(std::string("race: ") + kind + " hazard on shared " + element(i) + ": " + first_what + " by thread " +
         std::to_string(first.thread) + " at " + source_of(first.pc) + ", " + what + " by thread " +
         std::to_string(Block::current->running()) + " at " + source_of(pc) +
         ", with no __syncthreads between them");
  }

  // noinline: the return address is the kernel's access (the proxy below is always inlined)
  __attribute__((noinline)) E read(size_t i) {
    const void* pc = __builtin_return_address(0);
    Block& b = *Block::current;
    b.maybe_yield();
    Shadow& s = shadow[i];
    const unsigned t = b.running(), e = b.barriers_passed();
    if (s.write.epoch == Access::kNone) fail("init: shared " + element(i) + " read before any thread of the block wrote it, at " + source_of(pc));
    if (s.write.epoch == e && s.write.thread != t) race("read-after-write", i, s.write, "written", pc, "read");
    if (s.read.epoch != e) {
      s.read = {e, t, pc};
      s.other_read.epoch = Access::kNone;
    } else if (s.read.thread != t) {
      s.other_read = {e, t, pc};
    }
    return data[i];
  }
  __attribute__((noinline)) void write(size_t i, E v) {
    const void* pc = __builtin_return_address(0);
    Block& b = *Block::current;
    b.maybe_yield();
    Shadow& s = shadow[i];
    const unsigned t = b.running(), e = b.barriers_passed();
    if (s.write.epoch == e && s.write.thread != t) race("write-after-write", i, s.write, "written", pc, "written");
    for (const Access* r : {&s.read, &s.other_read}) {
      if (r->epoch == e && r->thread != t) race("write-after-read", i, *r, "read", pc, "written");
    }
    s.write = {e, t, pc};
    data[i] = v;
  }
};

// A view of the array (T an array type) or of one element (T its element type).
template <class T, class E>
class SharedView {
 public:
  SharedView(SharedArray<E>* a, size_t flat) : a_(a), flat_(flat) {}

  auto operator[](size_t i) const {
    static_assert(std::is_array_v<T>, "only an array is indexed");
    constexpr size_t n = std::extent_v<T>;
    if (i >= n) {
      fail("bounds: shared " + a_->name + " indexed with " + std::to_string(i) + " past its extent " +
           std::to_string(n) + " (declared at " + to_string(a_->site) + ")");
    }
    return SharedView<std::remove_extent_t<T>, E>(a_, flat_ * n + i);
  }
  // an element: read and written through the checks
  __attribute__((always_inline)) operator E() const { return a_->read(flat_); }
  __attribute__((always_inline)) const SharedView& operator=(E v) const {
    a_->write(flat_, v);
    return *this;
  }
  const SharedView& operator=(const SharedView& o) const { return *this = static_cast<E>(o); }

 private:
  SharedArray<E>* a_;
  size_t flat_;
};

template <class T>
void push_extents(std::vector<size_t>& v) {
  if constexpr (std::is_array_v<T>) {
    v.push_back(std::extent_v<T>);
    push_extents<std::remove_extent_t<T>>(v);
  }
}

// The view of the block's __shared__ T `name` declared at `site`, made by the first of its threads
// to get there. Its storage starts as NaN-like bytes, never read unnoticed (the init check).
template <class T>
SharedView<T, std::remove_all_extents_t<T>> shared(const char* name, Site site) {
  using E = std::remove_all_extents_t<T>;
  Block& b = *Block::current;
  auto* a = static_cast<SharedArray<E>*>(b.shared_at(site));
  if (!a) {
    auto made = std::make_unique<SharedArray<E>>();
    made->site = site;
    made->name = name;
    push_extents<T>(made->extents);
    const size_t count = sizeof(T) / sizeof(E);
    made->data.resize(count);
    std::memset(static_cast<void*>(made->data.data()), 0xff, count * sizeof(E));
    made->shadow.resize(count);
    a = static_cast<SharedArray<E>*>(b.add_shared(std::move(made)));
  }
  return SharedView<T, E>(a, 0);
}

}  // namespace fused_amp::emu
