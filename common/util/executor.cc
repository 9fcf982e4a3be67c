#include "common/util/executor.h"

#include <utility>

namespace stagecoach {

void ManualExecutor::Run(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

int64_t ManualExecutor::RunUntilIdle() {
  int64_t ran = 0;
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return ran;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
    ++ran;
  }
}

int64_t ManualExecutor::pending() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

TaskScope::TaskScope() : state_(std::make_shared<State>()) {}

TaskScope::~TaskScope() { Close(); }

std::function<void()> TaskScope::Wrap(std::function<void()> fn) {
  return [state = state_, fn = std::move(fn)] {
    {
      absl::MutexLock lock(&state->mu);
      if (state->closed) return;
      ++state->running;
    }
    fn();
    absl::MutexLock lock(&state->mu);
    --state->running;
  };
}

void TaskScope::Close() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  auto idle = [s = state_.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->running == 0; };
  state_->mu.Await(absl::Condition(&idle));
}

}  // namespace stagecoach
