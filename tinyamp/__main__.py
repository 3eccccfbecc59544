"""``python -m tinyamp`` runs the command line (see tinyamp.cli)."""

from tinyamp.cli import main

raise SystemExit(main())
