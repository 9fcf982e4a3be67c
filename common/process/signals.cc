#include "common/process/signals.h"

#include <pthread.h>

#include <mutex>

namespace stagecoach {

void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { signal(SIGPIPE, SIG_IGN); });
}

sigset_t BlockTerminationSignals() {
  IgnoreSigpipe();
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForTerminationSignal(const sigset_t& signals) {
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  return sig;
}

}  // namespace stagecoach
