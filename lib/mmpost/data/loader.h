// Streaming loader: reads JSONL lazily, shuffles within a seeded buffer, preprocesses on N worker
// threads into a bounded window, and hands out samples in a deterministic order (independent of
// thread timing) so runs and resumes are reproducible. Rank sharding: record k goes to rank
// k % world_size. Bad records become counted skips or an Error(kData), per on_bad_sample.
#pragma once

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "mmpost/core/check.h"
#include "mmpost/core/log.h"
#include "mmpost/io/jsonl.h"

namespace mmpost::data {

/// Loader settings.
struct LoaderOptions {
  std::string path;            // JSONL file
  int64_t batch_size = 8;
  int64_t num_workers = 2;     // preprocessing threads
  int64_t shuffle_buffer = 0;  // 0/1 = file order
  int64_t prefetch = 8;        // batches allowed in flight ahead of the consumer
  uint64_t seed = 0;
  bool skip_bad = false;       // on_bad_sample: skip (else the first bad record throws)
  bool repeat = false;         // start a new epoch at EOF instead of ending
  int rank = 0, world_size = 1;
};

/// Position in the stream, saved in checkpoints: epoch and records handed out in it.
struct LoaderCursor {
  int64_t epoch = 0;
  int64_t consumed = 0;
};

/// Seed for one sample's random augmentation, a function of (seed, epoch, position in the
/// stream) only, so it does not depend on which worker thread preprocesses the sample.
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t seq);

/// Streaming loader over records turned into `Sample`s by `make(record, line[, sample_seed])`
/// (called on worker threads; must be thread-safe; throws Error(kData) for a bad record).
template <class Sample>
class StreamingLoader {
 public:
  using MakeFn = std::function<Sample(const nlohmann::json& record, int64_t line, uint64_t seed)>;

  template <class F>
  StreamingLoader(LoaderOptions opts, F make) : opts_(std::move(opts)) {
    if constexpr (std::is_invocable_v<F, const nlohmann::json&, int64_t, uint64_t>) {
      make_ = std::move(make);
    } else {
      make_ = [f = std::move(make)](const nlohmann::json& r, int64_t line, uint64_t) {
        return f(r, line);
      };
    }
    MMPOST_CHECK_USAGE(opts_.batch_size > 0 && opts_.num_workers > 0, "loader: bad options");
  }
  ~StreamingLoader() { stop_epoch(); }
  StreamingLoader(const StreamingLoader&) = delete;
  StreamingLoader& operator=(const StreamingLoader&) = delete;

  /// Positions the stream (call before the first next_batch, e.g. when resuming).
  void seek(const LoaderCursor& c) {
    stop_epoch();
    cursor_ = c;
  }
  LoaderCursor cursor() const { return cursor_; }
  int64_t n_skipped() const { return n_skipped_; }

  /// Next batch of up to batch_size samples; a short batch ends an epoch. std::nullopt once the
  /// data is exhausted (repeat == false). Throws Error(kData) for a bad record unless skip_bad,
  /// and Error(kData) if an epoch yields no valid sample at all.
  std::optional<std::vector<Sample>> next_batch() {
    std::vector<Sample> batch;
    while (static_cast<int64_t>(batch.size()) < opts_.batch_size) {
      if (!running_) {
        if (finished_) break;
        start_epoch();
      }
      auto r = take_next();
      if (!r) {  // end of epoch
        stop_epoch();
        if (epoch_valid_ == 0) {
          throw Error(ErrorKind::kData, opts_.path + ": no usable sample in epoch " +
                                            std::to_string(cursor_.epoch) + " (" +
                                            std::to_string(n_skipped_) + " skipped)");
        }
        ++cursor_.epoch;
        cursor_.consumed = 0;
        if (!opts_.repeat) finished_ = true;
        if (!batch.empty()) break;
        if (finished_) return std::nullopt;
        continue;
      }
      ++cursor_.consumed;
      if (!r->error.empty()) {
        if (!opts_.skip_bad) {
          stop_epoch();
          throw Error(ErrorKind::kData, r->error,
                      "fix the record, or skip bad records and count them (recipe: "
                      "data.on_bad_sample=skip; eval: --on-bad-sample skip)");
        }
        if (++n_skipped_ <= 10) log_warn("skipped: " + r->error);
        continue;
      }
      ++epoch_valid_;
      batch.push_back(std::move(*r->sample));
    }
    if (batch.empty()) return std::nullopt;
    return batch;
  }

 private:
  struct Work {
    int64_t seq;
    io::JsonlRecord record;
  };
  struct Result {
    std::optional<Sample> sample;
    std::string error;
  };

  void start_epoch() {
    running_ = true;
    stop_ = false;
    producer_done_ = false;
    next_seq_ = cursor_.consumed;
    total_seq_ = -1;
    epoch_valid_ = cursor_.consumed > 0 ? 1 : 0;  // a resumed epoch already had valid samples
    results_.clear();
    work_.clear();
    producer_ = std::thread([this] { produce(); });
    for (int64_t i = 0; i < opts_.num_workers; ++i) workers_.emplace_back([this] { work(); });
  }

  void stop_epoch() {
    if (!running_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (producer_.joinable()) producer_.join();
    for (auto& w : workers_) w.join();
    workers_.clear();
    running_ = false;
  }

  int64_t window() const { return opts_.prefetch * opts_.batch_size + opts_.num_workers; }

  // Producer: reads records, shards, shuffles within the buffer, queues them in seq order.
  void produce() {
    try {
      io::JsonlReader reader(opts_.path);
      std::mt19937_64 rng(opts_.seed * 1000003ULL + static_cast<uint64_t>(cursor_.epoch));
      std::vector<io::JsonlRecord> buffer;
      int64_t index = 0, seq = 0;
      auto emit = [&](io::JsonlRecord&& rec) -> bool {
        int64_t s = seq++;
        if (s < cursor_.consumed) return true;  // resumed: already consumed, not preprocessed
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || s < next_seq_ + window(); });
        if (stop_) return false;
        work_.push_back({s, std::move(rec)});
        cv_.notify_all();
        return true;
      };
      auto pop_random = [&]() {
        std::uniform_int_distribution<size_t> dist(0, buffer.size() - 1);
        size_t k = dist(rng);
        std::swap(buffer[k], buffer.back());
        io::JsonlRecord r = std::move(buffer.back());
        buffer.pop_back();
        return r;
      };
      io::JsonlRecord rec;
      bool ok = true;
      while (ok && reader.next(rec)) {
        if (index++ % opts_.world_size != opts_.rank) continue;
        if (opts_.shuffle_buffer <= 1) {
          ok = emit(std::move(rec));
          continue;
        }
        buffer.push_back(std::move(rec));
        if (static_cast<int64_t>(buffer.size()) >= opts_.shuffle_buffer) ok = emit(pop_random());
      }
      while (ok && !buffer.empty()) ok = emit(pop_random());
      std::lock_guard<std::mutex> lock(mu_);
      total_seq_ = seq;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      producer_error_ = e.what();
      total_seq_ = next_seq_;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      producer_done_ = true;
    }
    cv_.notify_all();
  }

  // Worker: preprocesses queued records into results keyed by seq.
  void work() {
    while (true) {
      Work w;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !work_.empty() || producer_done_; });
        if (stop_ || (work_.empty() && producer_done_)) return;
        w = std::move(work_.front());
        work_.pop_front();
      }
      Result r;
      if (!w.record.error.empty()) {
        r.error = w.record.error;
      } else {
        try {
          r.sample = make_(w.record.value, w.record.line,
                           sample_seed(opts_.seed, cursor_.epoch, w.seq));
        } catch (const Error& e) {
          r.error = e.message();
        } catch (const std::exception& e) {
          r.error = io::location(opts_.path, w.record.line) + ": " + e.what();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        results_.emplace(w.seq, std::move(r));
      }
      cv_.notify_all();
    }
  }

  // Consumer side: the result with the next seq, or nullopt at the end of the epoch.
  std::optional<Result> take_next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return results_.count(next_seq_) > 0 || (total_seq_ >= 0 && next_seq_ >= total_seq_);
    });
    if (!producer_error_.empty()) {
      std::string err = producer_error_;
      producer_error_.clear();
      lock.unlock();
      stop_epoch();
      throw Error(ErrorKind::kData, err);
    }
    auto it = results_.find(next_seq_);
    if (it == results_.end()) return std::nullopt;
    Result r = std::move(it->second);
    results_.erase(it);
    ++next_seq_;
    cv_.notify_all();
    return r;
  }

  LoaderOptions opts_;
  MakeFn make_;
  LoaderCursor cursor_;
  int64_t n_skipped_ = 0;
  int64_t epoch_valid_ = 0;
  bool running_ = false, finished_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> work_;
  std::map<int64_t, Result> results_;
  int64_t next_seq_ = 0, total_seq_ = -1;
  bool stop_ = false, producer_done_ = false;
  std::string producer_error_;
  std::thread producer_;
  std::vector<std::thread> workers_;
};

/// Counts the records (non-blank lines) of a JSONL file that fall to `rank`.
int64_t count_records(const std::string& path, int rank = 0, int world_size = 1);

}  // namespace mmpost::data
