// libFuzzer target: ReadManifest (coordinator/checkpoints/checkpoint_manifest.h), which the
// coordinator runs on a checkpoint's manifest.json before a job resumes from it, on arbitrary
// bytes. ReadManifest takes a step directory, so each input is written to <tmp>/manifest.json first
// (the parser itself is private to checkpoint_manifest.cc). Errors are expected; a crash, a
// sanitizer report or an uncaught exception is a bug. Seeds: tests/fuzz/corpus/checkpoint_manifest.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coordinator/checkpoints/checkpoint_manifest.h"

namespace {

// A fresh directory under $TMPDIR (or /tmp) for this process, removed at exit.
const std::string& StepDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/manifest_fuzz.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    auto* made = new std::string(pattern);
    std::atexit([] {
      std::remove((*dir + "/manifest.json").c_str());
      rmdir(dir->c_str());
    });
    return made;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = StepDir();
  FILE* f = std::fopen((dir + "/manifest.json").c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  (void)stagecoach::coordinator::ReadManifest(dir);
  return 0;
}
