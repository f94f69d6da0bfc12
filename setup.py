"""Builds one extension module per native env, the way a plugin builds its own.

Every built-in env lives in src/peregrine/envs/<name>/ with its header <name>.h;
each such folder is built, through the same helper a user's package calls
(peregrine.envs.sdk.extension: the header plus the generic binding, with the
SDK's flags), so adding an env touches its own folder and the registry's table only.

PEREGRINE_ENVS=a,b builds only those envs (handy while editing one header); the
flags (PEREGRINE_WERROR, PEREGRINE_NATIVE, PEREGRINE_SANITIZE) are sdk.py's. The
modules compile in parallel, one per core up to 8, unless `build_ext -j N` says
otherwise.
"""
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    """build_ext whose default is one compiler per core (at most 8), not one in all."""

    def finalize_options(self):
        if self.parallel is None:
            self.parallel = min(os.cpu_count() or 1, 8)
        super().finalize_options()


ENVS_DIR = Path("src/peregrine/envs")
# The SDK module runs on its own (standard library only): the package is not built yet.
sdk = runpy.run_path(str(ENVS_DIR / "sdk.py"))

BUILT_IN = sorted(folder.name for folder in ENVS_DIR.iterdir()
                  if (folder / f"{folder.name}.h").is_file())
selected = [n for n in os.environ.get("PEREGRINE_ENVS", "").split(",") if n] or BUILT_IN
unknown = sorted(set(selected) - set(BUILT_IN))
if unknown:
    sys.exit(f"PEREGRINE_ENVS names {unknown}, which are not built-in envs; they are: "
             f"{','.join(BUILT_IN)}")
setup(cmdclass={"build_ext": ParallelBuildExt},
      ext_modules=[sdk["extension"](name, ENVS_DIR / name / f"{name}.h",
                                    module=f"peregrine.envs.{name}._{name}")
                   for name in selected])
