// tbverbs::Error: the three error conventions, the lazily formatted message, std::error_code
// interop, and the printable names of errno values, steps, kinds and work-completion statuses.
#include <catch2/catch_test_macros.hpp>

#include <tbverbs/diagnosis.hpp>
#include <tbverbs/error.hpp>

#include <cerrno>
#include <climits>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

using tbverbs::Error;
using tbverbs::ErrorKind;
using tbverbs::Platform;
using tbverbs::Step;

namespace {
bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}
} // namespace

// ---- the three conventions (DESIGN.md "Errors") ------------------------------------------

TEST_CASE("from_errno: pointer-returning verbs report through errno", "[error][convention]") {
  SECTION("reads the global errno at the call site by default") {
    errno = EBUSY;
    const Error e = Error::from_errno(Step::create_qp);
    CHECK(e.sys_errno == EBUSY);
    CHECK(e.step == Step::create_qp);
    CHECK(e.kind == ErrorKind::verb_failed);
    CHECK(e.wc_status == -1);
  }
  SECTION("takes a saved errno explicitly") {
    errno = 0;
    const Error e = Error::from_errno(Step::reg_mr, ENOMEM);
    CHECK(e.sys_errno == ENOMEM);
    CHECK(e.is(ENOMEM));
  }
  SECTION("a verb that set no errno is reported as such") {
    errno = 0;
    const Error e = Error::from_errno(Step::alloc_pd);
    CHECK(e.sys_errno == 0);
    CHECK(contains(e.message(), "the verb set no errno"));
  }
}

TEST_CASE("from_return: modify_qp and post_* return the number, sign-normalised", "[error][convention]") {
  SECTION("positive errno as rdma-core returns it") {
    const Error e = Error::from_return(Step::modify_qp_rtr, EINVAL);
    CHECK(e.sys_errno == EINVAL);
    CHECK(e.step == Step::modify_qp_rtr);
  }
  SECTION("Apple's post_recv returned -12 (hellas#35): normalised to ENOMEM") {
    const Error e = Error::from_return(Step::post_recv, -12);
    CHECK(e.sys_errno == 12);
    CHECK(e.sys_errno == ENOMEM); // 12 on both macOS and Linux
    CHECK(e.is(ENOMEM));
    CHECK(contains(e.message(), "ENOMEM"));
  }
  SECTION("negated symbolic errno") {
    CHECK(Error::from_return(Step::post_send, -ETIMEDOUT).sys_errno == ETIMEDOUT);
  }
  SECTION("INT_MIN does not overflow") {
    CHECK(Error::from_return(Step::post_send, INT_MIN).sys_errno == INT_MAX);
  }
}

TEST_CASE("from_poll: ibv_poll_cq returns a negative number on failure", "[error][convention]") {
  const Error e = Error::from_poll(-EIO);
  CHECK(e.step == Step::poll_cq);
  CHECK(e.kind == ErrorKind::verb_failed);
  CHECK(e.sys_errno == EIO);
  CHECK(Error::from_poll(-1).sys_errno == 1);
}

TEST_CASE("from_wc: a failed work completion keeps status and wr_id, never the opcode",
          "[error][convention]") {
  const Error e = Error::from_wc(tbverbs::wc::retry_exc_err, 0xabcdef, 0x81);
  CHECK(e.step == Step::poll_cq);
  CHECK(e.kind == ErrorKind::wc_error);
  CHECK(e.wc_status == 12);
  CHECK(e.wr_id == 0xabcdef);
  CHECK(e.sys_errno == 0);
  CHECK(e.detail.view() == "vendor_err 0x81");
  CHECK(Error::from_wc(tbverbs::wc::wr_flush_err, 1).detail.empty());
}

// ---- context, predicates -----------------------------------------------------------------

TEST_CASE("Error carries device, port, GID index, platform and detail", "[error]") {
  Error e = Error::from_return(Step::modify_qp_rtr, EINVAL);
  e.on("rdma_en2", 1, 7).from(Platform::apple).with_detail("peer 10.99.0.2");
  CHECK(e.device.view() == "rdma_en2");
  CHECK(e.port == 1);
  CHECK(e.gid_index == 7);
  CHECK(e.platform == Platform::apple);
  CHECK(e.detail.view() == "peer 10.99.0.2");
  CHECK(e.is(EINVAL));
  CHECK_FALSE(e.is(ENODATA));
  CHECK(e.is(ErrorKind::verb_failed));
  CHECK_FALSE(e.is(ErrorKind::timeout));

  SECTION("on() keeps a known port and GID index when given none") {
    e.on("rdma_en3");
    CHECK(e.device.view() == "rdma_en3");
    CHECK(e.port == 1);
    CHECK(e.gid_index == 7);
  }
  SECTION("long texts are truncated, never overflow, and stay NUL-terminated") {
    const std::string long_name(500, 'd');
    e.on(long_name).with_detail(long_name);
    CHECK(e.device.view().size() == sizeof(e.device.data) - 1);
    CHECK(e.detail.view().size() == sizeof(e.detail.data) - 1);
    CHECK(e.detail.data[sizeof(e.detail.data) - 1] == '\0');
  }
}

TEST_CASE("Error is a cheap value: trivially copyable, nothing formatted until asked", "[error]") {
  STATIC_CHECK(std::is_trivially_copyable_v<Error>);
  STATIC_CHECK(std::is_nothrow_copy_constructible_v<Error>);
  const Error a = Error::from_errno(Step::create_qp, EBUSY).on("rdma_en2", 1);
  Error b = a; // a copy is a memcpy
  CHECK(std::memcmp(&a, &b, sizeof a) == 0);
}

// ---- message() ---------------------------------------------------------------------------

TEST_CASE("message(): step, errno name and number, context, detail, cause and remedy", "[error][message]") {
  Error e = Error::from_return(Step::modify_qp_rtr, EINVAL);
  e.on("rdma_en2", 1, 1).from(Platform::apple).with_detail("remote GID ::");
  const std::string m = e.message();
  CHECK(contains(m, "ibv_modify_qp(RTR) failed"));
  CHECK(contains(m, "EINVAL (" + std::to_string(EINVAL) + ": " + std::strerror(EINVAL) + ")"));
  CHECK(contains(m, "[device rdma_en2, port 1, GID index 1]"));
  CHECK(contains(m, ": remote GID ::"));
  const tbverbs::Diagnosis* d = e.diagnosis();
  REQUIRE(d != nullptr);
  CHECK(d->id == "rtr-einval-no-ipv4-gid");
  CHECK(contains(m, "\n  cause: " + std::string(d->cause)));
  CHECK(contains(m, "\n  remedy: " + std::string(d->remedy)));
}

TEST_CASE("message() prints the platform's own number for a symbolic errno", "[error][message]") {
  // ENODATA is 96 on macOS and 61 on Linux; the message shows this platform's number.
  const Error e = Error::from_return(Step::modify_qp_rtr, ENODATA).from(Platform::apple);
  CHECK(contains(e.message(), "ENODATA (" + std::to_string(ENODATA) + ":"));
}

TEST_CASE("message() for a work completion names the status and wr_id", "[error][message]") {
  const Error e = Error::from_wc(tbverbs::wc::rnr_retry_exc_err, 77).on("mlx5_0", 1);
  const std::string m = e.message();
  CHECK(contains(m, "ibv_poll_cq: work completion failed with IBV_WC_RNR_RETRY_EXC_ERR (13)"));
  CHECK(contains(m, "wr_id 77"));
  CHECK(contains(m, "[device mlx5_0, port 1]"));
  CHECK(contains(m, "rnr_retry = 7"));
}

TEST_CASE("message() for a condition names the kind", "[error][message]") {
  Error e =
      Error::make(Step::get_device_list, ErrorKind::no_device, "the verbs library lists no RDMA device");
  e.sys_errno = ENOSYS;
  e.from(Platform::rdma_core);
  const std::string m = e.message();
  // Issue 13: the errno is a separate fact, not "no RDMA device with ENOSYS".
  CHECK(contains(m, "ibv_get_device_list: no RDMA device, errno ENOSYS (" + std::to_string(ENOSYS) + ": "));
  CHECK_FALSE(contains(m, "device with"));
  CHECK(contains(m, "modprobe ib_uverbs"));
}

TEST_CASE("message() without a diagnosis or with an unnamed errno", "[error][message]") {
  const Error e = Error::from_return(Step::query_gid, 4000);
  CHECK(e.diagnosis() == nullptr);
  const std::string m = e.message();
  CHECK(contains(m, "ibv_query_gid failed with errno (4000:"));
  CHECK_FALSE(contains(m, "cause:"));
  CHECK_FALSE(contains(m, "["));
}

// ---- std::error_code -----------------------------------------------------------------------

TEST_CASE("error_code(): generic category for an errno, tbverbs category otherwise", "[error][error_code]") {
  SECTION("errno") {
    const std::error_code ec = Error::from_return(Step::modify_qp_rtr, EINVAL).error_code();
    CHECK(&ec.category() == &std::generic_category());
    CHECK(ec.value() == EINVAL);
    CHECK(ec == std::errc::invalid_argument);
  }
  SECTION("ETIMEDOUT compares with std::errc on every platform") {
    const std::error_code ec = Error::from_return(Step::modify_qp_rtr, ETIMEDOUT).error_code();
    CHECK(ec == std::errc::timed_out);
  }
  SECTION("no errno") {
    const std::error_code ec = Error::make(Step::wait_cq, ErrorKind::timeout).error_code();
    CHECK(&ec.category() == &tbverbs::error_category());
    CHECK(std::string(ec.category().name()) == "tbverbs");
    CHECK(ec.value() == static_cast<int>(ErrorKind::timeout));
    CHECK(ec.message() == "deadline passed");
    CHECK(ec == ErrorKind::timeout);
    CHECK(ec != ErrorKind::peer_lost);
  }
  SECTION("a work completion has no errno: its kind") {
    const std::error_code ec = Error::from_wc(tbverbs::wc::wr_flush_err, 1).error_code();
    CHECK(ec == ErrorKind::wc_error);
  }
}

TEST_CASE("ErrorKind converts implicitly to std::error_code", "[error][error_code]") {
  STATIC_CHECK(std::is_error_code_enum_v<ErrorKind>);
  std::error_code ec = tbverbs::ErrorKind::timeout;
  CHECK(ec.category() == tbverbs::error_category());
  CHECK(ec.message() == "deadline passed");
  ec = tbverbs::make_error_code(ErrorKind::peer_lost);
  CHECK(ec.message() == "peer lost");
  CHECK(bool(ec));
  CHECK(tbverbs::error_category().message(250) == "unknown error");
}

// ---- printable names ---------------------------------------------------------------------

TEST_CASE("errno_name names every errno by its <cerrno> macro", "[error][names]") {
  using tbverbs::detail::errno_name;
  struct Named {
    int value;
    std::string_view name;
  };
  // Every name the table lists, written out here by hand so that a typo in either shows.
  const Named all[] = {
      {EPERM, "EPERM"},
      {ENOENT, "ENOENT"},
      {ESRCH, "ESRCH"},
      {EINTR, "EINTR"},
      {EIO, "EIO"},
      {ENXIO, "ENXIO"},
      {E2BIG, "E2BIG"},
      {ENOEXEC, "ENOEXEC"},
      {EBADF, "EBADF"},
      {ECHILD, "ECHILD"},
      {EAGAIN, "EAGAIN"},
      {ENOMEM, "ENOMEM"},
      {EACCES, "EACCES"},
      {EFAULT, "EFAULT"},
      {EBUSY, "EBUSY"},
      {EEXIST, "EEXIST"},
      {ENODEV, "ENODEV"},
      {ENOTDIR, "ENOTDIR"},
      {EISDIR, "EISDIR"},
      {EINVAL, "EINVAL"},
      {ENFILE, "ENFILE"},
      {EMFILE, "EMFILE"},
      {ENOSPC, "ENOSPC"},
      {EROFS, "EROFS"},
      {EPIPE, "EPIPE"},
      {EDOM, "EDOM"},
      {ERANGE, "ERANGE"},
      {EDEADLK, "EDEADLK"},
      {ENAMETOOLONG, "ENAMETOOLONG"},
      {ENOSYS, "ENOSYS"},
      {ELOOP, "ELOOP"},
      {ENOMSG, "ENOMSG"},
      {ENODATA, "ENODATA"},
#ifdef ENOSTR
      {ENOSTR, "ENOSTR"},
#endif
#ifdef ETIME
      {ETIME, "ETIME"},
#endif
#ifdef ENOLINK
      {ENOLINK, "ENOLINK"},
#endif
      {EPROTO, "EPROTO"},
      {EBADMSG, "EBADMSG"},
      {EOVERFLOW, "EOVERFLOW"},
      {ENOTSOCK, "ENOTSOCK"},
      {EDESTADDRREQ, "EDESTADDRREQ"},
      {EMSGSIZE, "EMSGSIZE"},
      {EPROTOTYPE, "EPROTOTYPE"},
      {ENOPROTOOPT, "ENOPROTOOPT"},
      {EPROTONOSUPPORT, "EPROTONOSUPPORT"},
      {EOPNOTSUPP, "EOPNOTSUPP"},
      {ENOTSUP, "ENOTSUP"},
#ifdef EPFNOSUPPORT
      {EPFNOSUPPORT, "EPFNOSUPPORT"},
#endif
      {EAFNOSUPPORT, "EAFNOSUPPORT"},
      {EADDRINUSE, "EADDRINUSE"},
      {EADDRNOTAVAIL, "EADDRNOTAVAIL"},
      {ENETDOWN, "ENETDOWN"},
      {ENETUNREACH, "ENETUNREACH"},
      {ENETRESET, "ENETRESET"},
      {ECONNABORTED, "ECONNABORTED"},
      {ECONNRESET, "ECONNRESET"},
      {ENOBUFS, "ENOBUFS"},
      {EISCONN, "EISCONN"},
      {ENOTCONN, "ENOTCONN"},
      {ETIMEDOUT, "ETIMEDOUT"},
      {ECONNREFUSED, "ECONNREFUSED"},
#ifdef EHOSTDOWN
      {EHOSTDOWN, "EHOSTDOWN"},
#endif
      {EHOSTUNREACH, "EHOSTUNREACH"},
      {EALREADY, "EALREADY"},
      {EINPROGRESS, "EINPROGRESS"},
      {ESTALE, "ESTALE"},
      {ECANCELED, "ECANCELED"},
      {EOWNERDEAD, "EOWNERDEAD"},
      {ENOTRECOVERABLE, "ENOTRECOVERABLE"},
      {tbverbs::detail::kernel_enotsupp, "ENOTSUPP"},
  };
  CHECK(std::size(all) == std::size(tbverbs::detail::errno_names));
  for (std::size_t i = 0; i < std::size(all); ++i) {
    // Where two names share a value here (EOPNOTSUPP == ENOTSUP on Linux), the first is printed.
    std::string_view want = all[i].name;
    for (std::size_t j = 0; j < i; ++j)
      if (all[j].value == all[i].value) {
        want = all[j].name;
        break;
      }
    INFO(all[i].name << " = " << all[i].value);
    CHECK(errno_name(all[i].value) == want);
    CHECK(tbverbs::detail::errno_names[i].name == all[i].name);
    CHECK(tbverbs::detail::errno_names[i].value == all[i].value);
  }
  CHECK(errno_name(0).empty());
  CHECK(errno_name(-1).empty());
  CHECK(errno_name(100000).empty());
}

TEST_CASE("errno_name: the same number names different errors on macOS and Linux", "[error][names]") {
  using tbverbs::detail::errno_name;
  CHECK(errno_name(ENODATA) == "ENODATA");
  CHECK(errno_name(ETIMEDOUT) == "ETIMEDOUT");
#if defined(__linux__)
  CHECK(errno_name(61) == "ENODATA");
  CHECK(errno_name(96) == "EPFNOSUPPORT"); // macOS's ENODATA
  CHECK(errno_name(60) == "ENOSTR");       // macOS's ETIMEDOUT
  CHECK(errno_name(110) == "ETIMEDOUT");
  CHECK(errno_name(102) == "ENETRESET"); // macOS's EOPNOTSUPP
  CHECK(errno_name(95) == "EOPNOTSUPP"); // == ENOTSUP on Linux
  CHECK(errno_name(ENOTSUP) == "EOPNOTSUPP");
#elif defined(__APPLE__)
  CHECK(errno_name(96) == "ENODATA");
  CHECK(errno_name(61) == "ECONNREFUSED");
  CHECK(errno_name(60) == "ETIMEDOUT");
  CHECK(errno_name(102) == "EOPNOTSUPP");
  CHECK(errno_name(45) == "ENOTSUP");
#endif
}

TEST_CASE("wc_status_name names every ibv_wc_status", "[error][names]") {
  using tbverbs::wc_status_name;
  CHECK(wc_status_name(tbverbs::wc::success) == "IBV_WC_SUCCESS");
  CHECK(wc_status_name(tbverbs::wc::loc_len_err) == "IBV_WC_LOC_LEN_ERR");
  CHECK(wc_status_name(tbverbs::wc::loc_qp_op_err) == "IBV_WC_LOC_QP_OP_ERR");
  CHECK(wc_status_name(tbverbs::wc::loc_prot_err) == "IBV_WC_LOC_PROT_ERR");
  CHECK(wc_status_name(tbverbs::wc::wr_flush_err) == "IBV_WC_WR_FLUSH_ERR");
  CHECK(wc_status_name(tbverbs::wc::loc_access_err) == "IBV_WC_LOC_ACCESS_ERR");
  CHECK(wc_status_name(tbverbs::wc::rem_access_err) == "IBV_WC_REM_ACCESS_ERR");
  CHECK(wc_status_name(tbverbs::wc::rem_op_err) == "IBV_WC_REM_OP_ERR");
  CHECK(wc_status_name(tbverbs::wc::retry_exc_err) == "IBV_WC_RETRY_EXC_ERR");
  CHECK(wc_status_name(tbverbs::wc::rnr_retry_exc_err) == "IBV_WC_RNR_RETRY_EXC_ERR");
  CHECK(wc_status_name(tbverbs::wc::fatal_err) == "IBV_WC_FATAL_ERR");
  CHECK(wc_status_name(tbverbs::wc::general_err) == "IBV_WC_GENERAL_ERR");
  CHECK(wc_status_name(23) == "IBV_WC_TM_RNDV_INCOMPLETE");
  CHECK(wc_status_name(24) == "IBV_WC_UNKNOWN_STATUS");
  CHECK(wc_status_name(-1) == "IBV_WC_UNKNOWN_STATUS");
  std::set<std::string_view> names;
  for (int s = 0; s <= 23; ++s)
    names.insert(wc_status_name(s));
  CHECK(names.size() == 24);
}

TEST_CASE("step_name and kind_name name every enumerator, each differently", "[error][names]") {
  std::set<std::string_view> steps;
  for (int s = 0; s <= static_cast<int>(Step::collective); ++s) {
    const std::string_view n = tbverbs::step_name(static_cast<Step>(s));
    CHECK(n != "unknown step");
    steps.insert(n);
  }
  CHECK(steps.size() == static_cast<std::size_t>(Step::collective) + 1);
  CHECK(tbverbs::step_name(Step::modify_qp_rtr) == "ibv_modify_qp(RTR)");
  CHECK(tbverbs::step_name(Step::reg_mr) == "ibv_reg_mr");

  std::set<std::string_view> kinds;
  for (int k = 1; k <= static_cast<int>(tbverbs::last_error_kind); ++k) {
    const std::string_view n = tbverbs::kind_name(static_cast<ErrorKind>(k));
    CHECK(n != "unknown error");
    kinds.insert(n);
  }
  CHECK(kinds.size() == static_cast<std::size_t>(tbverbs::last_error_kind));
  CHECK(tbverbs::kind_name(ErrorKind{}) == "unknown error");
}

TEST_CASE("fail() makes a failed Result of any type", "[error]") {
  const Error e = Error::from_errno(Step::alloc_pd, 0).from(Platform::apple);
  tbverbs::Result<int> r = tbverbs::fail(e);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().step == Step::alloc_pd);
  CHECK(r.error().diagnosis() != nullptr);
}
