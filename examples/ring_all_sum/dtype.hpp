// Element types of the ring all_sum and their addition (float16 and bfloat16 without compiler
// extensions, so the example builds with any C++20 compiler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ring {

/// Element types the ring can sum. float16 and bfloat16 are stored as 16-bit patterns and added
/// in float32, rounded to nearest even (as MLX does on the CPU).
enum class DType { f32, f64, i32, i64, f16, bf16 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
  case DType::f32:
  case DType::i32: return 4;
  case DType::f64:
  case DType::i64: return 8;
  case DType::f16:
  case DType::bf16: return 2;
  }
  return 1;
}
inline const char* dtype_name(DType t) {
  switch (t) {
  case DType::f32: return "float32";
  case DType::f64: return "float64";
  case DType::i32: return "int32";
  case DType::i64: return "int64";
  case DType::f16: return "float16";
  case DType::bf16: return "bfloat16";
  }
  return "?";
}

/// IEEE binary16 and bfloat16 to and from float (round to nearest even), without compiler
/// extensions, so the example builds with any C++20 compiler.
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man x 2^-24, exact in float
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  const std::uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t float_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t sign = (u >> 16) & 0x8000u, man = u & 0x7fffffu;
  const int e32 = static_cast<int>((u >> 23) & 0xffu);
  if (e32 == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0u));
  const int exp = e32 - 127 + 15;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (exp <= 0) {                                                  // subnormal or zero
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = man | 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(h);
}

/// dst[i] = a[i] + b[i] for `n` elements of `t` (dst may be a).
inline void add(DType t, void* dst, const void* a, const void* b, std::size_t n) {
  auto run = [&](auto* d, const auto* x, const auto* y) {
    for (std::size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
  };
  switch (t) {
  case DType::f32: run(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b)); break;
  case DType::f64: run(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b)); break;
  // Integers wrap (two's complement, as the hardware adds), never signed-overflow UB.
  case DType::i32:
    run(static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(a), static_cast<const std::uint32_t*>(b));
    break;
  case DType::i64:
    run(static_cast<std::uint64_t*>(dst), static_cast<const std::uint64_t*>(a), static_cast<const std::uint64_t*>(b));
    break;
  case DType::f16:
  case DType::bf16: {
    auto* d = static_cast<std::uint16_t*>(dst);
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    if (t == DType::f16)
      for (std::size_t i = 0; i < n; ++i) d[i] = float_to_f16(f16_to_float(x[i]) + f16_to_float(y[i]));
    else
      for (std::size_t i = 0; i < n; ++i) d[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
    break;
  }
  }
}

}  // namespace ring
