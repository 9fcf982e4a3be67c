"""The API's generated messages and stubs (stagecoach.v1 of proto/): types_pb2, coordinator_pb2,
coordinator_pb2_grpc, generation_pb2, generation_pb2_grpc, worker_pb2, worker_pb2_grpc. The
build writes them here (CMake into build/python, setup.py into the installed package)."""
