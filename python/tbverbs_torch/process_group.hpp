// tbverbs_torch: a torch.distributed process-group backend over tbverbs' collectives layer
// (docs/pytorch.md). One Communicator per process group (a subgroup's split from the default
// group's: the same links); every op starts the layer's requests (collective/request.hpp), so
// several run in flight on the layer's progress thread, in the order torch issues them on every
// rank, and returns a Work that a completer thread completes when its requests have.
//
// PyTorch 1.13 (Debian 12) derives backends from c10d::ProcessGroup; PyTorch 2.x from
// c10d::Backend, with the same collective signatures. BackendBase is whichever this torch has.
#pragma once

#include <tbverbs/collective.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tbverbs_torch {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

/// What Work::wait() is given when no timeout is (torch's kNoTimeout, a global in 1.13 and in
/// namespace c10d in 2.x).
inline constexpr std::chrono::milliseconds no_timeout{0};

class Core;

/// A collective in flight: started on the layer as a Request (send and recv: held until the
/// program waits on or tests any Work, or starts a collective, as the layer holds its
/// point-to-point groups), completed (finish(), the future) by the process group's completer
/// thread once its Request did, after `finish_` (a copy out of the layer's contiguous buffer).
class Work final : public c10d::Work {
public:
  Work(std::shared_ptr<Core> core, int rank, c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
       std::chrono::milliseconds timeout)
      : c10d::Work(rank, type), core_(std::move(core)), what_(what), outputs_(std::move(outputs)), timeout_(timeout),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  /// Starts the held sends and recvs (as the layer's test() does), then says whether this completed.
  bool isCompleted() override;
  /// Waits until the collective completes, at most `timeout` (none given: the process group's);
  /// rethrows its error. On expiry the communicator is aborted (every rank's call fails at once:
  /// a collective cannot be left half done) and this throws with tbverbs' message.
  bool wait(std::chrono::milliseconds timeout = no_timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  /// The completer, once the Request completed: `error` null on success.
  void complete(std::exception_ptr error) {
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  }

  /// One call as the layer's Communicator::start() takes it.
  struct Call {
    tbverbs::collective::Collective kind; ///< The collective.
    std::span<const std::byte> in;        ///< What it reads.
    std::span<std::byte> out;             ///< What it writes.
    tbverbs::DType type;                  ///< Element type.
    tbverbs::ReduceOp op;                 ///< Reduction.
    int arg;                              ///< Root or peer.
  };

private:
  friend class Core;
  friend class ProcessGroupTbverbs;
  std::shared_ptr<Core> core_;
  const char* what_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<Call> calls_;                      ///< What it starts (several for the list and uneven forms).
  std::vector<tbverbs::Request> requests_;       ///< Started (empty while held).
  std::vector<at::Tensor> keep_;                 ///< Buffers the calls read or write, alive until complete.
  std::function<void()> finish_;                 ///< After the calls: copies out (may be empty).
};

/// One process group's communicator, its held and running Works, and the completer thread that
/// completes them in start order (the layer completes requests in start order). Shared by the
/// process group and its Works (a Work may outlive the group; it is complete by then).
class Core {
public:
  Core(tbverbs::Communicator comm, std::chrono::milliseconds timeout);
  /// Starts `w`'s calls now, or, for send and recv, holds them until flush().
  void submit(const c10::intrusive_ptr<Work>& w, bool point_to_point);
  /// Starts every held send and recv, as one group of the layer's.
  void flush();
  /// Aborts the communicator (a wait that gave up): every call of every rank fails at once.
  void abort(const std::string& why);
  /// Runs what is started, stops the completer, closes the communicator.
  void shut_down();
  /// The communicator (for the subgroups made from it; under lock()).
  tbverbs::Communicator& comm() { return comm_; }
  /// Held while using comm() from outside.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

private:
  void start(Work& w); // under mutex_
  void completer_loop();
  tbverbs::Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<c10::intrusive_ptr<Work>> held_;    ///< send/recv not yet started.
  std::deque<c10::intrusive_ptr<Work>> running_;  ///< Started, in start order.
  bool stopping_ = false;
  std::thread completer_;
};

/// The "tbverbs" backend: CPU tensors, contiguous, of float32, float64, float16, bfloat16, int8,
/// int32, int64, uint8 and bool (uint32, uint64 on torch 2.3+); all_reduce (SUM, PRODUCT, MIN,
/// MAX, AVG) and its coalesced form, all_gather (a list, or into one tensor), reduce_scatter (a
/// list, or from one tensor), broadcast, reduce, gather, scatter, all_to_all (lists) and
/// all_to_all_single (equal or uneven splits), send/recv (matched per pair in call order; tags
/// are not used), barrier. Every op is asynchronous: several may be in flight.
class ProcessGroupTbverbs final : public BackendBase {
public:
  /// Connects this rank: rendezvous through `store` (rank 0 listens on a free port and publishes
  /// it there with the job's token; the others read it), then the Communicator's set-up. Options
  /// from the environment as CommunicatorOptions::from_env(rank, size) reads them; the timeout is
  /// the process group's unless TBVERBS_TIMEOUT_MS is set. A subgroup (`global_ranks` not empty)
  /// of a process whose default group is tbverbs' is a subgroup of its communicator instead: no
  /// rendezvous, no new link. Throws with tbverbs' message.
  static c10::intrusive_ptr<BackendBase> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout, const std::vector<int>& global_ranks);

  ProcessGroupTbverbs(tbverbs::Communicator comm, std::chrono::milliseconds timeout);
  ~ProcessGroupTbverbs() override;
  ProcessGroupTbverbs(const ProcessGroupTbverbs&) = delete;
  ProcessGroupTbverbs& operator=(const ProcessGroupTbverbs&) = delete;

  const std::string getBackendName() const override { return "tbverbs"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<std::int64_t>& output_splits,
                                               std::vector<std::int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

private:
  // A Work for `calls` (their buffers in `keep`), started (or held: send and recv).
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
                                        std::vector<Work::Call> calls, std::vector<at::Tensor> keep = {},
                                        std::function<void()> finish = {});

  // all_to_all_single with uneven splits (alltoall_base's checks made).
  c10::intrusive_ptr<c10d::Work> uneven_all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<std::int64_t>& in_rows,
                                                   const std::vector<std::int64_t>& out_rows, tbverbs::DType dt);

  std::shared_ptr<Core> core_;
  std::chrono::milliseconds timeout_;
};

} // namespace tbverbs_torch
