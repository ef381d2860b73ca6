"""`python -m gateway.cli`: the same as the `pvegate` console script."""

import sys

from gateway.cli import main

sys.exit(main())
