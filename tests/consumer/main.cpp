// A consumer that uses only what README.md tells users: include the umbrella header, call the API.
#if __has_include(<tbverbs/tbverbs.hpp>)
#include <tbverbs/tbverbs.hpp>
#else
// Only while the umbrella header did not exist yet; every tbverbs tree now has it.
#include <tbverbs/error.hpp>
#endif

#include <cerrno>
#include <iostream>

int main() {
  // ibv_modify_qp returns the error number itself (here negated, as some providers do).
  const tbverbs::Error error = tbverbs::Error::from_return(tbverbs::Step::modify_qp_rtr, -EINVAL);
  const tbverbs::Result<int> result = tbverbs::unexpected(error);
  std::cout << "tbverbs consumer (C++ " << __cplusplus << ", std::expected backend "
            << TBVERBS_EXPECTED_IS_STD << ")\n"
            << result.error().message() << '\n';
  return (!result && result.error().is(EINVAL)) ? 0 : 1;
}
