"""``python -m bench``: the same as ``bench/run.py``."""

import sys

from bench.run import main

sys.exit(main())
