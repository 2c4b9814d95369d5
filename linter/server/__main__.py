"""`python -m linter.server`: the same server as `accel-lint server`."""

import sys

from linter.server import main

sys.exit(main())
