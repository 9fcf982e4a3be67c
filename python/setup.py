"""Builds the package with the API's stubs generated from ../proto (or $STAGECOACH_PROTO_DIR)
by protoc and gRPC's Python plugin (Debian: protobuf-compiler, protobuf-compiler-grpc):

    pip install --no-build-isolation ./python

(--no-build-isolation uses the installed setuptools rather than fetching one.)
"""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def proto_dir():
    path = os.environ.get("STAGECOACH_PROTO_DIR", os.path.join(HERE, "..", "proto"))
    if not os.path.isfile(os.path.join(path, "stagecoach", "v1", "coordinator.proto")):
        raise SystemExit(f"setup.py: no stagecoach/v1/*.proto under {path} (set "
                         "STAGECOACH_PROTO_DIR to the repository's proto directory)")
    return path


def generate_stubs(out_dir):
    """protoc's Python messages and gRPC stubs for every proto file, into out_dir/stagecoach/v1."""
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        raise SystemExit("setup.py: needs protoc and grpc_python_plugin (Debian packages "
                         "protobuf-compiler and protobuf-compiler-grpc)")
    src = proto_dir()
    protos = sorted(glob.glob(os.path.join(src, "stagecoach", "v1", "*.proto")))
    subprocess.run([protoc, f"--proto_path={src}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", *protos], check=True)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(self.build_lib)


setup(cmdclass={"build_py": BuildWithStubs})
