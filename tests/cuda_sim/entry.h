#pragma once
// What both emulation libraries (harness.cpp, emulator_checks.cpp) export besides their kernels'
// entry points: the text of the last error, and the schedule of the launches that follow.
#include <cstdint>
#include <string>

#include "cuda/compat.cuh"

namespace {

std::string last_error;

// Runs f: 0, or 1 after an exception (an emulator finding, a refused argument), kept in last_error.
template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // namespace

extern "C" {

const char* fa_sim_error() { return last_error.c_str(); }

// The order of the threads between barriers and of the blocks of a launch: 0 in order, 1
// reversed, 2 random from `seed` (emulator/block.h).
void fa_sim_set_schedule(int schedule, uint64_t seed) {
  fused_amp::emu::settings = {static_cast<fused_amp::emu::Schedule>(schedule), seed};
}

}  // extern "C"
