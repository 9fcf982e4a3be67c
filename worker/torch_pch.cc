// The translation unit that builds the precompiled LibTorch headers (stagecoach_torch_pch in
// worker/CMakeLists.txt); it has no code of its own.
