// The Result checks as a self-checking program without Catch2, so the same source builds with
// every backend: Debian's Catch2 is built against libstdc++ and cannot link with libc++, which is
// where std::expected (C++23, monadic) is tested. Prints "N passed, M failed" and exits 1 on any
// failure.
//
// RESULT_TEST_REQUIRE_STD (0 or 1), when defined by the build, is the backend this variant must
// get: a build that silently falls back to the other backend fails instead of passing.
#include <cstdio>

namespace {
int passed = 0;
int failed = 0;
} // namespace

#define RESULT_CHECK(cond)                                                                                   \
  do {                                                                                                       \
    if (cond) {                                                                                              \
      ++passed;                                                                                              \
    } else {                                                                                                 \
      ++failed;                                                                                              \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                                          \
    }                                                                                                        \
  } while (0)

#include "result_checks.hpp"

int main() {
#if defined(__cpp_lib_expected)
  const long lib_expected = __cpp_lib_expected;
#else
  const long lib_expected = 0;
#endif
  std::printf("backend: %s (TBVERBS_EXPECTED_IS_STD=%d, __cpp_lib_expected=%ld, __cplusplus=%ld)\n",
              TBVERBS_EXPECTED_IS_STD ? "std::expected" : "bundled", TBVERBS_EXPECTED_IS_STD, lib_expected,
              static_cast<long>(__cplusplus));
#if defined(RESULT_TEST_REQUIRE_STD)
  RESULT_CHECK(TBVERBS_EXPECTED_IS_STD == RESULT_TEST_REQUIRE_STD);
#endif
  result_checks::run_all();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
