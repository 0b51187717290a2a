"""Builds gcomp's Python module with the project's CMake build, for pip (pyproject.toml).

The module is built with the libraries linked in (BUILD_SHARED_LIBS=OFF), so the installed
package is the module file and the pure-Python files, nothing else; MPICH, Gloo and OpenMP stay
Debian's shared libraries. Settings: GCOMP_CMAKE_ARGS (more -D options for CMake, e.g.
-DGCOMP_WITH_CUDA=ON: CUDA is off by default, its kernels take long to compile),
GCOMP_BUILD_JOBS (parallel jobs, default the CPUs)."""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = pathlib.Path(__file__).parent.resolve()


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        args = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                "-DGCOMP_BUILD_TESTS=OFF", "-DGCOMP_BUILD_BENCH=OFF", "-DGCOMP_WITH_CUDA=OFF",
                "-DGCOMP_WITH_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}"]
        args += shlex.split(os.environ.get("GCOMP_CMAKE_ARGS", ""))
        jobs = os.environ.get("GCOMP_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "-S", str(SOURCE), "-B", str(build), *args], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "gcomp_python", "-j", jobs],
                       check=True)
        built = list((build / "python" / "gcomp").glob("_gcomp*.so"))
        if len(built) != 1:
            raise RuntimeError(f"the CMake build made {len(built)} modules in "
                               f"{build / 'python' / 'gcomp'}, not one")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(ext_modules=[CMakeExtension("gcomp._gcomp")], cmdclass={"build_ext": CMakeBuild})
