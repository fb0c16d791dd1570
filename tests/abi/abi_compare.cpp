// Compares tbverbs' own verbs declarations (tbverbs/detail/abi_own.hpp) with the platform's
// <infiniband/verbs.h> in one translation unit: the two can coexist because tbverbs' names live
// in tbverbs::detail::abi. Every struct's size and alignment, every field's offset, size and kind,
// and every enumerator's value and enum's underlying type are checked at compile time
// (static_assert), and again at run time with one line printed per struct and enum.
// Enumerator completeness is checked in both directions by exhaustive switches, which
// -Wall -Werror (-Wswitch) turns into errors if either header has an enumerator the list lacks.
// Without <infiniband/verbs.h> (install libibverbs-dev) the test reports itself skipped (77).
#include <cstddef>
#include <cstdio>
#include <string_view>
#include <type_traits>
#include <utility>

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define TBV_HAVE_VERBS_H 1
#else
#define TBV_HAVE_VERBS_H 0
#endif

#include <tbverbs/detail/abi_own.hpp>

#include "abi_lists.hpp"

#if !TBV_HAVE_VERBS_H

int main() {
  std::puts("SKIPPED: <infiniband/verbs.h> not found; install libibverbs-dev (rdma-core) to compare "
            "tbverbs' own ABI declarations with it");
  return 77;
}

#else

namespace own = tbverbs::detail::abi;

namespace {

// What a field is, coarsely: layout-compatible fields have the same kind and size.
template <class T> constexpr int kind() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_pointer_v<U>) {
    return 1;
  } else if constexpr (std::is_enum_v<U>) {
    return std::is_signed_v<std::underlying_type_t<U>> ? 2 : 3;
  } else if constexpr (std::is_integral_v<U>) {
    return std::is_signed_v<U> ? 2 : 3;
  } else if constexpr (std::is_array_v<U>) {
    return 10 + kind<std::remove_extent_t<U>>();
  } else if constexpr (std::is_union_v<U>) {
    return 4;
  } else {
    return 5; // struct
  }
}

const char* kind_name(int k) {
  switch (k) {
  case 1:
    return "pointer";
  case 2:
    return "signed";
  case 3:
    return "unsigned";
  case 4:
    return "union";
  case 5:
    return "struct";
  default:
    return k > 10 ? "array" : "?";
  }
}

// ---- compile time ------------------------------------------------------------------------------

#define TBV_STRUCT_ASSERT(T)                                                                                 \
  static_assert(sizeof(own::T) == sizeof(::T), "sizeof " #T);                                                \
  static_assert(alignof(own::T) == alignof(::T), "alignof " #T);                                             \
  static_assert(std::is_standard_layout_v<own::T>, #T " must be standard-layout");                           \
  static_assert(std::is_trivially_copyable_v<own::T>, #T " must be trivially copyable");                     \
  static_assert(std::is_trivially_default_constructible_v<own::T>, #T " must be C-like");                    \
  static_assert(std::is_union_v<own::T> == std::is_union_v<::T>, #T " struct vs union");
TBV_ABI_STRUCTS(TBV_STRUCT_ASSERT)

#define TBV_OWN_MEMBER(T, M) decltype(std::declval<own::T&>().M)
#define TBV_PLATFORM_MEMBER(T, M) decltype(std::declval<::T&>().M)

#define TBV_OPAQUE_ASSERT(T, M)                                                                              \
  static_assert(offsetof(own::T, M) == offsetof(::T, M), "offsetof " #T "." #M);                             \
  static_assert(sizeof(TBV_OWN_MEMBER(T, M)) == sizeof(TBV_PLATFORM_MEMBER(T, M)), "sizeof " #T "." #M);     \
  static_assert(alignof(TBV_OWN_MEMBER(T, M)) <= alignof(own::T), "alignof " #T "." #M);
#define TBV_FIELD_ASSERT(T, M)                                                                               \
  TBV_OPAQUE_ASSERT(T, M)                                                                                    \
  static_assert(kind<TBV_OWN_MEMBER(T, M)>() == kind<TBV_PLATFORM_MEMBER(T, M)>(), "kind " #T "." #M);       \
  static_assert(alignof(TBV_OWN_MEMBER(T, M)) == alignof(TBV_PLATFORM_MEMBER(T, M)), "alignof " #T "." #M);
TBV_ABI_FIELDS(TBV_FIELD_ASSERT, TBV_OPAQUE_ASSERT)

// The opaque pthread members must still be aligned as the real ones.
static_assert(alignof(own::ibv_context) == alignof(::ibv_context));
static_assert(offsetof(own::ibv_context, mutex) % alignof(pthread_mutex_t) == 0);
static_assert(offsetof(own::ibv_cq, cond) % alignof(pthread_cond_t) == 0);
static_assert(offsetof(own::ibv_qp, cond) % alignof(pthread_cond_t) == 0);

#define TBV_ENUMERATOR_ASSERT(N)                                                                             \
  static_assert(static_cast<long long>(own::N) == static_cast<long long>(::N), "value of " #N);
#define TBV_ENUM_ASSERT(E, LIST)                                                                             \
  static_assert(std::is_same_v<std::underlying_type_t<own::E>, std::underlying_type_t<::E>>,                 \
                "underlying type of " #E);                                                                   \
  static_assert(sizeof(own::E) == sizeof(::E), "sizeof " #E);                                                \
  LIST(TBV_ENUMERATOR_ASSERT)
TBV_ABI_ENUMS(TBV_ENUM_ASSERT)

// Exhaustive switches without a default: -Wswitch (in -Wall, an error with -Werror) names any
// enumerator of rdma-core's enum, or of tbverbs' enum, that the list above does not have.
#define TBV_CASE_PLATFORM(N) case ::N:
#define TBV_CASE_OWN(N) case own::N:
#define TBV_ENUM_COVER(E, LIST)                                                                              \
  constexpr bool listed(::E v) {                                                                             \
    switch (v) {                                                                                             \
      LIST(TBV_CASE_PLATFORM)                                                                                \
      return true;                                                                                           \
    }                                                                                                        \
    return false;                                                                                            \
  }                                                                                                          \
  constexpr bool listed(own::E v) {                                                                          \
    switch (v) {                                                                                             \
      LIST(TBV_CASE_OWN)                                                                                     \
      return true;                                                                                           \
    }                                                                                                        \
    return false;                                                                                            \
  }
TBV_ABI_ENUMS(TBV_ENUM_COVER)

// ---- run time ----------------------------------------------------------------------------------

struct FieldRow {
  std::string_view type;
  const char* member;
  std::size_t own_offset, platform_offset, own_size, platform_size;
  int own_kind, platform_kind;
};

#define TBV_FIELD_ROW(T, M)                                                                                  \
  FieldRow{#T,                                                                                               \
           #M,                                                                                               \
           offsetof(own::T, M),                                                                              \
           offsetof(::T, M),                                                                                 \
           sizeof(TBV_OWN_MEMBER(T, M)),                                                                     \
           sizeof(TBV_PLATFORM_MEMBER(T, M)),                                                                \
           kind<TBV_OWN_MEMBER(T, M)>(),                                                                     \
           kind<TBV_PLATFORM_MEMBER(T, M)>()},
#define TBV_OPAQUE_ROW(T, M)                                                                                 \
  FieldRow{#T,                                                                                               \
           #M,                                                                                               \
           offsetof(own::T, M),                                                                              \
           offsetof(::T, M),                                                                                 \
           sizeof(TBV_OWN_MEMBER(T, M)),                                                                     \
           sizeof(TBV_PLATFORM_MEMBER(T, M)),                                                                \
           0,                                                                                                \
           0},
const FieldRow field_rows[] = {TBV_ABI_FIELDS(TBV_FIELD_ROW, TBV_OPAQUE_ROW)};

int check_struct(std::string_view name, std::size_t own_size, std::size_t platform_size,
                 std::size_t own_align, std::size_t platform_align) {
  int failures = 0;
  int fields = 0;
  if (own_size != platform_size || own_align != platform_align) {
    std::printf("FAIL %-18s sizeof %zu vs %zu, alignof %zu vs %zu\n", name.data(), own_size, platform_size,
                own_align, platform_align);
    ++failures;
  }
  for (const FieldRow& f : field_rows) {
    if (f.type != name) {
      continue;
    }
    ++fields;
    if (f.own_offset != f.platform_offset || f.own_size != f.platform_size || f.own_kind != f.platform_kind) {
      std::printf("FAIL %s.%s: offset %zu vs %zu, size %zu vs %zu, kind %s vs %s\n", name.data(), f.member,
                  f.own_offset, f.platform_offset, f.own_size, f.platform_size, kind_name(f.own_kind),
                  kind_name(f.platform_kind));
      ++failures;
    }
  }
  if (failures == 0) {
    std::printf("ok   %-18s sizeof %3zu alignof %zu, %2d fields at rdma-core's offsets\n", name.data(),
                own_size, own_align, fields);
  }
  return failures;
}

template <class Own, class Platform>
int check_enum(const char* name, std::initializer_list<std::pair<Own, Platform>> values) {
  int failures = 0;
  for (const auto& [o, p] : values) {
    if (static_cast<long long>(o) != static_cast<long long>(p) || !listed(o) || !listed(p)) {
      std::printf("FAIL %s: enumerator %lld vs %lld\n", name, static_cast<long long>(o),
                  static_cast<long long>(p));
      ++failures;
    }
  }
  if (!std::is_same_v<std::underlying_type_t<Own>, std::underlying_type_t<Platform>>) {
    std::printf("FAIL %s: underlying types differ\n", name);
    ++failures;
  }
  if (failures == 0) {
    std::printf("ok   %-18s %2zu enumerators, values and underlying type agree\n", name, values.size());
  }
  return failures;
}

} // namespace

int main() {
  std::printf("comparing tbverbs/detail/abi_own.hpp with <infiniband/verbs.h>; "
              "pthread_mutex_t %zu B, pthread_cond_t %zu B\n",
              sizeof(pthread_mutex_t), sizeof(pthread_cond_t));
  int failures = 0;
#define TBV_STRUCT_RUN(T)                                                                                    \
  failures += check_struct(#T, sizeof(own::T), sizeof(::T), alignof(own::T), alignof(::T));
  TBV_ABI_STRUCTS(TBV_STRUCT_RUN)

#define TBV_ENUM_PAIR(N) {own::N, ::N},
#define TBV_ENUM_RUN(E, LIST) failures += check_enum<own::E, ::E>(#E, {LIST(TBV_ENUM_PAIR)});
  TBV_ABI_ENUMS(TBV_ENUM_RUN)

  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

#endif
