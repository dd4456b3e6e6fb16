"""muster's start-up hook for the Python processes of a rank.

muster-worker puts this directory (and the muster_rank package's) first on
a Python rank's PYTHONPATH, so that the interpreter runs this file at
start-up (the `site` module imports `sitecustomize`). It changes nothing
the program can see: it arms a stack dump on a signal only the agent
sends, and once the program imports torch it reports optimizer steps to
the agent (muster_rank.hook.startup). Nothing here prints or raises. Then it
runs the `sitecustomize` this one shadows, if there is one, as Python
would have. The job key python_hook (default true) turns it off.
"""


def _muster_start():
    try:
        from muster_rank import hook  # the link to the agent and the hook, not the healing classes
        hook.startup()
    except Exception:
        pass


def _chain():
    """Import the sitecustomize that would have run without muster's."""
    import importlib.machinery
    import importlib.util
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_muster_start()
_chain()
del _muster_start, _chain
