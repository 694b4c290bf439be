"""``python -m bench``: the same as ``python -m bench.suite`` (``make bench``)."""

import sys

from bench.suite.run import main

sys.exit(main())
