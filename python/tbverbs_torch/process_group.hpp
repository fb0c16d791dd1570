// tbverbs_torch: a torch.distributed process-group backend over tbverbs' collectives layer
// (docs/pytorch.md). One Communicator per process group; the collectives run in order on one
// worker thread per group (a Communicator is used by one thread at a time, and every rank must
// issue the collectives in the same order, which torch guarantees), and each call returns a Work
// that completes when its collective has.
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

/// A collective in flight: completes (finish(), the future) when the worker has run it.
class Work final : public c10d::Work {
public:
  Work(int rank, c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
       std::chrono::milliseconds timeout)
      : c10d::Work(rank, type), what_(what), outputs_(std::move(outputs)), timeout_(timeout),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  /// Waits until the collective completes, at most `timeout` (none given: the process group's
  /// timeout); rethrows its error.
  bool wait(std::chrono::milliseconds timeout = no_timeout) override {
    const auto limit = timeout == no_timeout ? timeout_ : timeout;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, limit, [&] { return completed_; }))
      TORCH_CHECK(false, "tbverbs: ", what_, " did not complete within ", limit.count(), " ms (",
                  timeout == no_timeout ? "the process group's timeout" : "the timeout given to wait()", ")");
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  /// Called by the worker once the collective ran: `error` null on success.
  void complete(std::exception_ptr error) {
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  }

private:
  const char* what_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// The "tbverbs" backend: CPU tensors, contiguous, of float32, float64, float16, bfloat16, int8,
/// int32, int64 and uint8 (uint32, uint64 on torch 2.3+); all_reduce (SUM, PRODUCT, MIN, MAX,
/// AVG), all_gather (a list, or into one tensor), reduce_scatter (a list, or from one tensor),
/// broadcast, reduce, gather, scatter, all_to_all_single (equal splits), send/recv (matched per
/// pair in call order; tags are not used), barrier.
class ProcessGroupTbverbs final : public BackendBase {
public:
  /// Connects this rank: rendezvous through `store` (rank 0 listens on a free port and publishes
  /// it there with the job's token; the others read it), then the Communicator's set-up. Options
  /// from the environment as CommunicatorOptions::from_env(rank, size) reads them; the timeout is
  /// the process group's unless TBVERBS_TIMEOUT_MS is set. Throws with tbverbs' message.
  static c10::intrusive_ptr<BackendBase> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout);

  ProcessGroupTbverbs(tbverbs::Communicator comm, std::chrono::milliseconds timeout);
  ~ProcessGroupTbverbs() override;
  ProcessGroupTbverbs(const ProcessGroupTbverbs&) = delete;
  ProcessGroupTbverbs& operator=(const ProcessGroupTbverbs&) = delete;

  const std::string getBackendName() const override { return "tbverbs"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
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
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

private:
  // Queues `run` on the worker; the Work completes when it returns (or throws).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
                                         std::function<tbverbs::Result<void>(tbverbs::Communicator&)> run);
  void worker_loop();

  tbverbs::Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

} // namespace tbverbs_torch
