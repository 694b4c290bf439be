"""``python -m bench.suite``: the same as ``bench/suite/run.py`` (``make bench``)."""

import sys

from bench.suite.run import main

sys.exit(main())
