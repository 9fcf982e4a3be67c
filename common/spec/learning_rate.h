// The learning rate a job's optimizer uses at each step of its timeline (training.lr_schedule).
// No LibTorch: the worker sets it on its optimizer, the coordinator and docs describe it.
//
// At 0-based global step k of a timeline of T steps (T = the resumed checkpoint's step +
// training.steps), with base = training.optimizer.lr and w = warmup_steps:
//   k < w                   base * (k+1) / (w+1)                          (every kind)
//   constant, k >= w        base
//   linear, w <= k < T-1    base + (min_lr - base) * (k-w) / (T-1-w)
//   cosine, w <= k < T-1    min_lr + (base - min_lr) * (1 + cos(pi * (k-w) / (T-1-w))) / 2
//   linear/cosine, k >= T-1 min_lr exactly (also when the warmup reaches past T-1: the end of
//                           the timeline wins over the warmup's last steps)
// Skipped steps (non-finite gradients) count: k is the global step, whatever happened in it.
//
// Thread safety: pure.
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"

namespace stagecoach::spec {

// The learning rate at global step `k` (>= 0) of a timeline of `timeline_steps` (>= 1) steps.
double LearningRateAt(const LrScheduleSpec& schedule, double base_lr, int64_t k,
                      int64_t timeline_steps);

}  // namespace stagecoach::spec
