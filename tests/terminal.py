"""What a child started by a test gets from a terminal that the test process may lack."""

import signal


def ctrl_c_as_at_a_terminal() -> None:
    """A ``preexec_fn`` for children a test stops with SIGINT (Ctrl-C). Python installs its
    KeyboardInterrupt handler only if SIGINT is not ignored at its start, and a suite
    started in the background (``cmd &``) passes SIGINT on ignored: such a child would
    never stop. Here it starts as it would at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
