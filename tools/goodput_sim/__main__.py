"""`python tools/goodput_sim ...`: the simulator's command line (tools/ is not a package)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from goodput_sim.cli import main

sys.exit(main())
