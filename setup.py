"""Build hook: put ``xlkv_autopatch.pth`` into editable (PEP 660) wheels too.

All metadata lives in setup.cfg.  Regular wheels get the ``.pth`` through
``package_data = ../xlkv_autopatch.pth``; setuptools' editable wheels contain only
their own path finder, so ``pip install -e .`` would silently install no start-up
hook.  This override adds the file (and its RECORD line) to the editable wheel.
"""
import base64
import glob
import hashlib
import os
import zipfile

from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

PTH = "xlkv_autopatch.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def add_pth_to_wheel(wheel_path, pth_path=os.path.join(HERE, PTH)):
    """Rewrite ``wheel_path`` with the .pth at its root and listed in RECORD."""
    with open(pth_path, "rb") as f:
        pth = f.read()
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


class EditableWheelWithPth(editable_wheel):
    def run(self):
        super().run()
        wheels = glob.glob(os.path.join(self.dist_dir, "*.whl"))
        if not wheels:
            raise RuntimeError("xlkv_autopatch: editable wheel not found in %s" % self.dist_dir)
        add_pth_to_wheel(max(wheels, key=os.path.getmtime))


setup(cmdclass={"editable_wheel": EditableWheelWithPth})
