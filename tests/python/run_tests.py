"""Runs test cases of the Python client (unittest names, e.g. test_client.Errors) under CTest;
exits 77 (CTest's skip) with a message where the client cannot be imported: Debian's
python3-grpcio or python3-protobuf missing, or the build made no stubs (no grpc_python_plugin)."""

import sys
import unittest

try:
    import grpc  # noqa: F401
    import stagecoach.v1.coordinator_pb2_grpc  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: the Python client cannot be imported ({e}); scripts/test.sh installs "
          "python3-grpcio and python3-protobuf", file=sys.stderr)
    sys.exit(77)

program = unittest.main(module=None, argv=[sys.argv[0], "-v", *sys.argv[1:]], exit=False)
result = program.result
if not result.wasSuccessful():
    sys.exit(1)
# Every test skipped (e.g. no prometheus binary): CTest reports the test skipped.
sys.exit(77 if result.testsRun > 0 and len(result.skipped) == result.testsRun else 0)
