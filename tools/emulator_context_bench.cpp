// Why the CUDA emulator (tests/cuda_sim/emulator/fiber.h) runs each CUDA thread as a fiber: the cost of
// one barrier round of a 512-thread block, per thread, with ucontext fibers (a switch into each
// thread and back, as the emulator's scheduler does) and with OS threads meeting at a
// std::barrier. Build and run:
//   g++ -O2 -std=c++20 -pthread tools/emulator_context_bench.cpp -o /tmp/ctx && /tmp/ctx
#include <ucontext.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

constexpr int kThreads = 512, kRounds = 200, kStack = 64 * 1024;
ucontext_t scheduler, fibers[kThreads];
int running;
volatile int sink;

void fiber_body() {
  for (int r = 0; r < kRounds; ++r) {
    sink = r;
    swapcontext(&fibers[running], &scheduler);  // arrive at the barrier
  }
  setcontext(&scheduler);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  std::vector<char> stacks(static_cast<size_t>(kThreads) * kStack);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kThreads; ++i) {
    getcontext(&fibers[i]);
    fibers[i].uc_stack.ss_sp = &stacks[static_cast<size_t>(i) * kStack];
    fibers[i].uc_stack.ss_size = kStack;
    makecontext(&fibers[i], fiber_body, 0);
  }
  for (int r = 0; r <= kRounds; ++r) {
    for (running = 0; running < kThreads; ++running) swapcontext(&scheduler, &fibers[running]);
  }
  const double fiber = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::barrier barrier(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        sink = r;
        barrier.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double os = seconds_since(t0);
  std::printf("ucontext fibers: %.3f us per thread per barrier round\n", fiber / (kThreads * kRounds) * 1e6);
  std::printf("OS threads + std::barrier: %.3f us per thread per barrier round (%.1fx)\n",
              os / (kThreads * kRounds) * 1e6, os / fiber);
}
