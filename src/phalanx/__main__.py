"""`python -m phalanx` is the `phalanx` command."""

from phalanx.cli import main

raise SystemExit(main())
