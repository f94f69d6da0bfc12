import os
import signal

import pytest

# NumPy's OpenBLAS threads otherwise spin on the 2-core CI machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# A suite started as a background job (`command &` in a script) inherits SIGINT
# ignored, and so would every process a test starts: the Ctrl-C tests' signal would be
# dropped and their process left running. Python's own handler again, here and (a
# handled signal is reset to the default at exec) in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def _sb3_log_folder(tmp_path_factory):
    """Stable-Baselines3 makes a /tmp/SB3-<time> folder for every model that learns
    (its logger's default) and never removes it: point it into pytest's own
    temporary tree instead."""
    folder = str(tmp_path_factory.mktemp("sb3-logs"))
    previous = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = folder
    yield folder
    if previous is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = previous
