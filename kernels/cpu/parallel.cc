#include "kvtier/kernels/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::kernels {
namespace {

// One ParallelFor call's chunks not yet finished.
struct Job {
  size_t pending = 0;
  std::condition_variable done;
};

struct Task {
  std::function<void()> run;
  Job* job;
};

thread_local bool in_chunk = false;

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive main's statics
    return *pool;
  }

  void Resize(size_t threads) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_ = std::max<size_t>(threads, 1);
    while (workers_.size() + 1 < threads_) workers_.emplace_back([this] { Work(); });
  }
  size_t threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

  void Run(std::vector<std::function<void()>> chunks) {
    Job job;
    std::unique_lock<std::mutex> lock(mu_);
    job.pending = chunks.size();
    for (size_t i = 1; i < chunks.size(); ++i) queue_.push_back({std::move(chunks[i]), &job});
    work_.notify_all();
    lock.unlock();
    RunChunk({std::move(chunks[0]), &job});
    lock.lock();
    // Help with queued chunks (this call's or others') instead of idling.
    while (job.pending > 0) {
      if (!queue_.empty()) {
        Task task = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        RunChunk(std::move(task));
        lock.lock();
      } else {
        job.done.wait(lock);
      }
    }
  }

 private:
  void RunChunk(Task task) {
    in_chunk = true;
    task.run();
    in_chunk = false;
    std::lock_guard<std::mutex> lock(mu_);
    if (--task.job->pending == 0) task.job->done.notify_all();
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [this] { return !queue_.empty(); });
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      RunChunk(std::move(task));
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::deque<Task> queue_;
  std::vector<std::thread> workers_;
  size_t threads_ = 1;
};

}  // namespace

void SetKernelThreads(size_t threads) { Pool::Get().Resize(threads); }
size_t KernelThreads() { return Pool::Get().threads(); }

void ParallelFor(size_t n, size_t min_chunk, const std::function<void(size_t, size_t)>& fn) {
  const size_t threads = in_chunk ? 1 : KernelThreads();
  const size_t chunks = std::min(threads, std::max<size_t>(n / std::max<size_t>(min_chunk, 1), 1));
  if (chunks <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::vector<std::function<void()>> work;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    work.push_back([&fn, begin, end] { fn(begin, end); });
  }
  Pool::Get().Run(std::move(work));
}

}  // namespace kvtier::kernels
