// Misuse: treating a Result<T> as a T. There is no implicit conversion: the caller must look at
// the error first (or use value()/*, and_then, transform).
#include <tbverbs/error.hpp>
#include <tbverbs/result.hpp>

tbverbs::Result<int> make() { return 7; }

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  const auto r = make();
  const int n = r ? *r : 0;
#else
  const int n = make();
#endif
  return n == 7 ? 0 : 1;
}
