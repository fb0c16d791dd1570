// Checks of tbverbs::Result shared by the Catch2 unit test (tests/unit/test_result.cpp) and the
// self-checking backend program (tests/result/result_backends.cpp), so that every backend
// (bundled with g++ C++20 and C++23, forced bundled, std::expected with clang-19 and libc++) runs
// exactly the same checks. The includer defines RESULT_CHECK(cond) first.
//
// Only the API common to std::expected (C++23, P2505) and the bundled equivalent is used: no
// CTAD through the `unexpected` alias. value() on an error throws tbverbs::bad_expected_access<Error>
// on every backend (issue 8 finding 11: it used to read an inactive member in the bundled one).
#pragma once

#ifndef RESULT_CHECK
#error "define RESULT_CHECK(cond) before including result_checks.hpp"
#endif

#include <tbverbs/error.hpp>

#include <exception>

#include <cerrno>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace result_checks {

using tbverbs::Error;
using tbverbs::ErrorKind;
using tbverbs::Result;
using tbverbs::Step;

inline Error sample_error(int errno_value = EBUSY) { return Error::from_errno(Step::create_qp, errno_value); }

inline Result<int> parse_positive(int v) {
  if (v <= 0) return tbverbs::fail(Error::make(Step::configure, ErrorKind::invalid_argument));
  return v;
}

inline Result<void> succeed_if(bool ok) {
  if (!ok) return tbverbs::fail(sample_error(EINVAL));
  return {};
}

/// value() on an error throws bad_expected_access on both backends, as std::expected does
/// (finding 11: the bundled one read the inactive value member, so the same code changed meaning
/// with -std).
inline void check_value_on_error_throws() {
  Result<int> bad = tbverbs::fail(sample_error(EBUSY));
  bool threw = false;
  try {
    (void)bad.value();
  } catch (const tbverbs::bad_expected_access<Error>& e) {
    threw = e.error().is(EBUSY);
  }
  RESULT_CHECK(threw);
  Result<void> vbad = tbverbs::fail(sample_error(EINVAL));
  threw = false;
  try {
    vbad.value();
  } catch (const tbverbs::bad_expected_access<Error>& e) {
    threw = e.error().is(EINVAL);
  }
  RESULT_CHECK(threw);
  const Result<int> cbad = tbverbs::fail(sample_error(ENOMEM));
  threw = false;
  try {
    (void)cbad.value();
  } catch (const std::exception&) {
    threw = true;
  }
  RESULT_CHECK(threw);
}

/// The backend the feature-test macro implies, and the inline namespace that encodes it.
inline void check_backend() {
#if defined(TBVERBS_FORCE_BUNDLED_EXPECTED)
  constexpr int want_std = 0;
#elif defined(__cpp_lib_expected) && __cpp_lib_expected >= 202211L
  constexpr int want_std = 1;
#else
  constexpr int want_std = 0;
#endif
  RESULT_CHECK(TBVERBS_EXPECTED_IS_STD == want_std);
#if TBVERBS_EXPECTED_IS_STD
  RESULT_CHECK((std::is_same_v<Result<int>, std::expected<int, Error>>));
  RESULT_CHECK((std::is_same_v<tbverbs::unexpected<Error>, std::unexpected<Error>>));
#endif
  // The inline namespace carries version and backend: v<major>_<minor>_{std,bundled}.
  const std::string ns = "v" + std::to_string(TBVERBS_VERSION_MAJOR) + "_" +
                         std::to_string(TBVERBS_VERSION_MINOR) +
                         (TBVERBS_EXPECTED_IS_STD ? "_std" : "_bundled");
  const std::string other = TBVERBS_EXPECTED_IS_STD ? "_bundled" : "_std";
  const std::string mangled = typeid(Error).name();
  RESULT_CHECK(mangled.find(ns) != std::string::npos);
  RESULT_CHECK(mangled.find(other) == std::string::npos);
  RESULT_CHECK(std::string(typeid(Result<int>).name()).find(ns) != std::string::npos);
}

/// Result<T>: value, error, access, value_or.
inline void check_value_form() {
  Result<int> ok = 7;
  RESULT_CHECK(ok.has_value());
  RESULT_CHECK(static_cast<bool>(ok));
  RESULT_CHECK(ok.value() == 7);
  RESULT_CHECK(*ok == 7);
  RESULT_CHECK(ok.value_or(1) == 7);

  Result<int> bad = tbverbs::fail(sample_error());
  RESULT_CHECK(!bad.has_value());
  RESULT_CHECK(!bad);
  RESULT_CHECK(bad.error().sys_errno == EBUSY);
  RESULT_CHECK(bad.error().step == Step::create_qp);
  RESULT_CHECK(bad.value_or(1) == 1);

  const Result<int> cbad = bad; // copy keeps the error
  RESULT_CHECK(!cbad.has_value());
  RESULT_CHECK(cbad.error().is(EBUSY));

  Result<int> moved = std::move(bad);
  RESULT_CHECK(moved.error().is(EBUSY));

  // Assignment across states: value <- error <- value.
  Result<int> r = 1;
  r = tbverbs::fail(sample_error(ENOMEM));
  RESULT_CHECK(!r.has_value() && r.error().is(ENOMEM));
  r = 5;
  RESULT_CHECK(r.has_value() && *r == 5);

  struct Point {
    int x, y;
  };
  Result<Point> p = Point{3, 4};
  RESULT_CHECK(p->x == 3 && p->y == 4);
}

/// Result<void>: success is the default, failure carries the error.
inline void check_void_form() {
  Result<void> ok;
  RESULT_CHECK(ok.has_value());
  RESULT_CHECK(static_cast<bool>(ok));
  ok.value(); // no-op on success, must compile

  Result<void> bad = tbverbs::fail(sample_error(EINVAL));
  RESULT_CHECK(!bad.has_value());
  RESULT_CHECK(bad.error().is(EINVAL));

  Result<void> copy = bad;
  RESULT_CHECK(!copy && copy.error().is(EINVAL));
  copy = ok;
  RESULT_CHECK(copy.has_value());
  copy = std::move(bad);
  RESULT_CHECK(!copy.has_value());
}

/// and_then, transform, or_else, transform_error on Result<T>, on both paths.
inline void check_monadic() {
  // and_then: chains fallible steps, short-circuits on the first error.
  auto twice = [](int v) -> Result<int> { return v * 2; };
  RESULT_CHECK(*parse_positive(4).and_then(twice) == 8);
  auto chained = parse_positive(-1).and_then(twice);
  RESULT_CHECK(!chained && chained.error().is(ErrorKind::invalid_argument));
  bool called = false;
  auto not_called = parse_positive(0).and_then([&](int v) -> Result<int> {
    called = true;
    return v;
  });
  RESULT_CHECK(!called && !not_called);

  // and_then into Result<void>.
  auto to_void = parse_positive(3).and_then([](int v) { return succeed_if(v == 3); });
  RESULT_CHECK(to_void.has_value());

  // transform: maps the value, keeps the error.
  auto s = parse_positive(12).transform([](int v) { return std::to_string(v); });
  RESULT_CHECK((std::is_same_v<decltype(s), Result<std::string>>));
  RESULT_CHECK(*s == "12");
  auto se = parse_positive(-2).transform([](int v) { return std::to_string(v); });
  RESULT_CHECK(!se && se.error().kind == ErrorKind::invalid_argument);
  // transform to void.
  int seen = 0;
  auto tv = parse_positive(9).transform([&](int v) { seen = v; });
  RESULT_CHECK((std::is_same_v<decltype(tv), Result<void>>));
  RESULT_CHECK(tv.has_value() && seen == 9);

  // or_else: recovers from an error; not called on success.
  auto recovered = parse_positive(-1).or_else([](const Error& e) -> Result<int> {
    return e.is(ErrorKind::invalid_argument) ? Result<int>(42) : Result<int>(tbverbs::fail(e));
  });
  RESULT_CHECK(recovered.has_value() && *recovered == 42);
  called = false;
  auto untouched = parse_positive(5).or_else([&](const Error& e) -> Result<int> {
    called = true;
    return tbverbs::fail(e);
  });
  RESULT_CHECK(!called && *untouched == 5);
  // or_else that adds context and fails again.
  auto rethrown = parse_positive(-1).or_else([](Error e) -> Result<int> {
    e.on("rdma_en2", 1, 3);
    return tbverbs::fail(e);
  });
  RESULT_CHECK(!rethrown && rethrown.error().device.view() == "rdma_en2" && rethrown.error().gid_index == 3);

  // transform_error: maps the error type.
  auto te = parse_positive(-1).transform_error([](const Error& e) { return static_cast<int>(e.kind); });
  RESULT_CHECK((std::is_same_v<decltype(te), tbverbs::expected<int, int>>));
  RESULT_CHECK(!te && te.error() == static_cast<int>(ErrorKind::invalid_argument));
  auto tv2 = parse_positive(2).transform_error([](const Error&) { return 0; });
  RESULT_CHECK(tv2.has_value() && *tv2 == 2);

  // Const lvalue and rvalue receivers.
  const Result<int> c = 10;
  RESULT_CHECK(*c.and_then(twice) == 20);
  RESULT_CHECK(*c.transform([](int v) { return v + 1; }) == 11);
  RESULT_CHECK(*Result<int>(3).and_then(twice) == 6);
}

/// The monadic members of Result<void>.
inline void check_void_monadic() {
  int n = 0;
  auto a = succeed_if(true).and_then([&]() -> Result<void> {
    ++n;
    return {};
  });
  RESULT_CHECK(a.has_value() && n == 1);
  auto b = succeed_if(false).and_then([&]() -> Result<void> {
    ++n;
    return {};
  });
  RESULT_CHECK(!b && n == 1 && b.error().is(EINVAL));

  auto c = succeed_if(true).transform([] { return 5; });
  RESULT_CHECK((std::is_same_v<decltype(c), Result<int>>));
  RESULT_CHECK(*c == 5);
  auto d = succeed_if(false).transform([] { return 5; });
  RESULT_CHECK(!d && d.error().is(EINVAL));

  auto e = succeed_if(false).or_else([](const Error&) -> Result<void> { return {}; });
  RESULT_CHECK(e.has_value());
  auto f = succeed_if(false).transform_error([](const Error& err) { return err.sys_errno; });
  RESULT_CHECK(!f && f.error() == EINVAL);
  auto g = succeed_if(true).transform_error([](const Error& err) { return err.sys_errno; });
  RESULT_CHECK(g.has_value());
}

/// unexpected<Error> and fail(): error() in all value categories.
inline void check_unexpected() {
  tbverbs::unexpected<Error> u(sample_error(ETIMEDOUT));
  RESULT_CHECK(u.error().is(ETIMEDOUT));
  const auto& cu = u;
  RESULT_CHECK(cu.error().step == Step::create_qp);
  Error moved_out = std::move(u).error();
  RESULT_CHECK(moved_out.is(ETIMEDOUT));

  Result<int> r = tbverbs::unexpected<Error>(sample_error(ENODATA));
  RESULT_CHECK(!r && r.error().is(ENODATA));
  Result<void> v = tbverbs::fail(sample_error(EIO));
  RESULT_CHECK(!v && v.error().is(EIO));

  // The error survives a copy, and the message is built only from it.
  const Result<int> copy = r;
  RESULT_CHECK(copy.error().message().find("ENODATA") != std::string::npos);
  Error rvalue_err = Result<int>(tbverbs::fail(sample_error(EPERM))).error();
  RESULT_CHECK(rvalue_err.is(EPERM));
}

/// A move-only T: moves through every member without copies.
inline void check_move_only() {
  using P = std::unique_ptr<int>;
  RESULT_CHECK(!std::is_copy_constructible_v<Result<P>>);
  RESULT_CHECK(std::is_move_constructible_v<Result<P>>);
  RESULT_CHECK(std::is_nothrow_move_constructible_v<Result<P>>);

  Result<P> a = std::make_unique<int>(3);
  RESULT_CHECK(a.has_value() && **a == 3);
  Result<P> b = std::move(a);
  RESULT_CHECK(b.has_value() && **b == 3);
  P taken = std::move(b).value();
  RESULT_CHECK(taken && *taken == 3);

  auto deref = Result<P>(std::make_unique<int>(4)).and_then([](P p) -> Result<int> { return *p; });
  RESULT_CHECK(*deref == 4);
  auto plus = Result<P>(std::make_unique<int>(5)).transform([](P p) { return *p + 1; });
  RESULT_CHECK(*plus == 6);
  auto kept =
      Result<P>(std::make_unique<int>(6)).or_else([](Error e) -> Result<P> { return tbverbs::fail(e); });
  RESULT_CHECK(kept.has_value() && **kept == 6);
  auto err = Result<P>(tbverbs::fail(sample_error())).transform([](P p) { return *p; });
  RESULT_CHECK(!err && err.error().is(EBUSY));
  P fallback = Result<P>(tbverbs::fail(sample_error())).value_or(std::make_unique<int>(9));
  RESULT_CHECK(*fallback == 9);

  Result<P> assign = std::make_unique<int>(1);
  assign = tbverbs::fail(sample_error(ENOMEM));
  RESULT_CHECK(!assign && assign.error().is(ENOMEM));
  assign = Result<P>(std::make_unique<int>(2));
  RESULT_CHECK(assign && **assign == 2);
}

/// Counts live instances, to prove construction and destruction stay balanced.
struct Counted {
  static inline int live = 0;
  std::string text;
  explicit Counted(std::string t) : text(std::move(t)) { ++live; }
  Counted(const Counted& o) : text(o.text) { ++live; }
  Counted(Counted&& o) noexcept : text(std::move(o.text)) { ++live; }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&&) noexcept = default;
  ~Counted() { --live; }
};

/// A non-trivial T (std::string, and a type with a counted destructor).
inline void check_non_trivial() {
  const std::string long_text(200, 'x'); // beyond any small-string buffer
  Result<std::string> s = long_text;
  RESULT_CHECK(*s == long_text);
  RESULT_CHECK(s->size() == 200);
  Result<std::string> copy = s;
  RESULT_CHECK(*copy == long_text && *s == long_text);
  copy = tbverbs::fail(sample_error());
  RESULT_CHECK(!copy.has_value());
  copy = s;
  RESULT_CHECK(*copy == long_text);
  Result<std::string> moved = std::move(copy);
  RESULT_CHECK(*moved == long_text);
  auto len = moved.transform([](const std::string& t) { return t.size(); });
  RESULT_CHECK(*len == 200);
  auto joined = std::move(moved).and_then([](std::string t) -> Result<std::string> { return t + "!"; });
  RESULT_CHECK(joined->size() == 201);

  {
    Result<Counted> c = Counted("a");
    RESULT_CHECK(Counted::live >= 1);
    Result<Counted> d = c;
    c = tbverbs::fail(sample_error());
    d = Counted("b");
    RESULT_CHECK(d->text == "b");
    c = d;
    RESULT_CHECK(c->text == "b");
  }
  RESULT_CHECK(Counted::live == 0);
}

/// Every group above, in order.
inline void run_all() {
  check_backend();
  check_value_form();
  check_void_form();
  check_monadic();
  check_void_monadic();
  check_unexpected();
  check_move_only();
  check_non_trivial();
  check_value_on_error_throws();
}

} // namespace result_checks
