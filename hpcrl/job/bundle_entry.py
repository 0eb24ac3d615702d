"""The code bundle's entry script: ``python3 <bundle>/hpcrl_entry.py -u -m MODULE ARGS...``.

Copied to the top of every code bundle (``hpcrl.plan.bundle``). It runs MODULE (submitit's
task entrypoint) with the bundle first on the import path, in this process and, through
PYTHONPATH, in every process the job starts (the driver, Ray and its workers). The image's
own PYTHONPATH entries stay behind it.

Why not only ``export PYTHONPATH`` in the job script: pyxis gives a variable that the image
defines the image's value (pyxis' own tests: "--container-env overriding container
variable"), so in an image that sets PYTHONPATH the exported one would silently vanish.

It imports nothing but the standard library and checks the Python version first, so an image
with too old a Python fails with one line instead of a SyntaxError from deep inside hpcrl.
"""

import io
import os
import runpy
import sys

MIN_PYTHON = (3, 11)
USAGE = "usage: python3 hpcrl_entry.py [-u] -m MODULE [ARGS...]"


def main(argv):
    if sys.version_info[:2] < MIN_PYTHON:
        found, needed = sys.version.split()[0], ".".join(map(str, MIN_PYTHON))
        sys.stderr.write(
            f"hpcrl: this job's Python is {found} ({sys.executable}); hpcrl needs Python >= "
            f"{needed}. Fix: use a container image with a newer Python, or set python: in the "
            "cluster profile\n"
        )
        return 2
    if argv[:1] == ["-u"]:
        argv = argv[1:]
        os.environ["PYTHONUNBUFFERED"] = "1"
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):  # always, unless a caller replaced it
                stream.reconfigure(write_through=True)
    if len(argv) < 2 or argv[0] != "-m":
        sys.stderr.write(USAGE + "\n")
        return 2
    bundle = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [bundle] + [entry for entry in sys.path if entry != bundle]
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [bundle] + [p for p in inherited if p and p != bundle]
    )
    os.environ["HPCRL_CODE_BUNDLE"] = bundle
    sys.argv = [argv[1]] + list(argv[2:])
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
