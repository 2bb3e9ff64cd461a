"""The raw logs of a device run, kept as one archive: ``experiments/results/logs-<run>.tar.xz``.

A run's folder of consoles, log greps, log tails and registration reports (``logs-<run>/``) is packed
into one xz tarball beside it, deterministically (members sorted, mtime 2026-01-01, owner 0, mode
0644/0755, xz preset 9e): packing the same files again gives the same bytes.  A ``.tgz`` the device
returned (the raw bench files of a call) is stored unpacked, as the folder of its name without
``.tgz`` (``call24-raw-call24.tgz`` -> ``call24-raw-call24/bench/...``): xz then compresses it with
the rest of the run.  Files a test reads line by line stay plain in ``logs-<run>/`` as well, and are
the archive's member of the same name byte for byte (tests/experiments/test_results_size.py).

    python3 experiments/pdtools logs experiments/results/logs-2026-11-27d-2xH200-handoff.tar.xz
    python3 experiments/pdtools logs experiments/results/logs-2026-11-27d-2xH200-handoff.tar.xz call21-console.txt
    python3 experiments/pdtools logs --pack experiments/results/logs-<run>     # -> logs-<run>.tar.xz

A results file too big to keep plain is kept as ``NAME.xz`` (``xz -9e``, no timestamp inside) and read
through ``resolve``/``read_text``/``load_json``/``glob``: a reader names ``X.json`` and gets ``X.json``,
else ``X.json.xz`` decompressed -- the one fallback tools/, experiments/ and tests/ share.
"""

import glob as _glob
import io
import json
import lzma
import os
import tarfile

#: every member's mtime (2026-01-01 00:00 UTC): the archive's bytes depend on the files only
MTIME = 1767225600


def members(archive):
    """The files of ``archive`` (paths below the run's folder, e.g. ``call21-console.txt``), sorted."""
    with tarfile.open(archive, "r:xz") as tar:
        top = _top(archive)
        return sorted(m.name[len(top) + 1:] for m in tar.getmembers() if m.isfile())


def read(archive, member):
    """The bytes of one member (a path as ``members`` gives it)."""
    with tarfile.open(archive, "r:xz") as tar:
        f = tar.extractfile(_top(archive) + "/" + member)
        if f is None:
            raise KeyError(member)
        return f.read()


def _top(archive):
    name = os.path.basename(archive)
    assert name.endswith(".tar.xz"), archive
    return name[:-len(".tar.xz")]


def _files(folder):
    """(path in the archive, bytes) of every file of ``folder``, a .tgz's files in its place."""
    out = []
    for dirpath, _, names in os.walk(folder):
        for n in names:
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if n.endswith(".tgz"):
                with tarfile.open(path, "r:gz") as inner:
                    for m in inner.getmembers():
                        if m.isfile():
                            inner_name = m.name[2:] if m.name.startswith("./") else m.name
                            out.append((rel[:-4] + "/" + inner_name, inner.extractfile(m).read()))
            else:
                with open(path, "rb") as f:
                    out.append((rel, f.read()))
    return out


def pack(folder, out=None):
    """Write ``folder``'s files as ``<folder>.tar.xz`` (or ``out``), deterministically; the path."""
    folder = os.path.normpath(folder)
    top = os.path.basename(folder)
    out = out or folder + ".tar.xz"
    files = sorted(_files(folder))
    names = [n for n, _ in files]
    assert len(set(names)) == len(names), "two files of one name in %s" % folder
    dirs = sorted({"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)})
    entries = sorted([(d, None) for d in [""] + dirs] + files, key=lambda e: e[0])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(top + ("/" + name if name else ""))
            info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode, info.size = 0o644, len(data)
                tar.addfile(info, io.BytesIO(data))
    with open(out, "wb") as f:
        f.write(lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                              preset=9 | lzma.PRESET_EXTREME))
    return out


def resolve(path):
    """The file that holds ``path``: ``path`` itself, else ``path + ".xz"`` where only that exists
    (``path`` again where neither does, so the reader's own error names the file it asked for)."""
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        return path + ".xz"
    return path


def exists(path):
    """Whether ``path`` is there, plain or as ``path + ".xz"``."""
    return os.path.exists(resolve(path))


def read_text(path):
    """The text of ``path``, or of ``path + ".xz"`` decompressed where only that exists."""
    real = resolve(path)
    if real != path:
        with lzma.open(real, "rt", encoding="utf-8") as f:
            return f.read()
    with open(real, encoding="utf-8") as f:
        return f.read()


def load_json(path):
    """``json.load`` of ``path``, or of ``path + ".xz"`` where only that exists."""
    return json.loads(read_text(path))


def glob(pattern):
    """The paths ``pattern`` matches, a ``X.xz`` counted as ``X`` when ``X.xz`` matches ``pattern + ".xz"``:
    the names a reader gives ``load_json``, sorted, each once."""
    return sorted(set(_glob.glob(pattern)) | {p[:-3] for p in _glob.glob(pattern + ".xz")})
