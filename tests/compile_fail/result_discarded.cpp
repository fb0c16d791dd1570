// Misuse: ignoring a Result. Every tbverbs function returning Result is [[nodiscard]], so
// dropping the error on the floor is a diagnostic (an error under -Werror).
#include <tbverbs/gid.hpp>

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  auto gid = tbverbs::Gid::parse("::ffff:169.254.1.2");
  return gid ? 0 : 1;
#else
  tbverbs::Gid::parse("::ffff:169.254.1.2");
  return 0;
#endif
}
