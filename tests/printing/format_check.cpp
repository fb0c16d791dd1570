// std::format of tbverbs' printable types (issue 13), a self-checking program without Catch2 so
// it also builds against libc++: each type formats as its to_string does and takes the string
// format spec. Built with the project's compiler (g++ 12 has no <format>: it checks that
// format.hpp then declares nothing and to_string still works) and with clang 19 + libc++, where
// FORMAT_CHECK_REQUIRE_FORMATTER=1 makes a missing formatter a failure.
#include <tbverbs/tbverbs.hpp>

#include <cstdio>
#include <string>

static int failures = 0;
#define FORMAT_CHECK(cond)                                                                          \
  do {                                                                                              \
    if (!(cond)) {                                                                                  \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                                 \
      ++failures;                                                                                   \
    }                                                                                               \
  } while (0)

int main() {
  using namespace tbverbs;
  Endpoint e;
  e.qp_num = 0x123;
  e.psn = 0x62a2f5;
  e.gid = Gid::from_ipv4(0x0a630001);
  e.link_layer = LinkLayer::thunderbolt;
  const GidTable table = GidTable::from_entries(1, {Gid(), Gid::from_ipv4(0x0a630001)}, Platform::apple);
  const auto sel = table.first_ipv4_mapped();
  FORMAT_CHECK(sel.has_value());
  const Error err = Error::from_return(Step::modify_qp_rtr, EINVAL).from(Platform::apple);
  FORMAT_CHECK(to_string(err) == err.message());
  FORMAT_CHECK(to_string(e).starts_with("QPN 0x000123, PSN 0x62a2f5"));
#if TBVERBS_HAS_FORMATTER
  FORMAT_CHECK(std::format("{}", e) == to_string(e));
  FORMAT_CHECK(std::format("{}", e.gid) == "::ffff:10.99.0.1");
  FORMAT_CHECK(std::format("{}", *sel) == sel->describe());
  FORMAT_CHECK(std::format("{}", QpType::uc) == "UC");
  FORMAT_CHECK(std::format("{}", Mtu::mtu1024) == "1024");
  FORMAT_CHECK(std::format("{}", PortState::active) == "PORT_ACTIVE");
  FORMAT_CHECK(std::format("{}", LinkLayer::thunderbolt) == "Thunderbolt");
  FORMAT_CHECK(std::format("{}", GidType::roce_v2) == "RoCE v2");
  FORMAT_CHECK(std::format("{}", err) == err.message());
  FORMAT_CHECK(std::format("[{:>4}|{:<6}|{:^5}]", QpType::rc, Mtu::mtu256, PortState::nop) == "[  RC|256   |PORT_NOP]");
  FORMAT_CHECK(std::format("[{:*^6}]", QpType::ud) == "[**UD**]");
  std::printf("format_check: std::formatter checked\n");
#elif defined(FORMAT_CHECK_REQUIRE_FORMATTER) && FORMAT_CHECK_REQUIRE_FORMATTER
  FORMAT_CHECK(!"this standard library must have <format> and tbverbs' formatters");
#else
  std::printf("format_check: no <format> in this standard library; to_string checked only\n");
#endif
  return failures == 0 ? 0 : 1;
}
