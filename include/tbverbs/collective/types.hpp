/// @file collective/types.hpp
/// Element types and reduction operators of the collectives layer: `DType`, the 16-bit float
/// types `float16` and `bfloat16`, `ReduceOp`, and `reduce()`, the one kernel every algorithm
/// combines two vectors with.
///
/// Results are bitwise the same on every rank: each algorithm combines the ranks' vectors in one
/// order that every rank follows (docs/collectives.md, "Results"), and the kernels below are plain
/// element-wise loops with no reassociation. Integers wrap (two's complement, as the hardware
/// adds and multiplies), never signed-overflow UB; 16-bit floats are combined in float32 and
/// rounded to nearest even, as MLX does on the CPU.
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

TBVERBS_NAMESPACE_BEGIN

/// IEEE 754 binary16, stored as its 16-bit pattern (no compiler extension needed). Converts to
/// and from float (round to nearest even); the collectives combine it in float32.
struct float16 {
  std::uint16_t bits = 0; ///< The binary16 bit pattern.
  /// The pattern `b` as is.
  static constexpr float16 from_bits(std::uint16_t b) noexcept { return float16{b}; }
  /// The value nearest to `f` (ties to even; overflow to infinity; NaN stays NaN).
  static float16 from_float(float f) noexcept;
  /// The exact float value.
  float to_float() const noexcept;
  friend constexpr bool operator==(float16 a, float16 b) noexcept { return a.bits == b.bits; }
};

/// bfloat16 (the top half of a float32), stored as its 16-bit pattern. Converts to and from float
/// (round to nearest even; NaN stays NaN); the collectives combine it in float32.
struct bfloat16 {
  std::uint16_t bits = 0; ///< The bfloat16 bit pattern.
  /// The pattern `b` as is.
  static constexpr bfloat16 from_bits(std::uint16_t b) noexcept { return bfloat16{b}; }
  /// The value nearest to `f`.
  static bfloat16 from_float(float f) noexcept {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bfloat16{static_cast<std::uint16_t>(u >> 16)};
  }
  /// The exact float value.
  float to_float() const noexcept {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

inline float float16::to_float() const noexcept {
  const std::uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1fu, man = bits & 0x3ffu;
  if (exp == 0) { // zero or subnormal: man x 2^-24, exact in float
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  const std::uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float16 float16::from_float(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t sign = (u >> 16) & 0x8000u, man = u & 0x7fffffu;
  const int e32 = static_cast<int>((u >> 23) & 0xffu);
  if (e32 == 0xff) return float16{static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0u))};
  const int exp = e32 - 127 + 15;
  if (exp >= 31) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)}; // overflow: infinity
  if (exp <= 0) {                                                            // subnormal or zero
    if (exp < -10) return float16{static_cast<std::uint16_t>(sign)};
    const std::uint32_t m = man | 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return float16{static_cast<std::uint16_t>(sign | h)};
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; // may carry into the exponent: correct
  return float16{static_cast<std::uint16_t>(h)};
}

/// The element types the collectives move and combine. The values are the call header's wire
/// codes (collective/call.hpp): new types are appended, never renumbered.
enum class DType : std::uint8_t { f32, f64, i32, i64, f16, bf16, i8, u8, u32, u64 };

/// The last DType (the call header refuses codes past it).
inline constexpr DType last_dtype = DType::u64;

/// Bytes of one element of `t`.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
  case DType::i8:
  case DType::u8: return 1;
  case DType::f16:
  case DType::bf16: return 2;
  case DType::f32:
  case DType::i32:
  case DType::u32: return 4;
  case DType::f64:
  case DType::i64:
  case DType::u64: return 8;
  }
  return 1;
}

/// "float32", "float64", "int32", "int64", "float16", "bfloat16", "int8", "uint8", "uint32",
/// "uint64" (the names torch and numpy give them).
constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
  case DType::f32: return "float32";
  case DType::f64: return "float64";
  case DType::i32: return "int32";
  case DType::i64: return "int64";
  case DType::f16: return "float16";
  case DType::bf16: return "bfloat16";
  case DType::i8: return "int8";
  case DType::u8: return "uint8";
  case DType::u32: return "uint32";
  case DType::u64: return "uint64";
  }
  return "?";
}

/// The DType of a C++ element type; `dtype_of_v<T>` only exists for the supported ones, so a
/// collective on any other type does not compile.
template <class T> struct dtype_of;
template <> struct dtype_of<float> : std::integral_constant<DType, DType::f32> {};
template <> struct dtype_of<double> : std::integral_constant<DType, DType::f64> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<DType, DType::i32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<DType, DType::i64> {};
template <> struct dtype_of<float16> : std::integral_constant<DType, DType::f16> {};
template <> struct dtype_of<bfloat16> : std::integral_constant<DType, DType::bf16> {};
template <> struct dtype_of<std::int8_t> : std::integral_constant<DType, DType::i8> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<DType, DType::u8> {};
template <> struct dtype_of<std::uint32_t> : std::integral_constant<DType, DType::u32> {};
template <> struct dtype_of<std::uint64_t> : std::integral_constant<DType, DType::u64> {};
/// The DType of `T`.
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

/// Calls `f.template operator()<T>()` with the C++ type of `t` (float, double, int32_t, int64_t,
/// float16, bfloat16, int8_t, uint8_t, uint32_t, uint64_t) and returns what it returns: the one
/// place a run-time DType becomes a compile-time type.
template <class F> constexpr decltype(auto) with_dtype(DType t, F&& f) {
  switch (t) {
  case DType::f64: return f.template operator()<double>();
  case DType::i32: return f.template operator()<std::int32_t>();
  case DType::i64: return f.template operator()<std::int64_t>();
  case DType::f16: return f.template operator()<float16>();
  case DType::bf16: return f.template operator()<bfloat16>();
  case DType::i8: return f.template operator()<std::int8_t>();
  case DType::u8: return f.template operator()<std::uint8_t>();
  case DType::u32: return f.template operator()<std::uint32_t>();
  case DType::u64: return f.template operator()<std::uint64_t>();
  case DType::f32: break;
  }
  return f.template operator()<float>();
}

/// An element type the collectives accept (float, double, float16, bfloat16; int8_t, int32_t,
/// int64_t; uint8_t, uint32_t, uint64_t).
template <class T>
concept CollectiveElement = requires { dtype_of<std::remove_cv_t<T>>::value; } && sizeof(T) == dtype_size(dtype_of<std::remove_cv_t<T>>::value);

/// How all_reduce and reduce_scatter combine the ranks' elements. `avg` is the sum divided by the
/// number of ranks, once, after the sum (ncclAvg's result): floating-point element types only (an
/// integer average is refused at the call: round it as your program needs, from a sum).
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };

/// "sum", "prod", "min", "max", "avg" (nccl-tests' names).
constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
  case ReduceOp::sum: return "sum";
  case ReduceOp::prod: return "prod";
  case ReduceOp::min: return "min";
  case ReduceOp::max: return "max";
  case ReduceOp::avg: return "avg";
  }
  return "?";
}

/// True for the floating-point element types (float32, float64, float16, bfloat16).
constexpr bool dtype_is_floating(DType t) noexcept {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

namespace collective {
/// The element-wise loops behind reduce(): one per (type, op), so the compiler vectorises the sum
/// and product loops of the wide types. Min and max keep `a` unless `b` compares smaller (larger):
/// a NaN in `a` stays, one in `b` is dropped, the same on every rank.
namespace kernels {
/// d[i] = f(a[i], b[i]) for n elements.
template <class T, class F> inline void apply(T* d, const T* a, const T* b, std::size_t n, F f) noexcept {
  for (std::size_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
}
/// `op` over n elements of an arithmetic type; integers wrap (computed unsigned: no signed overflow).
template <class T> inline void combine(ReduceOp op, T* d, const T* a, const T* b, std::size_t n) noexcept {
  using Wide = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;
  switch (op) {
  case ReduceOp::sum:
  case ReduceOp::avg: // the sum; the division comes once, at the end (divide())
    apply(d, a, b, n, [](T x, T y) { return static_cast<T>(static_cast<Wide>(x) + static_cast<Wide>(y)); }); break;
  case ReduceOp::prod: apply(d, a, b, n, [](T x, T y) { return static_cast<T>(static_cast<Wide>(x) * static_cast<Wide>(y)); }); break;
  case ReduceOp::min: apply(d, a, b, n, [](T x, T y) { return y < x ? y : x; }); break;
  case ReduceOp::max: apply(d, a, b, n, [](T x, T y) { return x < y ? y : x; }); break;
  }
}
/// `op` over n elements of float16 or bfloat16, computed in float32 and rounded once.
template <class H> inline void combine16(ReduceOp op, H* d, const H* a, const H* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float x = a[i].to_float(), y = b[i].to_float();
    float r = 0;
    switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: r = x + y; break;
    case ReduceOp::prod: r = x * y; break;
    case ReduceOp::min: r = y < x ? y : x; break;
    case ReduceOp::max: r = x < y ? y : x; break;
    }
    d[i] = (op == ReduceOp::min || op == ReduceOp::max) ? ((op == ReduceOp::min ? y < x : x < y) ? b[i] : a[i])
                                                        : H::from_float(r);
  }
}
} // namespace kernels

/// dst[i] = a[i] op b[i] for `n` elements of `t`; `dst` may be `a` or `b`. Integers wrap.
inline void reduce(ReduceOp op, DType t, void* dst, const void* a, const void* b, std::size_t n) noexcept {
  with_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>)
      kernels::combine16(op, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
    else
      kernels::combine(op, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
}

/// dst[i] /= ranks for `n` elements of the floating-point type `t` (ReduceOp::avg's last step; the
/// 16-bit types divided in float32 and rounded once). Integer types are left as they are.
inline void divide(DType t, void* dst, std::size_t n, int ranks) noexcept {
  with_dtype(t, [&]<class T>() {
    T* d = static_cast<T*>(dst);
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      for (std::size_t i = 0; i < n; ++i) d[i] = T::from_float(d[i].to_float() / static_cast<float>(ranks));
    } else if constexpr (std::is_floating_point_v<T>) {
      for (std::size_t i = 0; i < n; ++i) d[i] /= static_cast<T>(ranks);
    }
  });
}
} // namespace collective

TBVERBS_NAMESPACE_END
