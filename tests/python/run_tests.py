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
sys.exit(0 if program.result.wasSuccessful() else 1)
