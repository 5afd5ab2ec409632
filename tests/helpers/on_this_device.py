"""What a kernel part's verdict can say where it is graded.  In the simulator (a CPU) every
read, store, shuffle and barrier of the launch is recorded, so a verdict names the thread and
the line; on a GPU the grader sees the outputs and where the stores landed, and a verdict that
cannot see the rest says so ("... in the simulator only")."""

from paged_tutorial.backends.numba_cuda.runtime import access_log

#: whether this process records a launch's accesses (the simulator)
RECORDED = access_log.AVAILABLE
#: the words a GPU verdict uses for what only the simulator checks
SIMULATOR_ONLY = "in the simulator only"


def expected(recorded: str, on_gpu: str) -> str:
    """The text a verdict must hold here: ``recorded`` in the simulator, ``on_gpu`` on a GPU."""
    return recorded if RECORDED else on_gpu
