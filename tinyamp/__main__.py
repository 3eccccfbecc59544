"""``python -m tinyamp`` runs the command line (see tinyamp.cli)."""

import signal

from tinyamp.cli import main
from tinyamp.experiments.interrupts import SIGNALS

status = main()
for _signum in SIGNALS:  # the run has ended and said so: a late Ctrl-C or hang-up changes nothing
    signal.signal(_signum, signal.SIG_IGN)
raise SystemExit(status)
