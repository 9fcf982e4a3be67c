// Debian's Python with python3-torch, which tests use to make files with PyTorch (TorchScript
// models, torch.save'd tensors) and to check exports. `python3` on PATH may be another Python
// without torch, so tests call this one by path. Tests that need it report Skipped where it is
// missing (stagecoach_test(... SKIPPABLE)).
#pragma once

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing {

inline constexpr char kPython[] = "/usr/bin/python3";

// Whether kPython can import every module of `modules` ("torch", "torch, numpy"); asked once
// per list.
inline bool PythonCanImport(const std::string& modules) {
  static std::mutex mu;
  static std::map<std::string, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(modules);
  if (it == known.end()) {
    const std::string command = absl::StrCat(kPython, " -c 'import ", modules, "' >/dev/null 2>&1");
    it = known.emplace(modules, std::system(command.c_str()) == 0).first;
  }
  return it->second;
}

inline bool PythonHasTorch() { return PythonCanImport("torch"); }

// tests/models/make_models.py: `kPython make_models.py DIR [--bench]` writes the TorchScript
// fixtures into DIR; its nn.Module classes are importable for Python reference checks.
inline std::string MakeModelsScript() { return TestDataDir() + "/../models/make_models.py"; }

// tests/models/nested_models.py: models as users write them (nested blocks, BatchNorm, tensors
// read by attribute); `python3 nested_models.py DIR` writes resnet.pt, vit.pt and attrread.pt.
inline std::string NestedModelsScript() {
  return TestDataDir() + "/../models/nested_models.py";
}

}  // namespace stagecoach::testing
