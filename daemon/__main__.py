import sys

from infermux.cli import main

sys.exit(main())
