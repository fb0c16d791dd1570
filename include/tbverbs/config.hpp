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

// Which verbs declarations the build uses: the platform's <infiniband/verbs.h> when it is there
// (and TBVERBS_USE_OWN_ABI is not defined), else tbverbs' own (detail/abi_own.hpp). Decided here,
// once, so that detail/abi.hpp and the inline namespace below cannot disagree.
#if !defined(TBVERBS_USE_OWN_ABI) && __has_include(<infiniband/verbs.h>)
/// 1 when the platform's verbs.h is used, 0 when tbverbs' own declarations are.
#define TBVERBS_ABI_FROM_PLATFORM 1
#else
/// 1 when the platform's verbs.h is used, 0 when tbverbs' own declarations are.
#define TBVERBS_ABI_FROM_PLATFORM 0
#endif

// Two translation units built with different -std (and so different Result backends), or one
// with the platform's verbs.h and one with tbverbs' own declarations (TBVERBS_USE_OWN_ABI, or a
// machine without rdma-core's headers), must not silently share one definition of a tbverbs
// type: the backend and the ABI source are part of the inline namespace, so a mix fails to link
// instead of misbehaving.
#if TBVERBS_EXPECTED_IS_STD && TBVERBS_ABI_FROM_PLATFORM
/// The inline namespace of this build: version, Result backend and verbs declarations.
#define TBVERBS_ABI_NAMESPACE v0_1_std_platform_abi
#elif TBVERBS_EXPECTED_IS_STD
/// The inline namespace of this build: version, Result backend and verbs declarations.
#define TBVERBS_ABI_NAMESPACE v0_1_std_own_abi
#elif TBVERBS_ABI_FROM_PLATFORM
/// The inline namespace of this build: version, Result backend and verbs declarations.
#define TBVERBS_ABI_NAMESPACE v0_1_bundled_platform_abi
#else
/// The inline namespace of this build: version, Result backend and verbs declarations.
#define TBVERBS_ABI_NAMESPACE v0_1_bundled_own_abi
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
