// MMPOST_CPU_CLONES: compile a host kernel once per x86-64 level and let the CPU pick at load
// time (GCC target_clones, an ifunc), so mmpost's own loops vectorize to AVX2/AVX-512 where the
// machine has them while the binary still runs on any x86-64. A file using it should be built
// with -ffp-contract=off (CMakeLists.txt), so that every copy rounds alike: no FMA contraction on
// the levels that have FMA. Empty under the sanitizers (their runtime and ifunc resolvers do not
// mix) and on other compilers and targets.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MMPOST_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMPOST_CPU_CLONES
#endif
