// QMESH_SIMD_CLONES: compile a hot loop for AVX-512, AVX2 and the baseline, dispatched at
// load time (GCC/Clang function multi-versioning on x86-64; a no-op elsewhere or under
// sanitizers, whose instrumentation does not mix with ifunc resolvers).
#pragma once

#if defined(__has_feature)  // clang
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define QMESH_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC
#define QMESH_SANITIZED 1
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(QMESH_SANITIZED)
#define QMESH_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QMESH_SIMD_CLONES
#endif
