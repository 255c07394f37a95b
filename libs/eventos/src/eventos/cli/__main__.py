"""`python -m eventos.cli`: the same as `eventosctl`."""

from eventos.cli import main

raise SystemExit(main())
