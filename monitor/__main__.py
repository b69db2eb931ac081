"""`python -m monitor` runs the flopwatch command."""

import sys

from monitor.cli import main

sys.exit(main())
