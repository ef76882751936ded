import sys

from pcache.cli.main import main

sys.exit(main())
