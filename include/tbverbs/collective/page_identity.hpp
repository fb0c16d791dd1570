/// @file collective/page_identity.hpp
/// `collective::PageIdentity`: which physical pages back a range of this process's memory, as far
/// as the system lets a process see it, so that a registration is used only for the memory it was
/// made for. ibv_reg_mr pins the pages behind a range when it is called (ibv_reg_mr(3)); a range
/// unmapped and mapped again afterwards is other memory at the same address, and data sent into
/// the old registration lands in the old pages. Two identities of the same range are equal only
/// while the same pages back it.
///
/// On Linux the page frame numbers come from /proc/self/pagemap (bits 0-54 of each present page's
/// entry); the kernel shows them only to a process with CAP_SYS_ADMIN and reads them as 0
/// otherwise (proc(5)). Registered pages cannot move while the registration holds them, so equal
/// frames prove the same memory. Where frames cannot be read (no privilege, macOS) `provable()` is
/// false and a caller must not rely on the identity: the registration cache then registers such
/// memory for one call only (collective/registration_cache.hpp).
#pragma once

#include "../config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <cstddef>
#include <cstdint>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// The pages behind a range (see the top of this file): a digest of their frame numbers.
class PageIdentity {
public:
  /// The identity of every page covering [data, data + bytes) now; not provable() when the frames
  /// cannot be read (or a page is not present). Reads 8 bytes per 4 KiB page (about 30 ns each:
  /// 0.9 ms for 64 MiB here).
  static PageIdentity of(const void* data, std::size_t bytes) noexcept { return read(data, bytes, SIZE_MAX); }
  /// The same over at most `pages` pages spread evenly over the range (the first and the last
  /// among them): a spot check, which sees memory freed and mapped again as a whole (a buffer
  /// reallocated) but may miss a part mapped over. About 0.7 us a page.
  static PageIdentity sample(const void* data, std::size_t bytes, std::size_t pages) noexcept { return read(data, bytes, pages); }

  /// True when the frames could be read: the identity then tells memories apart.
  bool provable() const noexcept { return provable_; }
  /// True when both are provable and the same pages back both.
  friend bool operator==(const PageIdentity& a, const PageIdentity& b) noexcept {
    return a.provable_ && b.provable_ && a.digest_ == b.digest_;
  }

private:
  static PageIdentity read(const void* data, std::size_t bytes, std::size_t at_most) noexcept {
    PageIdentity id;
    const int fd = pagemap_fd();
    if (fd < 0 || bytes == 0 || at_most == 0) return id;
    const long page_size = ::sysconf(_SC_PAGESIZE);
    const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : 4096;
    const auto first = reinterpret_cast<std::uintptr_t>(data) / page;
    const auto last = (reinterpret_cast<std::uintptr_t>(data) + bytes - 1) / page;
    const std::uintptr_t count = last - first + 1;
    std::uint64_t digest = 0xcbf29ce484222325ull; // FNV-1a over the frame numbers
    auto mix = [&](std::uint64_t entry) {
      const std::uint64_t pfn = entry & ((std::uint64_t{1} << 55) - 1);
      if ((entry >> 63) == 0 || pfn == 0) return false; // not present, or frames hidden
      for (int b = 0; b < 8; ++b) digest = (digest ^ ((pfn >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
      return true;
    };
    std::uint64_t entries[512];
    if (count <= at_most) {
      for (std::uintptr_t p = first; p <= last;) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uintptr_t>(last - p + 1, 512));
        const auto want = static_cast<ssize_t>(n * sizeof(std::uint64_t));
        if (::pread(fd, entries, static_cast<std::size_t>(want), static_cast<off_t>(p * sizeof(std::uint64_t))) != want) return id;
        for (std::size_t k = 0; k < n; ++k)
          if (!mix(entries[k])) return id;
        p += n;
      }
    } else {
      for (std::size_t k = 0; k < at_most; ++k) {
        const std::uintptr_t p = first + (at_most > 1 ? (count - 1) * k / (at_most - 1) : 0);
        if (::pread(fd, entries, sizeof(std::uint64_t), static_cast<off_t>(p * sizeof(std::uint64_t))) != sizeof(std::uint64_t) ||
            !mix(entries[0]))
          return id;
      }
    }
    id.digest_ = digest;
    id.provable_ = true;
    return id;
  }

  // /proc/self/pagemap, opened once per process (a forked child opens its own: the file is the
  // opener's), -1 where there is none.
  static int pagemap_fd() noexcept {
#if defined(__linux__)
    static std::mutex mu;
    static int fd = -1;
    static pid_t owner = 0;
    const std::lock_guard<std::mutex> lock(mu);
    const pid_t me = ::getpid();
    if (owner != me) {
      if (fd >= 0) ::close(fd); // the parent's, inherited across fork
      fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
      owner = me;
    }
    return fd;
#else
    return -1;
#endif
  }

  std::uint64_t digest_ = 0;
  bool provable_ = false;
};

} // namespace collective
TBVERBS_NAMESPACE_END
