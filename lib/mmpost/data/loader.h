// Streaming loader: reads JSONL lazily, shuffles within a seeded buffer, preprocesses on N worker
// threads into a bounded window, and hands out samples in a deterministic order (independent of
// thread timing) so runs and resumes are reproducible. With preload, each epoch's samples are
// made before its first batch is handed out, so preprocessing does not compete with training for
// the cores (see LoaderOptions::preload). Rank sharding: every rank reads the same
// shuffled stream and preprocesses only the positions p with p % world_size == rank, and each
// step takes one window of batch_size * world_size positions, so N ranks with batch B see exactly
// the samples of one process with batch N*B. Bad records become counted skips or an
// Error(kData), per on_bad_sample.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
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
  int64_t max_records = 0;     // stop each epoch after this many stream positions (0: all)
  /// > 0: each record's sample is kept after it is first made (by line, up to this many bytes,
  /// first come first kept) and reused in later epochs instead of decoding and tokenizing again.
  /// Only for make functions whose result does not depend on the seed (no augmentation).
  int64_t cache_bytes = 0;
  /// With cache_bytes > 0: at the start of each epoch, next_batch waits until every sample of
  /// the epoch this rank will still take (bounded by set_remaining_windows) is made, as long as
  /// they fit in cache_bytes (past that, the rest streams as without preload), instead of making
  /// them during training, where the worker threads compete with the training step for the
  /// cores. The same samples in the same order as without it; bad records still fail or are
  /// skipped at their own batch. Once an epoch's samples did not fit, later epochs stream (the
  /// cache already holds what fits), so preloaded samples stay within cache_bytes.
  bool preload = false;
};

/// Approximate memory of a cached sample: its image tensors plus a fixed allowance for token
/// vectors and strings.
template <class Sample>
int64_t approx_sample_bytes(const Sample& s) {
  int64_t b = static_cast<int64_t>(sizeof(Sample)) + 4096;
  if constexpr (requires { s.pixel_values; }) {
    if (s.pixel_values.defined()) b += static_cast<int64_t>(s.pixel_values.nbytes());
  }
  if constexpr (requires { s.corrupted_pixel_values; }) {
    if (s.corrupted_pixel_values.defined()) {
      b += static_cast<int64_t>(s.corrupted_pixel_values.nbytes());
    }
  }
  return b;
}

/// Position in the stream, saved in checkpoints: the epoch and the stream position (records of
/// the shuffled epoch, over all ranks) where the next window starts. The same on every rank, so a
/// checkpoint from N ranks resumes on any number of ranks.
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
  /// The number of next_batch calls the run will still make (< 0: unknown, the default): bounds
  /// what preload makes ahead, so a run that ends mid-epoch does not preprocess the rest.
  void set_remaining_windows(int64_t n) { remaining_windows_ = n; }
  /// Samples made or taken from the cache before the first batch of an epoch (preload), summed
  /// over epochs.
  int64_t n_preloaded() const { return n_preloaded_; }
  int64_t n_skipped() const { return n_skipped_; }
  /// Samples made so far (cache misses included) and samples served from the cache.
  int64_t n_made() const { return n_made_.load(); }
  int64_t n_cache_hits() const { return n_cache_hits_.load(); }

  /// This rank's share of the next window of the stream: the next batch_size * world_size
  /// records (one global batch), of which this rank gets those at stream positions p with
  /// p % world_size == rank, so the union over ranks is exactly the batch that one process with
  /// batch_size * world_size would get. A bad record under skip_bad is dropped from its window
  /// (the batch is smaller; it is not refilled), so every rank agrees on the windows. The last
  /// window of an epoch may be short, and a rank's share of it may be empty: an empty vector
  /// (the rank still takes the step, contributing no sample). With repeat the next call starts
  /// the next epoch; otherwise std::nullopt once the data is exhausted. Throws Error(kData) for a
  /// bad record unless skip_bad, Error(kData) with repeat when the data holds no record at all,
  /// and Error(kData) if every record this rank owned in an epoch was bad.
  std::optional<std::vector<Sample>> next_batch() {
    std::vector<Sample> batch;
    while (true) {
      if (!running_) {
        if (finished_) return std::nullopt;
        start_epoch();
        wait_preloaded();
      }
      const int64_t w0 = cursor_.consumed, w1 = w0 + opts_.batch_size * opts_.world_size;
      bool epoch_end = false;
      while (next_seq_ < w1) {
        auto r = take_next();
        if (!r) {
          epoch_end = true;
          break;
        }
        ++epoch_owned_;
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
      if (!epoch_end) {
        cursor_.consumed = w1;
        if (remaining_windows_ > 0) --remaining_windows_;
        return batch;
      }
      // End of the epoch (the same window on every rank: the record count is global).
      stop_epoch();
      if (epoch_owned_ > 0 && epoch_valid_ == 0) {
        throw Error(ErrorKind::kData, opts_.path + ": no usable sample in epoch " +
                                          std::to_string(cursor_.epoch) + " (" +
                                          std::to_string(n_skipped_) + " skipped)");
      }
      // No record at all (every rank sees the global count): with repeat, the next epoch would
      // end at once too, forever.
      if (total_seq_ == 0 && opts_.repeat)
        throw Error(ErrorKind::kData, opts_.path + ": no records (the file is empty or holds "
                                                   "only blank lines)");
      const bool window_had_records = w0 < total_seq_;
      ++cursor_.epoch;
      cursor_.consumed = 0;
      if (!opts_.repeat) finished_ = true;
      if (window_had_records) {  // the epoch's short last window (maybe empty here)
        if (remaining_windows_ > 0) --remaining_windows_;
        return batch;
      }
      if (finished_) return std::nullopt;
    }
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
    next_seq_ = first_owned(cursor_.consumed);
    total_seq_ = -1;
    epoch_valid_ = cursor_.consumed > 0 ? 1 : 0;  // a resumed epoch already had valid samples
    epoch_owned_ = epoch_valid_;
    results_.clear();
    work_.clear();
    preload_bytes_ = 0;
    preloading_ =
        opts_.preload && preload_fits_ && opts_.cache_bytes > 0 && remaining_windows_ != 0;
    epoch_preloads_ = preloading_;
    // Stream positions to make before the first batch: the run's remaining windows, or the
    // whole epoch when that is unknown (the producer ends the epoch earlier in either case).
    preload_end_ = remaining_windows_ > 0
                       ? cursor_.consumed + remaining_windows_ * opts_.batch_size * opts_.world_size
                       : std::numeric_limits<int64_t>::max();
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

  // Stream positions this rank may preprocess ahead of the consumer.
  int64_t window() const {
    return (opts_.prefetch * opts_.batch_size + opts_.num_workers) * opts_.world_size;
  }
  // Whether the producer may queue stream position s now (called under mu_): within the
  // prefetch window of the consumer, or (preloading) before preload_end_ while the queue of
  // unparsed records stays short (the records, not the samples, are what it bounds).
  bool may_queue(int64_t s) const {
    if (s < next_seq_ + window()) return true;
    return preloading_ && s < preload_end_ &&
           static_cast<int64_t>(work_.size()) < 4 * opts_.num_workers + 16;
  }
  // The number of this rank's positions in [a, b), a being one of them.
  int64_t owned_between(int64_t a, int64_t b) const {
    return b > a ? (b - a + opts_.world_size - 1) / opts_.world_size : 0;
  }

  // Consumer side, at the start of an epoch: waits until the epoch's samples up to preload_end_
  // are made (or the preload budget ran out, or the producer failed: take_next reports that).
  void wait_preloaded() {
    if (!epoch_preloads_) return;
    const auto t0 = std::chrono::steady_clock::now();
    int64_t n = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);  // (the budget may already have run out)
      cv_.wait(lock, [&] {
        if (stop_ || !preloading_ || !producer_error_.empty()) return true;
        const int64_t end = total_seq_ >= 0 ? std::min(total_seq_, preload_end_) : preload_end_;
        if (end == std::numeric_limits<int64_t>::max()) return false;  // epoch size not known yet
        return static_cast<int64_t>(results_.size()) >= owned_between(next_seq_, end);
      });
      n = static_cast<int64_t>(results_.size());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (n_preloaded_ == 0 && n > 0) {  // logged once a run
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.2f", s);
      log_info("data: " + std::to_string(n) + " samples of epoch " +
               std::to_string(cursor_.epoch) + " made before its first step in " + secs +
               " s (data.preload)");
    }
    n_preloaded_ += n;
  }
  // The first stream position >= p that belongs to this rank.
  int64_t first_owned(int64_t p) const {
    const int64_t w = opts_.world_size, r = opts_.rank;
    return p + ((r - p % w) % w + w) % w;
  }

  // Producer: reads every record, shuffles within the buffer (the same stream on every rank), and
  // queues this rank's positions (seq % world_size == rank) in seq order.
  void produce() {
    try {
      io::JsonlReader reader(opts_.path);
      std::mt19937_64 rng(opts_.seed * 1000003ULL + static_cast<uint64_t>(cursor_.epoch));
      std::vector<io::JsonlRecord> buffer;
      int64_t seq = 0;
      auto emit = [&](io::JsonlRecord&& rec) -> bool {
        if (opts_.max_records > 0 && seq >= opts_.max_records) return false;  // the cap: end here
        int64_t s = seq++;
        if (s % opts_.world_size != opts_.rank) return true;  // another rank's record
        if (s < cursor_.consumed) return true;  // resumed: already consumed, not preprocessed
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || may_queue(s); });
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
      while (ok && (opts_.max_records <= 0 || seq < opts_.max_records) && reader.next(rec)) {
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
        if (opts_.cache_bytes > 0) {
          std::lock_guard<std::mutex> lock(cache_mu_);
          auto it = cache_.find(w.record.line);
          if (it != cache_.end()) {
            r.sample = it->second;  // tensors shared: collate and .to() never write into them
            ++n_cache_hits_;
          }
        }
        if (!r.sample) try {
          r.sample = make_(w.record.value, w.record.line,
                           sample_seed(opts_.seed, cursor_.epoch, w.seq));
          ++n_made_;
          if (opts_.cache_bytes > 0) {
            const int64_t bytes = approx_sample_bytes(*r.sample);
            std::lock_guard<std::mutex> lock(cache_mu_);
            if (cache_used_ + bytes <= opts_.cache_bytes) {
              cache_.emplace(w.record.line, *r.sample);
              cache_used_ += bytes;
            }
          }
        } catch (const Error& e) {
          r.error = e.message();
        } catch (const std::exception& e) {
          r.error = io::location(opts_.path, w.record.line) + ": " + e.what();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (preloading_ && r.sample) {  // the preload budget: data.cache_gb
          preload_bytes_ += approx_sample_bytes(*r.sample);
          if (preload_bytes_ > opts_.cache_bytes) {  // the rest streams, as later epochs do
            preloading_ = false;
            preload_fits_ = false;
          }
        }
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
    next_seq_ += opts_.world_size;
    cv_.notify_all();
    return r;
  }

  LoaderOptions opts_;
  MakeFn make_;
  LoaderCursor cursor_;
  int64_t n_skipped_ = 0;
  int64_t epoch_valid_ = 0, epoch_owned_ = 0;
  bool running_ = false, finished_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> work_;
  std::map<int64_t, Result> results_;
  int64_t next_seq_ = 0, total_seq_ = -1;
  bool stop_ = false, producer_done_ = false;
  bool preloading_ = false;        // this epoch's preload is still filling (guarded by mu_)
  int64_t preload_end_ = 0;        // stream position where this epoch's preload stops
  int64_t preload_bytes_ = 0;      // approximate bytes made by this epoch's preload
  int64_t remaining_windows_ = -1; // next_batch calls the run still makes (< 0: unknown)
  bool preload_fits_ = true;       // false once an epoch's preload ran past cache_bytes
  bool epoch_preloads_ = false;    // this epoch started with a preload (consumer thread only)
  int64_t n_preloaded_ = 0;
  std::string producer_error_;
  std::thread producer_;
  std::vector<std::thread> workers_;

  std::mutex cache_mu_;                // guards cache_ and cache_used_ (workers of every epoch)
  std::map<int64_t, Sample> cache_;    // line -> sample
  int64_t cache_used_ = 0;
  std::atomic<int64_t> n_made_{0}, n_cache_hits_{0};
};

/// Counts the records (non-blank lines) of a JSONL file that fall to `rank`.
int64_t count_records(const std::string& path, int rank = 0, int world_size = 1);

/// The result of validate_records: every record checked, bad ones listed in file order.
struct ValidationReport {
  int64_t n_records = 0;            // non-blank lines
  int64_t n_bad = 0;                // malformed or refused by the check
  std::vector<std::string> errors;  // "FILE:LINE: reason" of the first max_errors bad records
  double seconds = 0;
};

/// One streaming pass over a JSONL file before training: each line is parsed (io::JsonlReader,
/// so malformed JSON reads as the loader reports it) and handed to `check(record, line)` on
/// `num_workers` threads; `check` throws Error(kData) "FILE:LINE: reason" for a bad record (the
/// stage's own sample builder, without decoding images). Memory stays bounded (chunks of 4096
/// records). Throws only for an unreadable file; bad records are reported, not thrown.
ValidationReport validate_records(const std::string& path,
                                  const std::function<void(const nlohmann::json&, int64_t)>& check,
                                  int64_t num_workers = 2, int64_t max_errors = 20);

/// Runs validate_records on `path` and acts on it before step 1: logs the pass ("N records
/// checked in S s"); with bad records and !skip_bad throws Error(kData) listing every one (up to
/// max_errors, then "... and K more") with FILE:LINE and the reason; with skip_bad logs how many
/// records will be skipped and returns the report. `what` names the stage in logs. Also throws
/// Error(kData) naming the file when it holds no record, or when every record is bad (skip_bad
/// too): training would have nothing to learn from.
ValidationReport validate_before_training(
    const std::string& path, const std::function<void(const nlohmann::json&, int64_t)>& check,
    bool skip_bad, int64_t num_workers, const std::string& what, int64_t max_errors = 20);

}  // namespace mmpost::data
