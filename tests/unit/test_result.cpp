// tbverbs::Result with the project's compiler and standard: the checks shared with the
// backend programs in tests/result/ (which also cover C++23, the forced bundled backend and
// clang-19 with libc++'s std::expected).
#include <catch2/catch_test_macros.hpp>

// Parenthesised: the shared checks use `a && b`, which Catch2 refuses to decompose.
#define RESULT_CHECK(cond) CHECK((cond))
#include "../result/result_checks.hpp"

#include <tbverbs/result.hpp>

#include <memory>
#include <string>
#include <type_traits>

TEST_CASE("Result backend agrees with __cpp_lib_expected and names the inline namespace", "[result]") {
  result_checks::check_backend();
#if defined(TBVERBS_FORCE_BUNDLED_EXPECTED)
  STATIC_CHECK(TBVERBS_EXPECTED_IS_STD == 0);
#elif defined(__cpp_lib_expected) && __cpp_lib_expected >= 202211L
  STATIC_CHECK(TBVERBS_EXPECTED_IS_STD == 1);
#else
  STATIC_CHECK(TBVERBS_EXPECTED_IS_STD == 0);
#endif
}

TEST_CASE("Result<T> holds a value or an Error", "[result]") { result_checks::check_value_form(); }

TEST_CASE("Result<void> is success by default or an Error", "[result]") { result_checks::check_void_form(); }

TEST_CASE("Result<T> and_then / transform / or_else / transform_error", "[result]") {
  result_checks::check_monadic();
}

TEST_CASE("Result<void> and_then / transform / or_else / transform_error", "[result]") {
  result_checks::check_void_monadic();
}

TEST_CASE("unexpected<Error> and fail() carry the error in every value category", "[result]") {
  result_checks::check_unexpected();
}

TEST_CASE("Result of a move-only T (std::unique_ptr) moves and is not copyable", "[result]") {
  result_checks::check_move_only();
  STATIC_CHECK_FALSE(std::is_copy_assignable_v<tbverbs::Result<std::unique_ptr<int>>>);
  STATIC_CHECK(std::is_move_assignable_v<tbverbs::Result<std::unique_ptr<int>>>);
}

TEST_CASE("Result of a non-trivial T (std::string) constructs and destroys in balance", "[result]") {
  result_checks::check_non_trivial();
  STATIC_CHECK(std::is_copy_constructible_v<tbverbs::Result<std::string>>);
}

TEST_CASE("finding 11: Result value() on an error throws bad_expected_access on every backend", "[result][issue8]") {
  result_checks::check_value_on_error_throws();
}

TEST_CASE("Result is [[nodiscard]] and cheap to return", "[result]") {
  // Error is a trivially copyable value, so a failed Result is a few stores, never an allocation.
  STATIC_CHECK(std::is_trivially_copyable_v<tbverbs::Error>);
  STATIC_CHECK(std::is_nothrow_move_constructible_v<tbverbs::Result<int>>);
  STATIC_CHECK(std::is_nothrow_move_constructible_v<tbverbs::Result<void>>);
}
