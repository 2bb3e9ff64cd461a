"""The source of ``xlkv_autopatch.pth``, the start-up hook that site.py runs in every interpreter.

site.py executes a line of a ``.pth`` file only when it starts with ``import``, and only that
one line, so the hook is written here readably and :func:`render` turns it into that line, with
ENABLE_XLKV's off values taken from :data:`xlkv_autopatch.flag.FALSY` (they live in one place).
The rendered line imports nothing of xlkv_autopatch while the flag is off: its gate is a literal
test of the variable.  Nothing imports this module at run time; the committed
``xlkv_autopatch.pth`` (what setup.py packs into wheels and editable installs) is its rendering,
which tests/unit/test_pth.py checks.  After editing: ``python -m xlkv_autopatch._pth --write``.

What the hook does, flag not off:
* once per process (site.py of a Python 3.11 venv runs the .pth files of its site-packages
  twice, and an overlay environment may have a second copy): ``_startup.start('pth')``, which
  activates the shim or, when activation fails (an unrecognised knob value, a missing wrapt),
  prints the error once and arms it: every later import of vLLM in the process raises it (a
  .pth cannot stop the interpreter, and must not stop processes that never use vLLM);
* if the package itself cannot be imported, one line on stderr and nothing else: nothing of it
  can stop vLLM, so the line says that vLLM runs stock.
"""

import os
import sys

from .flag import FALSY, FLAG

PTH_NAME = "xlkv_autopatch.pth"
MARK = "_xlkv_autopatch_pth_ran"  # set on sys by the first run in a process (sitecustomize.py reads it)

GONE = ("the package itself cannot be imported (an install whose files are gone?), so nothing of it can stop vLLM: "
        "with ENABLE_XLKV set this process runs STOCK vLLM. Fix: reinstall xlkv_autopatch, or unset ENABLE_XLKV")
BROKEN = ("its start-up code cannot run (a broken or mixed install?): the vLLM plugin may still refuse to start, "
          "otherwise this process runs STOCK vLLM with ENABLE_XLKV set. Fix: reinstall xlkv_autopatch, or unset "
          "ENABLE_XLKV")

HOOK = """\
if os.environ.get({flag!r}, '').strip().lower() not in {falsy!r} and not getattr(sys, {mark!r}, False):
 sys.{mark} = True
 try:
  from xlkv_autopatch._startup import start
  start('pth')
 except Exception as e:
  gone = getattr(e, 'name', None) == 'xlkv_autopatch'
  sys.stderr.write('xlkv_autopatch: start-up hook failed (%s: %s); %s\\n' % (type(e).__name__, e, {gone!r} if gone else {broken!r}))"""


def render():
    """The one line of ``xlkv_autopatch.pth``."""
    code = HOOK.format(flag=FLAG, falsy=FALSY, mark=MARK, gone=GONE, broken=BROKEN)
    line = "import os, sys; exec(%r)\n" % code
    assert line.count("\n") == 1  # one line: site.py reads no other
    return line


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv == ["--write"]:
        with open(os.path.join(root, PTH_NAME), "w") as f:
            f.write(render())
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
