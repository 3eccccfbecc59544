"""``python -m tinyamp`` runs the command line (see tinyamp.cli)."""

import signal

from tinyamp.cli import main

status = main()
for _signum in (signal.SIGINT, signal.SIGTERM):  # the run has ended and said so: a late Ctrl-C changes nothing
    signal.signal(_signum, signal.SIG_IGN)
raise SystemExit(status)
