#pragma once
// One CUDA thread of the emulator (emulator/block.h) as an execution context of its own: a fiber
// with its own stack, so that a thread can stop at __syncthreads or a warp exchange and go on
// from there once the others have arrived. Fibers rather than OS threads: with fibers the emulator
// alone decides which thread runs next, so every schedule is chosen and reproducible, and they
// are cheaper: a barrier round of a 512-thread block costs 0.36-0.40 us per thread with ucontext
// fibers and 1.7-6.5 us with OS threads meeting at a std::barrier on these 2-core VMs
// (tools/emulator_context_bench.cpp, 4 runs). C++20 coroutines would need co_await in the
// kernels' source.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace fused_amp::emu {

// A fiber's stack, with a guard page below it: an overflow faults instead of writing into the
// stack beside it. 256 KB: a thread's frames hold a copy of the kernel arguments (up to 32 KB of
// launch metadata) and, under AddressSanitizer, their redzones.
class Stack {
 public:
  static constexpr size_t kBytes = 256 * 1024;
  Stack() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    mem_ = mmap(nullptr, kBytes + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem_ == MAP_FAILED) throw std::bad_alloc();
    mprotect(mem_, page_, PROT_NONE);
  }
  ~Stack() { munmap(mem_, kBytes + page_); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  void* bottom() const { return static_cast<char*>(mem_) + page_; }
  // false while a fiber runs on it, true once one has finished: a fiber abandoned mid-kernel
  // (after an error) leaves its frames' redzones poisoned under AddressSanitizer
  bool clean = true;

 private:
  size_t page_;
  void* mem_;
};

// resume() runs the fiber until it calls suspend() (or finish()); suspend() returns to the
// resume() that ran it. Only the scheduler resumes, only the running fiber suspends.
class Fiber {
 public:
  // The fiber will run entry() on `stack` from its first resume(); entry must end in finish().
  void start(Stack& stack, void (*entry)()) {
    stack_ = &stack;
#if defined(__SANITIZE_ADDRESS__)
    if (!stack.clean) __asan_unpoison_memory_region(stack.bottom(), Stack::kBytes);
#endif
    stack.clean = false;
    getcontext(&ctx_);
    ctx_.uc_stack.ss_sp = stack.bottom();
    ctx_.uc_stack.ss_size = Stack::kBytes;
    ctx_.uc_link = nullptr;
    makecontext(&ctx_, entry, 0);
  }
  void resume() {
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, stack_->bottom(), Stack::kBytes);
    swapcontext(&caller_, &ctx_);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    swapcontext(&caller_, &ctx_);
#endif
  }
  // Called first thing on the fiber's stack after each switch into it.
  void arrived() {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake_, &caller_bottom_, &caller_size_);
#endif
  }
  void suspend() {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(&fake_, caller_bottom_, caller_size_);
#endif
    swapcontext(&ctx_, &caller_);
    arrived();
  }
  // The fiber's last switch: it is never resumed again (until start()).
  [[noreturn]] void finish() {
    stack_->clean = true;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(nullptr, caller_bottom_, caller_size_);
#endif
    setcontext(&caller_);
    __builtin_unreachable();
  }

 private:
  Stack* stack_ = nullptr;
  ucontext_t ctx_{}, caller_{};
  void* fake_ = nullptr;
  const void* caller_bottom_ = nullptr;
  size_t caller_size_ = 0;
};

}  // namespace fused_amp::emu
