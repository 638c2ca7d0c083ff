// A small persistent thread pool for keelSampleTokens: the sequences of a step are independent (each has its own
// sampler; the logits are read-only once decoded), so a step of many sampled sequences is spread over a few threads
// instead of one. Threads are started on first use and live as long as the process (the pool is never destroyed, so
// no joinable std::thread is left to a static destructor at exit); between steps they sleep on a condition variable.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace {

class SamplingPool {
public:
    /** Run fn(0..jobs-1) on the calling thread and up to threads-1 pool threads; returns when every job finished. */
    void run(unsigned threads, size_t jobs, const std::function<void(size_t)>& fn) {
        const unsigned helpers = static_cast<unsigned>(std::min<size_t>(threads, jobs)) - 1;
        if (threads <= 1 || jobs <= 1 || helpers == 0) {
            for (size_t i = 0; i < jobs; i++) fn(i);
            return;
        }
        std::unique_lock<std::mutex> lock(mu);
        // 1. Grow the pool to the helpers this call wants (each thread knows its rank: ranks ≥ wanted sit out).
        while (workers.size() < helpers) {
            const unsigned rank = static_cast<unsigned>(workers.size());
            workers.emplace_back([this, rank] { loop(rank); });
            workers.back().detach();
        }
        // 2. Publish the job set and wake the helpers; the caller drains jobs too.
        job = &fn;
        jobCount = jobs;
        next.store(0, std::memory_order_relaxed);
        wanted = helpers;
        running = helpers;
        generation++;
        lock.unlock();
        wake.notify_all();
        drain();
        // 3. Wait for the helpers' last jobs.
        lock.lock();
        done.wait(lock, [this] { return running == 0; });
        job = nullptr;
    }

private:
    std::mutex mu;
    std::condition_variable wake;
    std::condition_variable done;
    std::vector<std::thread> workers;
    const std::function<void(size_t)>* job = nullptr;
    size_t jobCount = 0;
    std::atomic<size_t> next{0};
    uint64_t generation = 0;
    unsigned wanted = 0;
    unsigned running = 0;

    void drain() {
        for (size_t i = next.fetch_add(1); i < jobCount; i = next.fetch_add(1)) (*job)(i);
    }

    void loop(unsigned rank) {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            wake.wait(lock, [&] { return generation != seen; });
            seen = generation;
            if (rank >= wanted) continue;  // not needed for this call
            lock.unlock();
            drain();
            lock.lock();
            if (--running == 0) done.notify_one();
        }
    }
};

}  // namespace

/** fn(0..jobs-1) over the calling thread and up to threads-1 pool threads (see SamplingPool); jobs must not throw. */
void keelParallelFor(unsigned threads, size_t jobs, const std::function<void(size_t)>& fn) {
    static SamplingPool* pool = new SamplingPool();  // leaked on purpose: lives as long as its detached threads
    pool->run(threads, jobs, fn);
}
