"""`pip install ./python` into a fresh virtual environment (with the system's site packages for
grpcio, protobuf and NumPy; no index: nothing is downloaded) generates the API's stubs into the
installed package, which then imports from outside the source tree. The source tree is copied
first, so that pip's in-tree build leaves no files in it."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PipInstall(unittest.TestCase):
    def test_pip_installs_the_package_with_its_stubs(self):
        with tempfile.TemporaryDirectory(prefix="stagecoach-pip-") as tmp:
            shutil.copytree(os.path.join(SOURCE, "python"), os.path.join(tmp, "python"),
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            shutil.copytree(os.path.join(SOURCE, "proto"), os.path.join(tmp, "proto"))
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           check=True, timeout=120)
            python = os.path.join(venv, "bin", "python")
            install = subprocess.run(
                [python, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                 "--no-index", "--disable-pip-version-check", os.path.join(tmp, "python")],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            probe = subprocess.run(
                [python, "-c", "import stagecoach, stagecoach.v1.coordinator_pb2_grpc as g; "
                 "print(stagecoach.__file__); print(g.CoordinatorServiceStub.__name__); "
                 "print(stagecoach.Client.__name__)"],
                capture_output=True, text=True, timeout=60, cwd=tmp, env=env)
            self.assertEqual(probe.returncode, 0, probe.stderr)
            where, stub, client = probe.stdout.split()
            self.assertTrue(where.startswith(venv), where)
            self.assertEqual((stub, client), ("CoordinatorServiceStub", "Client"))
            typed = os.path.join(os.path.dirname(where), "py.typed")
            self.assertTrue(os.path.exists(typed), "py.typed was not installed")


if __name__ == "__main__":
    unittest.main()
