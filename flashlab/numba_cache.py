"""Where Numba keeps flashlab's compiled kernels, decided once at import.

Every ``@njit`` in flashlab is written ``@njit(cache=CACHE)``. Numba's cache saves each
compiled signature to disk so that a new process loads it instead of compiling it again
(loading is an order of magnitude faster). By default Numba writes into ``__pycache__`` beside the source and, if that
is read-only, into ``~/.cache/numba``; when neither is writable it refuses to decorate the
function at all (``RuntimeError: cannot cache function ...: no locator available``), so a
read-only install (a system site-packages, a container image, a shared lab machine) could not
even ``import flashlab``. This module picks, in order:

1. ``NUMBA_CACHE_DIR`` if the user set it (Numba's own variable; it must be writable);
2. the package's own ``__pycache__`` folders (the default, when the install is writable);
3. a user cache folder: ``$XDG_CACHE_HOME/flashlab-numba``, ``~/.cache/flashlab-numba``, then
   ``<tempdir>/flashlab-numba-<user>``, with a warning naming it;
4. no on-disk cache (``CACHE = False``), with a warning: everything works, each new process
   compiles again.

**Processes and threads.** The kernels run in parallel with Numba's ``prange`` on its
threading layer (``NUMBA_THREADING_LAYER``: ``omp``, ``tbb`` or ``workqueue``; set
``NUMBA_NUM_THREADS`` to change the thread count, which never changes the results). The
``workqueue`` and OpenMP layers are not fork-safe: after a flashlab call has started the
thread pool, a ``multiprocessing`` child created with ``fork`` can hang or abort. Use
``multiprocessing.set_start_method("spawn")`` (or a ``spawn`` context) when worker processes
call flashlab. Python threads may call flashlab at the same time under every layer
(:class:`thread_safe`): the ``workqueue`` layer (Numba's fallback when neither OpenMP nor TBB
can be loaded) is not thread-safe, two kernel launches from two threads abort the process,
so there flashlab runs its parallel kernels one at a time.

**Serial twins** (:func:`serial_twin`). A ``@njit(parallel=True)`` kernel starts Numba's
thread pool on every call, even with ``numba.set_num_threads(1)``: the ``prange`` loop is
lowered to a gufunc that the threading layer launches. For a problem whose arithmetic is a few
thousand multiply-adds that launch *is* the call (issue 22). :func:`serial_twin`
compiles the very same function a second time without ``parallel``, where Numba runs
``prange`` as ``range`` on the calling thread: one source of truth, two builds
(``flashlab.api.kernels_for`` picks one from the problem's size). Every parallel kernel of
flashlab gives the same bits for any thread count, and one thread running the work items in
order is one of them (tests/test_small_shapes.py compares the builds bit for bit). The cache
is why the twin needs a name of its own: Numba names a function's cache files after its
qualified name and keys an entry by signature and bytecode, not by the compile flags, so a
plain ``njit`` of the same ``py_func`` would read (or overwrite) the parallel build's entry.

**Numba's one-time setup** (:func:`numba_setup`). Before the first kernel a process loads from
the cache (or compiles), Numba imports and registers its typing and lowering tables, the same
for every Numba program, however small the kernel. A first
call pays it unless something ran it before; the torch front door runs it at its import.
"""
from __future__ import annotations

import getpass
import os
import tempfile
import threading
import types
import warnings
from pathlib import Path
from typing import Any

from numba import njit
from numba.core import config

__all__ = ["CACHE", "CACHE_DIR", "choose_cache", "serial_twin", "numba_setup", "thread_safe"]

_PACKAGE = Path(__file__).resolve().parent


def _writable(folder: Path) -> bool:
    """True when a file can be created in ``folder`` (created if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _in_tree_writable() -> bool:
    # Numba caches next to each source file: every sub-package's __pycache__ must be writable
    return all(_writable(d / "__pycache__") for d in (_PACKAGE, _PACKAGE / "kernels"))


def _user_folders() -> list[Path]:
    """The user cache folders to try, in order. A folder that cannot even be named is left out:
    no home directory (``Path.home()`` raises ``RuntimeError``), or no usable temporary folder
    (``tempfile.gettempdir()`` raises ``FileNotFoundError`` when none of ``TMPDIR``, ``TEMP``,
    ``TMP``, ``/tmp``, ``/var/tmp``, ``/usr/tmp`` and the working folder can be written)."""
    folders = []
    if os.environ.get("XDG_CACHE_HOME"):
        folders.append(Path(os.environ["XDG_CACHE_HOME"]) / "flashlab-numba")
    try:
        folders.append(Path.home() / ".cache" / "flashlab-numba")
    except RuntimeError:
        pass
    try:
        user = getpass.getuser()
    except Exception:  # no user name (some containers): the uid still separates users
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    try:
        folders.append(Path(tempfile.gettempdir()) / f"flashlab-numba-{user}")
    except OSError:
        pass
    return folders


def choose_cache() -> tuple[bool, str | None]:
    """(cache on disk?, the folder when it is not Numba's default).

    Warns at most once (one ``RuntimeWarning`` per call, none when the install is writable):
    a warning names the folder chosen, or says that every process compiles the kernels.
    """
    unusable = ""
    if config.CACHE_DIR:
        if _writable(Path(config.CACHE_DIR)):
            return True, config.CACHE_DIR
        unusable = f"NUMBA_CACHE_DIR={config.CACHE_DIR} is not writable"
    elif _in_tree_writable():
        return True, None
    else:
        unusable = f"its install folder {_PACKAGE} is read-only"
    for folder in _user_folders():
        if _writable(folder):
            config.CACHE_DIR = str(folder)
            warnings.warn(f"flashlab: {unusable}; the compiled kernels are cached in {folder} "
                          f"(set NUMBA_CACHE_DIR to choose)", RuntimeWarning, stacklevel=3)
            return True, str(folder)
    # Numba must not look for a cache folder either: cache=False decorators never do
    config.CACHE_DIR = ""
    warnings.warn(f"flashlab: {unusable} and there is no other writable folder for Numba's "
                  "cache (NUMBA_CACHE_DIR, ~/.cache, the temporary folder); the kernels are "
                  "compiled in this process and in every new one", RuntimeWarning, stacklevel=3)
    return False, None


#: whether ``@njit`` functions cache their machine code on disk
CACHE: bool
#: the folder the cache is in when it is not beside the source, or None for Numba's default
CACHE_DIR: str | None
CACHE, CACHE_DIR = choose_cache()


def serial_twin(kernel: Any) -> Any:
    """The ``@njit`` dispatcher ``kernel`` (``parallel=True``) compiled without ``parallel``.

    Same code object, globals, defaults and other options (``fastmath``), cached as every
    flashlab kernel (:data:`flashlab.numba_cache.CACHE`); named
    ``<name>_serial`` (its own cache entries). Calling it runs every ``prange`` iteration on
    the calling thread, in order.
    """
    f = kernel.py_func
    twin = types.FunctionType(f.__code__, f.__globals__, f"{f.__name__}_serial",
                              f.__defaults__, f.__closure__)
    twin.__qualname__ = f"{f.__qualname__}_serial"
    twin.__module__ = f.__module__
    twin.__doc__ = (f"Serial build of :func:`{f.__module__}.{f.__name__}` (no thread pool; "
                    f":func:`flashlab.numba_cache.serial_twin`).")
    # the dispatcher's compile options, less parallel (and nopython, which njit implies); the
    # cache flag is not among them: flashlab's one (:mod:`flashlab.numba_cache`)
    options = {key: value for key, value in kernel.targetoptions.items()
               if key not in ("parallel", "nopython")}
    return njit(cache=CACHE, **options)(twin)


def numba_setup() -> None:
    """Run Numba's one-time setup now: ``cpu_target.target_context.refresh()``, which imports
    and registers Numba's typing and lowering tables (most of a warm-cache first call); later
    calls return at once.

    Numba runs it before the first kernel a process loads from its cache or compiles. The
    torch front door (``flashlab.torch_attention``) calls this at import, as it imports
    ``torch._dynamo`` there: a one-time cost paid at the import, where a user expects one, and
    not in the first training step (issue 22). ``import flashlab`` does not: a numpy user's
    first kernel call pays it, once.
    """
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()


#: the threading layers on which two Python threads may launch parallel kernels at once
#: (Numba's documentation: ``tbb`` and ``omp`` are thread-safe, ``workqueue`` is not)
THREAD_SAFE_LAYERS = frozenset({"tbb", "omp"})
#: held around every parallel kernel call until the layer is known to be thread-safe
_LAUNCH = threading.Lock()
#: whether parallel calls must hold :data:`_LAUNCH`: None until the first parallel call has
#: loaded the threading layer (``numba.threading_layer()`` is unknown before), then a bool
_SERIALISE: bool | None = None


class thread_safe:
    """A ``parallel=True`` dispatcher that Python threads may call at the same time, under any
    threading layer: the same call, the same attributes (``overloads``, ``py_func``, ...).

    Until a first parallel call has loaded Numba's threading layer, calls hold a lock (the
    first call may load ``workqueue``); from then on, only under a layer that is not
    thread-safe (``workqueue``: concurrent launches abort the process) do they hold it, so
    the kernels run one at a time there. Under ``omp`` and ``tbb`` the lock is never taken
    again (a read of a module global per call).
    """

    def __init__(self, kernel: Any):
        self.kernel = kernel

    def __call__(self, *args):
        global _SERIALISE
        if _SERIALISE is False:
            return self.kernel(*args)
        with _LAUNCH:
            result = self.kernel(*args)
            if _SERIALISE is None:
                import numba

                # known once a parallel kernel has run: the layer Numba loaded
                _SERIALISE = numba.threading_layer() not in THREAD_SAFE_LAYERS
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"thread_safe({self.kernel!r})"
