// The label value every loss and log-prob gatherer skips (PyTorch CrossEntropyLoss's and HF's
// ignore_index). One constant in algo/, the lowest layer that reads labels, so data/ (templates,
// collate, datasets), algo/ and train/ all mask with the same value.
#pragma once

#include <cstdint>

namespace mmpost::algo {

/// Label of a position the loss ignores (prompt, image tokens, padding).
inline constexpr int64_t kIgnoreIndex = -100;

}  // namespace mmpost::algo
