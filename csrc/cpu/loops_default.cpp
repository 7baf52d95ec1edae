// The portable build of the CPU loops: no instruction set beyond the compiler's baseline.
#define CPU_CAPABILITY DEFAULT
#define FUSED_AMP_NO_FMA
#define CPU_CAPABILITY_DEFAULT
#include "cpu/loops_impl.h"
