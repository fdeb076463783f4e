import sys

from wheel_index.cli import main

sys.exit(main())
