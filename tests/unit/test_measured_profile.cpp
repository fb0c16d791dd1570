// The measured profile (tbverbs-probe --profile-out, loaded through TBVERBS_PROFILE): parsing,
// formatting, refusals, and the defaults it replaces (largest_message_guess, measured_cq_wait,
// measured_empty_rq).
#include <tbverbs/measured_profile.hpp>
#include <tbverbs/message_size.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace tbverbs;

namespace {
struct ProfileEnv {
  explicit ProfileEnv(const std::string& text) {
    char tmpl[] = "/tmp/tbverbs-profile-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    ::close(fd);
    path = tmpl;
    std::ofstream(path) << text;
    ::setenv("TBVERBS_PROFILE", path.c_str(), 1);
  }
  ~ProfileEnv() {
    ::unsetenv("TBVERBS_PROFILE");
    std::remove(path.c_str());
  }
  std::string path;
};
PortAttributes tb_port() {
  PortAttributes p;
  p.max_msg_sz = 16'773'120;
  return p;
}
DeviceAttributes tb_device() {
  DeviceAttributes d;
  d.max_mr_size = 16'384'000;
  return d;
}
} // namespace

TEST_CASE("a profile round-trips through format and parse, unknown keys kept", "[profile]") {
  MeasuredProfile p;
  p.device = "rdma_en2";
  p.macos = "26.3 (25D125)";
  p.max_message_bytes = 16'384'000;
  p.empty_rq = EmptyRqBehaviour::drop;
  p.completion_channels = false;
  p.max_mr_bytes = 16'384'000;
  p.max_mrs = 100;
  p.max_qps = 10;
  p.entries.emplace_back("rdma_write_executed", "false");
  const std::string text = p.format("a comment");
  auto q = MeasuredProfile::parse(text);
  REQUIRE(q);
  CHECK(q->device == "rdma_en2");
  CHECK(q->macos == "26.3 (25D125)");
  CHECK(q->max_message_bytes == 16'384'000u);
  CHECK(q->empty_rq == EmptyRqBehaviour::drop);
  CHECK(q->completion_channels == false);
  CHECK(q->max_mr_bytes == 16'384'000u);
  CHECK(q->max_mrs == 100);
  CHECK(q->max_qps == 10);
  CHECK(q->get("rdma_write_executed") == "false");
  CHECK(q->get("no_such_key") == std::nullopt);
}

TEST_CASE("a malformed profile is refused naming the line", "[profile]") {
  auto bad = [](const char* text) {
    auto p = MeasuredProfile::parse(text, "p.txt");
    REQUIRE_FALSE(p);
    CHECK(p.error().is(ErrorKind::invalid_argument));
    return std::string(p.error().detail.view());
  };
  CHECK(bad("tbverbs_profile=1\nmax_message_bytes=lots\n").find("p.txt:2: max_message_bytes") != std::string::npos);
  CHECK(bad("empty_rq=sometimes\n").find("empty_rq must be wait, drop, kill") != std::string::npos);
  CHECK(bad("just words\n").find("expected key=value") != std::string::npos);
  CHECK(bad("tbverbs_profile=9\n").find("newer than this library reads") != std::string::npos);
  CHECK(bad("completion_channels=maybe\n").find("completion_channels") != std::string::npos);
  // Comments, blank lines, spaces and CRLF are fine; unknown keys are kept, not refused.
  auto ok = MeasuredProfile::parse("# c\n\n  empty_rq = kill  \r\nfuture_key=1 # trailing\n");
  REQUIRE(ok);
  CHECK(ok->empty_rq == EmptyRqBehaviour::kill);
  CHECK(ok->get("future_key") == "1");
}

TEST_CASE("without TBVERBS_PROFILE nothing is measured and the defaults stay", "[profile]") {
  ::unsetenv("TBVERBS_PROFILE");
  auto p = measured_profile();
  REQUIRE(p);
  CHECK_FALSE(p->max_message_bytes);
  CHECK(measured_empty_rq() == EmptyRqBehaviour::unknown);
  CHECK(measured_cq_wait(Platform::apple) == CqWait::automatic);
  auto g = largest_message_guess(Platform::apple, tb_port(), tb_device(), 1u << 20);
  REQUIRE(g);
  CHECK(g->bytes == 1u << 20);
}

TEST_CASE("a measured largest message replaces the assumed one in largest_message_guess", "[profile]") {
  ProfileEnv env("tbverbs_profile=1\nmax_message_bytes=4096\nempty_rq=wait\ncompletion_channels=true\n");
  auto g = largest_message_guess(Platform::apple, tb_port(), tb_device(), 1u << 20);
  REQUIRE(g);
  CHECK(g->bytes == 4096);
  CHECK(std::string(g->reason).find("tbverbs-probe") != std::string::npos);
  CHECK(measured_empty_rq() == EmptyRqBehaviour::wait);
  // Channels measured working: Apple's CQs ask for one; rdma-core keeps its default.
  CHECK(measured_cq_wait(Platform::apple) == CqWait::channel);
  CHECK(measured_cq_wait(Platform::rdma_core) == CqWait::automatic);
}

TEST_CASE("a measured size above the structural caps is still capped by them", "[profile]") {
  ProfileEnv env("max_message_bytes=16384000\n");
  auto g = largest_message_guess(Platform::apple, tb_port(), tb_device(), 64u << 20);
  REQUIRE(g);
  CHECK(g->bytes == 8'192'000); // half max_mr_size: a message fits one region of a MemoryRegionSet
}

TEST_CASE("a TBVERBS_PROFILE that cannot be read or parsed is an error, never ignored", "[profile]") {
  ::setenv("TBVERBS_PROFILE", "/nonexistent/tbverbs-profile.txt", 1);
  auto g = largest_message_guess(Platform::apple, tb_port(), tb_device(), 1u << 20);
  ::unsetenv("TBVERBS_PROFILE");
  REQUIRE_FALSE(g);
  CHECK(g.error().is(ENOENT));
  CHECK(std::string(g.error().detail.view()).find("TBVERBS_PROFILE") != std::string::npos);
  ProfileEnv env("max_message_bytes=-1\n");
  auto h = largest_message_guess(Platform::apple, tb_port(), tb_device(), 1u << 20);
  REQUIRE_FALSE(h);
  CHECK(h.error().is(ErrorKind::invalid_argument));
}
