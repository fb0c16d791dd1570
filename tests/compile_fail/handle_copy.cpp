// Misuse: copying a handle. A handle owns one verbs object and destroys it once, so its copy
// constructor is deleted (rule of zero over a move-only owner); moving is the way to pass it on.
// TBVERBS_HANDLE names the handle type under test (tests/compile_fail/CMakeLists.txt).
#include <tbverbs/tbverbs.hpp>

#include <utility>

#ifndef TBVERBS_HANDLE
#define TBVERBS_HANDLE ProtectionDomain
#endif
using Handle = tbverbs::TBVERBS_HANDLE;

Handle& existing(); // declared only: the check never links

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  Handle moved = std::move(existing());
  static_cast<void>(moved);
#else
  Handle copy = existing();
  static_cast<void>(copy);
#endif
  return 0;
}
