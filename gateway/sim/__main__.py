import sys

from gateway.sim.cli import main

sys.exit(main(sys.argv[1:]))
