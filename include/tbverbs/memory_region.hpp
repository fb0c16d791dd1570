/// @file memory_region.hpp
/// Registered memory (`ibv_reg_mr`) and a page-aligned buffer to register.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "result.hpp"
#include "types.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// A zeroed, page-aligned buffer whose length is a whole number of pages. Apple's driver needs
/// page-aligned registrations (IOMMU). A buffer above the device's max_mr_size (16,384,000 bytes on
/// Thunderbolt) is registered as a MemoryRegionSet.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto buf
/// \until buf.error()
/// \skip std::snprintf
/// \until buf->data()
class AlignedBuffer {
public:
  /// Allocates at least `bytes` (rounded up to the page size). Fails with ENOMEM at Step::reg_mr.
  [[nodiscard]] static Result<AlignedBuffer> allocate(std::size_t bytes) {
    const std::size_t page = page_size();
    // Rounding SIZE_MAX up to a page wrapped to 0 and "allocated" an empty buffer.
    if (bytes > std::numeric_limits<std::size_t>::max() - page)
      return fail(Error::from_return(Step::reg_mr, ENOMEM)
                      .with_detail("allocating a page-aligned buffer of " + std::to_string(bytes) + " bytes: too large"));
    const std::size_t len = bytes == 0 ? page : (bytes + page - 1) / page * page;
    void* p = nullptr;
    if (const int rc = ::posix_memalign(&p, page, len); rc != 0)
      return fail(Error::from_return(Step::reg_mr, rc).with_detail("allocating a page-aligned buffer"));
    std::memset(p, 0, len);
    AlignedBuffer b;
    b.data_.reset(static_cast<std::byte*>(p));
    b.size_ = len;
    return b;
  }
  /// The system page size.
  static std::size_t page_size() noexcept {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : 4096;
  }
  /// The bytes.
  std::span<std::byte> bytes() const noexcept { return {data_.get(), size_}; }
  /// Start of the buffer.
  std::byte* data() const noexcept { return data_.get(); }
  /// Length in bytes (a whole number of pages).
  std::size_t size() const noexcept { return size_; }

private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  AlignedBuffer() = default;
  detail::Unique<std::byte, Free> data_;
  std::size_t size_ = 0;
};

/// A registered memory region. Move-only; deregistered on destruction (or by close()). Keeps its
/// protection domain alive. The memory itself is the caller's and must outlive the region.
///
/// Threads: the accessors and sge() only read and may be called from any number of threads at
/// once; work requests on several QPs may use one region concurrently. close() and moves must
/// not race with them.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto mr
/// \until mr.error()
/// \skip auto inbox
/// \until outbox.error()
class MemoryRegion {
public:
  /// Start address; null once closed or moved from.
  std::byte* data() const noexcept { return mr_.get() != nullptr ? static_cast<std::byte*>(mr_.get()->addr) : nullptr; }
  /// Length in bytes; 0 once closed or moved from.
  std::size_t size() const noexcept { return mr_.get() != nullptr ? mr_.get()->length : 0; }
  /// The registered bytes (empty once closed or moved from).
  std::span<std::byte> bytes() const noexcept { return {data(), size()}; }
  /// Local key (for scatter-gather entries); 0 once closed or moved from.
  std::uint32_t lkey() const noexcept { return mr_.get() != nullptr ? mr_.get()->lkey : 0; }
  /// Remote key (for a peer's RDMA WRITE or READ); 0 once closed or moved from.
  std::uint32_t rkey() const noexcept { return mr_.get() != nullptr ? mr_.get()->rkey : 0; }
  /// The access rights it was registered with.
  Access access() const noexcept { return access_; }

  /// A scatter-gather entry for `length` bytes at `offset`; `invalid_argument` when the range
  /// leaves the region (the NIC would fail the work request with a protection error); EBADF
  /// once the region was closed or moved from (its keys are gone).
  [[nodiscard]] Result<abi::ibv_sge> sge(std::size_t offset, std::size_t length) const noexcept {
    if (mr_.get() == nullptr) [[unlikely]]
      return fail(Error::from_errno(Step::make_sge, EBADF).with_detail("a closed or moved-from MemoryRegion"));
    if (offset > size() || length > size() - offset || length > 0xffffffffu)
      return fail(Error::make(Step::make_sge, ErrorKind::invalid_argument,
                              "range outside the registered memory region"));
    abi::ibv_sge s{};
    s.addr = reinterpret_cast<std::uintptr_t>(data()) + offset;
    s.length = static_cast<std::uint32_t>(length);
    s.lkey = lkey();
    return s;
  }

  /// Deregisters now and returns the verb's result.
  [[nodiscard]] Result<void> close() noexcept { return mr_.close(); }
  /// The raw `ibv_mr*`.
  abi::ibv_mr* native_handle() const noexcept { return mr_.get(); }

private:
  friend class ProtectionDomain;
  MemoryRegion(detail::Owned<abi::ibv_mr> mr, detail::Ref<detail::ContextInfo> info, Access access)
      : mr_(std::move(mr)), info_(std::move(info)), access_(access) {}
  detail::Owned<abi::ibv_mr> mr_;
  detail::Ref<detail::ContextInfo> info_;
  Access access_;
};

TBVERBS_NAMESPACE_END
