/// @file decimal.hpp
/// The library's own spelling of the number and size parsers of tbverbs/sizes.hpp (one parser).
#pragma once

#include "../sizes.hpp"

TBVERBS_NAMESPACE_BEGIN
namespace detail {
using ::tbverbs::parse_decimal;
using ::tbverbs::parse_size;
} // namespace detail
TBVERBS_NAMESPACE_END
