"""`python -m eventos.local`: the local instance of `make run`."""

import sys

from eventos.local.instance import main

sys.exit(main())
