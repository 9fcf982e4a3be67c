#include "worker/runtime/checkpoint/background_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {

BackgroundWriter::BackgroundWriter(std::string what, absl::Duration timeout)
    : what_(std::move(what)), timeout_(timeout) {}

BackgroundWriter::~BackgroundWriter() {
  {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool BackgroundWriter::abandoned() const {
  absl::MutexLock lock(&mu_);
  return abandoned_;
}

absl::Status BackgroundWriter::Wait() {
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !running_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout_)) {
      return absl::DeadlineExceededError(absl::StrCat(
          what_, ": the previous write did not finish within ", absl::FormatDuration(timeout_)));
    }
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return std::exchange(failed_, absl::OkStatus());
}

absl::Status BackgroundWriter::Start(std::function<absl::Status()> write) {
  RETURN_IF_ERROR(Wait());
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  thread_ = std::thread([this, write = std::move(write)] {
    absl::Status status = write();
    absl::MutexLock lock(&mu_);
    if (!status.ok())
      failed_ = absl::Status(status.code(), absl::StrCat(what_, ": ", status.message()));
    running_ = false;
  });
  return absl::OkStatus();
}

absl::Status BackgroundWriter::Drain() { return Wait(); }

}  // namespace stagecoach::runtime
