/// @file result.hpp
/// `tbverbs::Result<T>`: std::expected where the standard library has the C++23 monadic one,
/// a small bundled equivalent otherwise.
#pragma once

#include "config.hpp"

#include <exception>
#include <new>
#include <type_traits>
#include <utility>

// Debug precondition checks of the bundled Result: dereferencing an error (`*r`, `r->`) or asking
// a value for its error prints what was done and the held error's message, then aborts, so code
// that skipped a check fails with the reason instead of running on garbage. On unless NDEBUG is
// defined, as `assert` is; define TBVERBS_RESULT_CHECKS to 0 or 1 to choose. (std::expected has
// no such hook: there, the standard library's own assertions apply, e.g. _GLIBCXX_ASSERTIONS.)
#if !defined(TBVERBS_RESULT_CHECKS)
#if defined(NDEBUG)
/// 1 when the bundled Result checks its preconditions (debug builds), 0 when it does not.
#define TBVERBS_RESULT_CHECKS 0
#else
/// 1 when the bundled Result checks its preconditions (debug builds), 0 when it does not.
#define TBVERBS_RESULT_CHECKS 1
#endif
#endif

#if TBVERBS_EXPECTED_IS_STD
#include <expected>
#else
#include <cstdio>
#include <cstdlib>
#include <string>
#endif

TBVERBS_NAMESPACE_BEGIN

struct Error;

#if TBVERBS_EXPECTED_IS_STD

/// The expected type behind Result (here: std::expected).
template <class T, class E> using expected = std::expected<T, E>;
/// The error wrapper (here: std::unexpected).
template <class E> using unexpected = std::unexpected<E>;
/// What `value()` throws when an error is held (here: std::bad_expected_access).
template <class E> using bad_expected_access = std::bad_expected_access<E>;

#else
// The bundled equivalent is an implementation detail of Result: the reference documents Result
// with std::expected's API, so it stays out of the class list.
/// \cond TBVERBS_BUNDLED_EXPECTED

namespace detail {
/// The held error's text: `message()` where E has one (tbverbs::Error), else empty.
template <class E> std::string error_text(const E& e) {
  if constexpr (requires { std::string(e.message()); }) return std::string(e.message());
  else return {};
}

/// Reports a broken precondition of the bundled expected on stderr, with the held error's
/// message when there is one, and aborts (the debug check; see TBVERBS_RESULT_CHECKS).
[[noreturn, gnu::cold]] inline void result_precondition_failed(const char* what, const std::string& error) noexcept {
  std::fprintf(stderr, "tbverbs::Result: %s\n", what);
  if (!error.empty()) std::fprintf(stderr, "the Result holds this error:\n%s\n", error.c_str());
  std::fflush(stderr);
  std::abort();
}
} // namespace detail

/// What `value()` throws when an error is held (bundled std::bad_expected_access): the bundled
/// Result behaves as std::expected does, so the same code means the same under every `-std`.
template <class E> class bad_expected_access : public std::exception {
public:
  /// Keeps a copy of the error and, for what(), its message.
  explicit bad_expected_access(E e)
      : error_(std::move(e)), what_("bad access to tbverbs::expected without a value: " + detail::error_text(error_)) {}
  /// "bad access to tbverbs::expected without a value: " and the error's message, so an uncaught
  /// one says why (std::terminate prints what()).
  const char* what() const noexcept override { return what_.c_str(); }
  /// The error that was held.
  const E& error() const& noexcept { return error_; }
  /// The error that was held.
  E& error() & noexcept { return error_; }

private:
  E error_;
  std::string what_;
};

namespace detail {
/// Throws bad_expected_access<E>(e); when exceptions are off, prints the error's message and
/// aborts (where libstdc++ would abort without one).
template <class E> [[noreturn, gnu::cold]] void throw_bad_expected_access(const E& e) {
#if defined(__cpp_exceptions)
  throw bad_expected_access<E>(e);
#else
  result_precondition_failed("value() on a Result that holds an error", error_text(e));
#endif
}
} // namespace detail

/// Holds an error value for constructing a failed `expected` (bundled std::unexpected).
template <class E> class unexpected {
public:
  /// Wraps `e`.
  constexpr explicit unexpected(E e) noexcept(std::is_nothrow_move_constructible_v<E>)
      : error_(std::move(e)) {}
  /// The wrapped error.
  constexpr const E& error() const& noexcept { return error_; }
  /// The wrapped error.
  constexpr E& error() & noexcept { return error_; }
  /// The wrapped error.
  constexpr E&& error() && noexcept { return std::move(error_); }

private:
  E error_;
};

/// Deduces unexpected<E> from the error value.
template <class E> unexpected(E) -> unexpected<E>;

template <class T, class E> class expected;

namespace detail {
template <class X> struct is_expected : std::false_type {};
template <class T, class E> struct is_expected<expected<T, E>> : std::true_type {};
} // namespace detail

/// A value of type T or an error of type E (bundled subset of std::expected, C++23 monadic API).
/// The value and error members are the only state; no allocation, no exceptions.
template <class T, class E> class [[nodiscard]] expected {
public:
  /// The value type.
  using value_type = T;
  /// The error type.
  using error_type = E;

  /// Value-initialises T.
  constexpr expected() requires std::is_default_constructible_v<T> : has_(true) {
    ::new (&val_) T();
  }
  /// Holds a value converted from `v`.
  template <class U = T>
    requires(std::is_constructible_v<T, U &&> && !std::is_same_v<std::remove_cvref_t<U>, expected> &&
             !std::is_same_v<std::remove_cvref_t<U>, unexpected<E>>)
  constexpr expected(U&& v) : has_(true) { // NOLINT(google-explicit-constructor): mirrors std
    ::new (&val_) T(std::forward<U>(v));
  }
  /// Holds the error carried by `u`.
  template <class G>
  constexpr expected(const unexpected<G>& u) : has_(false) { // NOLINT: mirrors std
    ::new (&err_) E(u.error());
  }
  /// Holds the error carried by `u`.
  template <class G>
  constexpr expected(unexpected<G>&& u) : has_(false) { // NOLINT: mirrors std
    ::new (&err_) E(std::move(u).error());
  }
  /// Copies value or error (only when both T and E are copyable, so the traits tell the truth
  /// for move-only T such as std::unique_ptr).
  constexpr expected(const expected& o)
    requires(std::is_copy_constructible_v<T> && std::is_copy_constructible_v<E>)
      : has_(o.has_) {
    if (has_) ::new (&val_) T(o.val_);
    else ::new (&err_) E(o.err_);
  }
  /// Moves value or error.
  constexpr expected(expected&& o) noexcept(std::is_nothrow_move_constructible_v<T> &&
                                            std::is_nothrow_move_constructible_v<E>)
    requires(std::is_move_constructible_v<T> && std::is_move_constructible_v<E>)
      : has_(o.has_) {
    if (has_) ::new (&val_) T(std::move(o.val_));
    else ::new (&err_) E(std::move(o.err_));
  }
  /// Copy-assigns by destroying and re-constructing.
  constexpr expected& operator=(const expected& o)
    requires(std::is_copy_constructible_v<T> && std::is_copy_constructible_v<E>)
  {
    if (this != &o) {
      destroy();
      has_ = o.has_;
      if (has_) ::new (&val_) T(o.val_);
      else ::new (&err_) E(o.err_);
    }
    return *this;
  }
  /// Move-assigns by destroying and re-constructing.
  constexpr expected& operator=(expected&& o) noexcept(std::is_nothrow_move_constructible_v<T> &&
                                                       std::is_nothrow_move_constructible_v<E>)
    requires(std::is_move_constructible_v<T> && std::is_move_constructible_v<E>)
  {
    if (this != &o) {
      destroy();
      has_ = o.has_;
      if (has_) ::new (&val_) T(std::move(o.val_));
      else ::new (&err_) E(std::move(o.err_));
    }
    return *this;
  }
  constexpr ~expected() { destroy(); }

  /// True when a value is held.
  constexpr bool has_value() const noexcept { return has_; }
  /// True when a value is held.
  constexpr explicit operator bool() const noexcept { return has_; }

  /// The value; throws bad_expected_access<E> when an error is held (as std::expected does).
  constexpr T& value() & {
    if (!has_) detail::throw_bad_expected_access(err_);
    return val_;
  }
  /// The value; throws bad_expected_access<E> when an error is held (as std::expected does).
  constexpr const T& value() const& {
    if (!has_) detail::throw_bad_expected_access(err_);
    return val_;
  }
  /// The value; throws bad_expected_access<E> when an error is held (as std::expected does).
  constexpr T&& value() && {
    if (!has_) detail::throw_bad_expected_access(err_);
    return std::move(val_);
  }
  /// The value; precondition: has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr T& operator*() & noexcept {
    check_value("operator* on a Result that holds an error (test it first: `if (!r)`)");
    return val_;
  }
  /// The value; precondition: has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr const T& operator*() const& noexcept {
    check_value("operator* on a Result that holds an error (test it first: `if (!r)`)");
    return val_;
  }
  /// The value; precondition: has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr T&& operator*() && noexcept {
    check_value("operator* on a Result that holds an error (test it first: `if (!r)`)");
    return std::move(val_);
  }
  /// Member access to the value; precondition: has_value() (checked in debug builds).
  constexpr T* operator->() noexcept {
    check_value("operator-> on a Result that holds an error (test it first: `if (!r)`)");
    return &val_;
  }
  /// Member access to the value; precondition: has_value() (checked in debug builds).
  constexpr const T* operator->() const noexcept {
    check_value("operator-> on a Result that holds an error (test it first: `if (!r)`)");
    return &val_;
  }

  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr E& error() & noexcept {
    check_error();
    return err_;
  }
  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr const E& error() const& noexcept {
    check_error();
    return err_;
  }
  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr E&& error() && noexcept {
    check_error();
    return std::move(err_);
  }

  /// The value, or `d` when an error is held.
  template <class U> constexpr T value_or(U&& d) const& {
    return has_ ? val_ : static_cast<T>(std::forward<U>(d));
  }
  /// The value, or `d` when an error is held.
  template <class U> constexpr T value_or(U&& d) && {
    return has_ ? std::move(val_) : static_cast<T>(std::forward<U>(d));
  }

  /// f(value) (which returns an expected with the same error type), or the error.
  template <class F> constexpr auto and_then(F&& f) & { return and_then_impl(*this, std::forward<F>(f)); }
  /// f(value) (which returns an expected with the same error type), or the error.
  template <class F> constexpr auto and_then(F&& f) const& {
    return and_then_impl(*this, std::forward<F>(f));
  }
  /// f(value) (which returns an expected with the same error type), or the error.
  template <class F> constexpr auto and_then(F&& f) && {
    return and_then_impl(std::move(*this), std::forward<F>(f));
  }
  /// An expected holding f(value), or the error.
  template <class F> constexpr auto transform(F&& f) & { return transform_impl(*this, std::forward<F>(f)); }
  /// An expected holding f(value), or the error.
  template <class F> constexpr auto transform(F&& f) const& {
    return transform_impl(*this, std::forward<F>(f));
  }
  /// An expected holding f(value), or the error.
  template <class F> constexpr auto transform(F&& f) && {
    return transform_impl(std::move(*this), std::forward<F>(f));
  }
  /// The value, or f(error) (which returns an expected with the same value type).
  template <class F> constexpr auto or_else(F&& f) const& {
    using R = std::remove_cvref_t<std::invoke_result_t<F, const E&>>;
    return has_ ? R(val_) : std::forward<F>(f)(err_);
  }
  /// The value, or f(error) (which returns an expected with the same value type).
  template <class F> constexpr auto or_else(F&& f) && {
    using R = std::remove_cvref_t<std::invoke_result_t<F, E&&>>;
    return has_ ? R(std::move(val_)) : std::forward<F>(f)(std::move(err_));
  }
  /// The value, or an expected holding f(error).
  template <class F> constexpr auto transform_error(F&& f) const& {
    using G = std::remove_cvref_t<std::invoke_result_t<F, const E&>>;
    using R = expected<T, G>;
    return has_ ? R(val_) : R(unexpected<G>(std::forward<F>(f)(err_)));
  }
  /// The value, or an expected holding f(error).
  template <class F> constexpr auto transform_error(F&& f) && {
    using G = std::remove_cvref_t<std::invoke_result_t<F, E&&>>;
    using R = expected<T, G>;
    return has_ ? R(std::move(val_)) : R(unexpected<G>(std::forward<F>(f)(std::move(err_))));
  }

private:
  constexpr void check_value([[maybe_unused]] const char* what) const noexcept {
#if TBVERBS_RESULT_CHECKS
    if (!has_) detail::result_precondition_failed(what, detail::error_text(err_));
#endif
  }
  constexpr void check_error() const noexcept {
#if TBVERBS_RESULT_CHECKS
    if (has_) detail::result_precondition_failed("error() on a Result that holds a value", {});
#endif
  }
  template <class Self, class F> static constexpr auto and_then_impl(Self&& self, F&& f) {
    using R = std::remove_cvref_t<std::invoke_result_t<F, decltype(std::forward<Self>(self).val_)>>;
    static_assert(detail::is_expected<R>::value, "and_then: f must return an expected");
    if (self.has_) return std::forward<F>(f)(std::forward<Self>(self).val_);
    return R(unexpected<E>(std::forward<Self>(self).err_));
  }
  template <class Self, class F> static constexpr auto transform_impl(Self&& self, F&& f) {
    using U = std::remove_cvref_t<std::invoke_result_t<F, decltype(std::forward<Self>(self).val_)>>;
    using R = expected<U, E>;
    if (!self.has_) return R(unexpected<E>(std::forward<Self>(self).err_));
    if constexpr (std::is_void_v<U>) {
      std::forward<F>(f)(std::forward<Self>(self).val_);
      return R();
    } else {
      return R(std::forward<F>(f)(std::forward<Self>(self).val_));
    }
  }
  constexpr void destroy() noexcept {
    if (has_) val_.~T();
    else err_.~E();
  }

  union {
    T val_;
    E err_;
  };
  bool has_;
};

/// A success without a value, or an error of type E (bundled std::expected<void, E>).
template <class E> class [[nodiscard]] expected<void, E> {
public:
  /// The value type.
  using value_type = void;
  /// The error type.
  using error_type = E;

  /// Success.
  constexpr expected() noexcept : has_(true) {}
  /// Holds the error carried by `u`.
  template <class G>
  constexpr expected(const unexpected<G>& u) : has_(false) { // NOLINT: mirrors std
    ::new (&err_) E(u.error());
  }
  /// Holds the error carried by `u`.
  template <class G>
  constexpr expected(unexpected<G>&& u) : has_(false) { // NOLINT: mirrors std
    ::new (&err_) E(std::move(u).error());
  }
  /// Copies.
  constexpr expected(const expected& o) : has_(o.has_) {
    if (!has_) ::new (&err_) E(o.err_);
  }
  /// Moves.
  constexpr expected(expected&& o) noexcept(std::is_nothrow_move_constructible_v<E>) : has_(o.has_) {
    if (!has_) ::new (&err_) E(std::move(o.err_));
  }
  /// Copy-assigns.
  constexpr expected& operator=(const expected& o) {
    if (this != &o) {
      destroy();
      has_ = o.has_;
      if (!has_) ::new (&err_) E(o.err_);
    }
    return *this;
  }
  /// Move-assigns.
  constexpr expected& operator=(expected&& o) noexcept(std::is_nothrow_move_constructible_v<E>) {
    if (this != &o) {
      destroy();
      has_ = o.has_;
      if (!has_) ::new (&err_) E(std::move(o.err_));
    }
    return *this;
  }
  constexpr ~expected() { destroy(); }

  /// True on success.
  constexpr bool has_value() const noexcept { return has_; }
  /// True on success.
  constexpr explicit operator bool() const noexcept { return has_; }
  /// Does nothing on success; throws bad_expected_access<E> when an error is held (as
  /// std::expected<void, E> does).
  constexpr void value() const {
    if (!has_) detail::throw_bad_expected_access(err_);
  }
  /// Does nothing (there is no value); precondition: has_value() (checked in debug builds).
  constexpr void operator*() const noexcept {
#if TBVERBS_RESULT_CHECKS
    if (!has_)
      detail::result_precondition_failed("operator* on a Result that holds an error (test it first: `if (!r)`)",
                                         detail::error_text(err_));
#endif
  }

  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr E& error() & noexcept {
    check_error();
    return err_;
  }
  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr const E& error() const& noexcept {
    check_error();
    return err_;
  }
  /// The error; precondition: !has_value() (checked in debug builds: TBVERBS_RESULT_CHECKS).
  constexpr E&& error() && noexcept {
    check_error();
    return std::move(err_);
  }

  /// f() (which returns an expected with the same error type), or the error.
  template <class F> constexpr auto and_then(F&& f) const& {
    using R = std::remove_cvref_t<std::invoke_result_t<F>>;
    static_assert(detail::is_expected<R>::value, "and_then: f must return an expected");
    return has_ ? std::forward<F>(f)() : R(unexpected<E>(err_));
  }
  /// An expected holding f(), or the error.
  template <class F> constexpr auto transform(F&& f) const& {
    using U = std::remove_cvref_t<std::invoke_result_t<F>>;
    using R = expected<U, E>;
    if (!has_) return R(unexpected<E>(err_));
    if constexpr (std::is_void_v<U>) {
      std::forward<F>(f)();
      return R();
    } else {
      return R(std::forward<F>(f)());
    }
  }
  /// Success, or f(error) (which returns an expected<void, G>).
  template <class F> constexpr auto or_else(F&& f) const& {
    using R = std::remove_cvref_t<std::invoke_result_t<F, const E&>>;
    return has_ ? R() : std::forward<F>(f)(err_);
  }
  /// Success, or an expected holding f(error).
  template <class F> constexpr auto transform_error(F&& f) const& {
    using G = std::remove_cvref_t<std::invoke_result_t<F, const E&>>;
    using R = expected<void, G>;
    return has_ ? R() : R(unexpected<G>(std::forward<F>(f)(err_)));
  }

private:
  constexpr void check_error() const noexcept {
#if TBVERBS_RESULT_CHECKS
    if (has_) detail::result_precondition_failed("error() on a Result that holds a value", {});
#endif
  }
  constexpr void destroy() noexcept {
    if (!has_) err_.~E();
  }
  union {
    char none_;
    E err_;
  };
  bool has_;
};

/// \endcond
#endif // TBVERBS_EXPECTED_IS_STD

/// The result of every fallible tbverbs operation: a T, or an Error saying what failed and why.
///
/// It has the API of C++23's `std::expected<T, Error>` with the monadic members (`has_value`,
/// `operator*`, `->`, `value`, `error`, `value_or`, `and_then`, `transform`, `or_else`,
/// `transform_error`): it is `std::expected` where the standard library has that one
/// (TBVERBS_EXPECTED_IS_STD), a bundled equivalent otherwise, whose debug builds check that `*r`,
/// `r->` and `r.error()` are used on the right kind of Result (TBVERBS_RESULT_CHECKS). Failures
/// are made with `fail(error)` (a `tbverbs::unexpected<Error>`); `value()` on an error throws
/// `tbverbs::bad_expected_access<Error>`.
///
/// \dontinclude tour/tour.cpp
/// \skip auto lib
/// \until ctx.error()
template <class T> using Result = expected<T, Error>;

TBVERBS_NAMESPACE_END
