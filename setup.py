"""Build hooks: ``xlkv_autopatch.pth`` generated from its readable source, in regular and
editable (PEP 660) wheels alike.

All metadata lives in setup.cfg.  The .pth line is rendered at build time by
``xlkv_autopatch/_pth.py`` (standard library only; ENABLE_XLKV's off values come from
``flag.FALSY``).  Regular wheels get it at their root (``package_data =
../xlkv_autopatch.pth`` puts the committed copy there, which :class:`BuildPyWithPth`
replaces with the rendering); setuptools' editable wheels contain only their own path
finder, so ``pip install -e .`` would silently install no start-up hook:
:class:`EditableWheelWithPth` adds the file (and its RECORD line).  The committed
``xlkv_autopatch.pth`` is kept equal to the rendering by tests/unit/test_pth.py.
"""
import base64
import glob
import hashlib
import os
import sys
import zipfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "xlkv_autopatch.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


def rendered_pth():
    """The .pth line from xlkv_autopatch/_pth.py of this source tree (bytes)."""
    sys.path.insert(0, HERE)
    try:
        from xlkv_autopatch._pth import render
    finally:
        sys.path.remove(HERE)
    return render().encode()


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def add_pth_to_wheel(wheel_path, pth=None):
    """Rewrite ``wheel_path`` with the .pth (bytes; default: the rendering) at its root and in RECORD."""
    pth = rendered_pth() if pth is None else pth
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        if PTH in names:
            return
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                text = data.decode()
                if not text.endswith("\n"):
                    text += "\n"
                data = (text + _record_line(PTH, pth) + "\n").encode()
            dst.writestr(info, data)
        dst.writestr(PTH, pth)
    os.replace(tmp, wheel_path)


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, PTH), "wb") as f:
            f.write(rendered_pth())


class EditableWheelWithPth(editable_wheel):
    def run(self):
        super().run()
        wheels = glob.glob(os.path.join(self.dist_dir, "*.whl"))
        if not wheels:
            raise RuntimeError("xlkv_autopatch: editable wheel not found in %s" % self.dist_dir)
        add_pth_to_wheel(max(wheels, key=os.path.getmtime))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
