"""``python -m rocm_mla.tools.tune``: the same as ``rocm-mla tune``."""

import sys

from rocm_mla.tools.tune.cli import main

sys.exit(main())
