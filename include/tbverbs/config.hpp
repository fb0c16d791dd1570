/// @file config.hpp
/// Version, the expected-backend switch and the versioned inline namespace.
#pragma once

#include <version>

/// Major version of tbverbs.
#define TBVERBS_VERSION_MAJOR 0
/// Minor version of tbverbs.
#define TBVERBS_VERSION_MINOR 1
/// Patch version of tbverbs.
#define TBVERBS_VERSION_PATCH 0

// The standard std::expected is used only when it has the monadic members (P2505, 202211L);
// g++ 12's libstdc++ reports 202202L and lacks them, so it gets the bundled equivalent.
// Define TBVERBS_FORCE_BUNDLED_EXPECTED to use the bundled one everywhere.
#if !defined(TBVERBS_FORCE_BUNDLED_EXPECTED) && defined(__cpp_lib_expected) && __cpp_lib_expected >= 202211L
/// 1 when tbverbs::Result is std::expected, 0 when it is the bundled equivalent.
#define TBVERBS_EXPECTED_IS_STD 1
#else
/// 1 when tbverbs::Result is std::expected, 0 when it is the bundled equivalent.
#define TBVERBS_EXPECTED_IS_STD 0
#endif

// Two translation units built with different -std (and so different Result backends) must not
// silently share one definition of a tbverbs type: the backend is part of the inline namespace,
// so a mix fails to link instead of misbehaving.
#if TBVERBS_EXPECTED_IS_STD
/// The inline namespace of this build: version and Result backend.
#define TBVERBS_ABI_NAMESPACE v0_1_std
#else
/// The inline namespace of this build: version and Result backend.
#define TBVERBS_ABI_NAMESPACE v0_1_bundled
#endif

/// Opens tbverbs' versioned namespace.
#define TBVERBS_NAMESPACE_BEGIN                                                                   \
  namespace tbverbs {                                                                             \
  inline namespace TBVERBS_ABI_NAMESPACE {
/// Closes tbverbs' versioned namespace.
#define TBVERBS_NAMESPACE_END                                                                     \
  }                                                                                               \
  }

/// tbverbs: a header-only C++20 wrapper over RDMA verbs.
namespace tbverbs {
/// The versioned inline namespace (version and Result backend); never name it directly.
inline namespace TBVERBS_ABI_NAMESPACE {}
} // namespace tbverbs
